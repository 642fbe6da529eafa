// Package embedded runs walcast's backends inside your process: an etcd
// member (the catalog) and a NATS JetStream server (the WAL, syncing every
// write), with their data in one directory, so that a program or a test can
// use the broadcast engine without any external service:
//
//	b, err := embedded.Start(ctx, embedded.Config{Dir: dir})
//	if err != nil { ... }
//	defer b.Close()
//	cfg := b.BroadcastConfig(types, callbacks)
//	bc, err := broadcast.New(ctx, cfg)
//
// Starting again on the same Dir finds every task and WAL entry of before:
// the engine recovers them (R4.8). The servers listen on 127.0.0.1 only, on
// free ports unless Config says which; the catalog talks to the etcd member
// in process (etcd's v3client: no gRPC encoding, no socket), the WAL to NATS
// over its port. Production deployments run walcast
// against etcd and NATS (or Kafka) clusters instead; see server and
// docs/cluster.md. Requirement ids (R4.8) refer to docs/spec.md.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	etcdcat "github.com/walcast/walcast/catalog/etcd"
	"github.com/walcast/walcast/internal/embedetcd"
	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	walnats "github.com/walcast/walcast/wal/nats"
)

// DefaultPChannels is how many pchannels Start makes when Config names
// none: wal-0 ... wal-3, the control channel on wal-0.
const DefaultPChannels = 4

// Config configures Start.
type Config struct {
	// Dir holds both servers' data (Dir/etcd and Dir/nats); it is created
	// if missing. Required. Two processes must not use one Dir at once.
	Dir string
	// PChannels are the WAL's pchannels; default wal-0 ... wal-3.
	PChannels []message.PChannel
	// Lanes folds the pchannels into this many JetStream streams, so that
	// one durable write serves the copies of several pchannels (walcast's
	// default); len(PChannels) gives each its own. 0 means 1.
	Lanes int
	// EtcdPort and NATSPort are the client ports on 127.0.0.1; 0 picks a
	// free port.
	EtcdPort, NATSPort int
	// Logger receives the servers' warnings and errors; nil discards them.
	Logger *slog.Logger
}

// ErrInvalidConfig reports a Config Start cannot use.
var ErrInvalidConfig = errors.New("embedded: invalid config")

// Backends are a running embedded etcd and NATS and walcast's clients of
// them. Close stops them.
type Backends struct {
	etcd   *embedetcd.Server
	nats   *embednats.Server
	client *clientv3.Client
	// closeClient closes client, the embedded member's in-process one.
	closeClient func() error
	cat         *etcdcat.Catalog
	log         wal.Log
	wal         *wal.WAL
	pchans      []message.PChannel
}

// Start starts an etcd member and a NATS JetStream server with their data
// under cfg.Dir and opens the catalog and the WAL on them.
func Start(ctx context.Context, cfg Config) (_ *Backends, err error) {
	if cfg.Dir == "" {
		return nil, fmt.Errorf("%w: Dir is required", ErrInvalidConfig)
	}
	if len(cfg.PChannels) == 0 {
		for i := range DefaultPChannels {
			cfg.PChannels = append(cfg.PChannels, message.PChannel(fmt.Sprintf("wal-%d", i)))
		}
	}
	for _, p := range cfg.PChannels {
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("%w: pchannel %q: %w", ErrInvalidConfig, p, err)
		}
	}
	lanes := max(cfg.Lanes, 1)
	if cfg.Lanes < 0 {
		return nil, fmt.Errorf("%w: Lanes %d is negative", ErrInvalidConfig, cfg.Lanes)
	}
	if err := os.MkdirAll(cfg.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	b := &Backends{pchans: append([]message.PChannel(nil), cfg.PChannels...)}
	defer func() {
		if err != nil {
			_ = b.Close()
		}
	}()
	if b.etcd, err = embedetcd.Start(ctx, embedetcd.Config{Dir: filepath.Join(cfg.Dir, "etcd"), ClientPort: cfg.EtcdPort, Logger: cfg.Logger}); err != nil {
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	if b.nats, err = embednats.Start(ctx, embednats.Config{Dir: filepath.Join(cfg.Dir, "nats"), Port: cfg.NATSPort, SyncAlways: true, Logger: cfg.Logger}); err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	b.client, b.closeClient = b.etcd.LocalClient()
	if b.cat, err = etcdcat.New(b.client, etcdcat.Config{Prefix: "walcast/", Limits: catalog.Limits{MaxOps: b.etcd.MaxTxnOps(), MaxBytes: b.etcd.MaxRequestBytes()}}); err != nil {
		return nil, err
	}
	if b.log, err = walnats.New(ctx, walnats.Config{URL: b.nats.ClientURL(), PChannels: wal.Lanes(lanes, b.pchans)}); err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	b.wal = wal.New(b.log, wal.WithLanes(lanes, b.pchans))
	return b, nil
}

// Catalog is the catalog on the embedded etcd (keys under "walcast/").
func (b *Backends) Catalog() catalog.Catalog { return b.cat }

// WAL is the WAL on the embedded NATS.
func (b *Backends) WAL() *wal.WAL { return b.wal }

// PChannels are the WAL's pchannels.
func (b *Backends) PChannels() []message.PChannel {
	return append([]message.PChannel(nil), b.pchans...)
}

// ControlChannel is the control channel: on the first pchannel.
func (b *Backends) ControlChannel() message.VChannel { return b.pchans[0].Control() }

// EtcdEndpoints are the embedded etcd's client URLs.
func (b *Backends) EtcdEndpoints() []string { return b.etcd.Endpoints() }

// NATSURL is the embedded NATS server's client URL.
func (b *Backends) NATSURL() string { return b.nats.ClientURL() }

// BroadcastConfig is a broadcaster's configuration on these backends with
// types and callbacks: set any other field (Logger, Tombstone, ...) before
// broadcast.New.
func (b *Backends) BroadcastConfig(types *message.Registry, callbacks *broadcast.Callbacks) broadcast.Config {
	return broadcast.Config{Catalog: b.cat, WAL: b.wal, Types: types, Callbacks: callbacks,
		ControlChannel: b.ControlChannel(), PChannels: b.PChannels()}
}

// Close closes the catalog and the WAL and stops both servers; close the
// broadcaster first.
func (b *Backends) Close() error {
	var errs []error
	if b.log != nil {
		errs = append(errs, b.log.Close())
	}
	if b.cat != nil {
		errs = append(errs, b.cat.Close())
	}
	if b.client != nil {
		errs = append(errs, b.closeClient())
	}
	if b.nats != nil {
		b.nats.Close()
	}
	if b.etcd != nil {
		errs = append(errs, b.etcd.Close())
	}
	return errors.Join(errs...)
}
