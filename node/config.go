package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// Applier is the application's per-vchannel state, fed with broadcast
// copies. It must be safe for concurrent use by different pchannels; the
// node never calls it concurrently for one pchannel.
type Applier interface {
	// Apply applies copy c to the state of c.VChannel. It is called in WAL
	// order per pchannel and at most once per (vchannel, broadcast id) per
	// state lineage (see the package doc). It must be atomic: an error
	// leaves no effect, and the node calls Apply again with backoff. c's
	// Message is shared and must not be modified.
	Apply(ctx context.Context, c wal.Copy) error
	// Snapshot encodes the state of every vchannel hosted on pchannel p: all
	// the copies of p applied so far, nothing else.
	Snapshot(p message.PChannel) ([]byte, error)
	// Restore replaces the state of p's vchannels with a snapshot that
	// Snapshot(p) returned. It is called by New, before any Apply, for each
	// pchannel that has a saved state.
	Restore(p message.PChannel, data []byte) error
}

// VChannelApplier is an Applier whose state is per vchannel, snapshotted
// and restored one vchannel at a time. A node saves only the vchannels
// applied to since its last save (a plain Applier's whole pchannel is
// written at every save, a cost that grows with every vchannel the
// pchannel ever had), and restores each vchannel's snapshot on its own.
// Apply must change the state of c.VChannel only.
type VChannelApplier interface {
	Applier
	// SnapshotVChannel encodes the state of vchannel v: every copy applied
	// to it so far. nil means v has no state. The node calls it, for the
	// vchannels of one pchannel, from that pchannel's worker, between two
	// Apply calls.
	SnapshotVChannel(v message.VChannel) ([]byte, error)
	// RestoreVChannel sets v's state to a snapshot SnapshotVChannel
	// returned. New calls it, before any Apply, for every vchannel with a
	// saved snapshot; data is not valid after it returns.
	RestoreVChannel(v message.VChannel, data []byte) error
}

// Acker acknowledges consumed copies to the coordinator. In process it is the
// *broadcast.Broadcaster; remotely an API client. Errors wrapping
// broadcast.ErrVChannelNotInTask or broadcast.ErrInvalidArgument are
// permanent; every other error is retried.
type Acker interface {
	Ack(ctx context.Context, a broadcast.Ack) error
}

// AllAcker is an Acker that also takes the acks of one entry together:
// errs[i] answers acks[i] as Ack would, and nil errs means every ack was
// taken. A node acks an entry's copies with one AckAll call when its Acker
// has it (the *broadcast.Broadcaster does), and retries only the acks that
// failed.
type AllAcker interface {
	Acker
	AckAll(ctx context.Context, acks []broadcast.Ack) (errs []error)
}

// Config configures a Node. Name, WAL, PChannels, Applier, Acker and StateDir
// are required; the other fields have defaults.
type Config struct {
	// Name identifies the node in logs and Status.
	Name string
	// WAL is read for the copies.
	WAL *wal.WAL
	// PChannels are the pchannels the node consumes, each once.
	PChannels []message.PChannel
	// Applier receives the copies.
	Applier Applier
	// Acker receives the acks.
	Acker Acker
	// StateDir holds the node's durable state, two files per pchannel (a
	// base and a journal of the saves since). It is created if missing.
	// One node at a time may use it.
	StateDir string

	// Backoff paces the retries of Apply, acks, state saves and WAL reads:
	// Initial 10 ms, Multiplier 2, Max 10 s by default.
	Backoff broadcast.Backoff
	// AckTimeout bounds one ack attempt; a timed-out ack is retried.
	// Default 30 s.
	AckTimeout time.Duration
	// SnapshotEvery saves a pchannel's state after this many entries.
	// Default 256.
	SnapshotEvery int
	// SnapshotInterval saves a pchannel's state at most this long after its
	// first unsaved change. Default 1 s.
	SnapshotInterval time.Duration
	// LogCheckInterval is how long a pchannel's reader waits for an entry
	// before it checks that the log is still the one its position belongs
	// to and still reaches it (a log recreated under a running node halts
	// the pchannel, R9.14). Default 10 s.
	LogCheckInterval time.Duration
	// Logger receives structured logs. Default slog.Default().
	Logger *slog.Logger
}

// Errors. Check them with errors.Is.
var (
	// ErrInvalidConfig reports a Config that New refuses, naming the field.
	ErrInvalidConfig = errors.New("node: invalid config")
	// ErrUnknownPChannel reports a pchannel the node does not consume, or one
	// the WAL does not have (then it also wraps wal.ErrUnknownPChannel).
	ErrUnknownPChannel = errors.New("node: unknown pchannel")
	// ErrCorruptState reports a state file in StateDir that does not decode
	// or breaks an invariant. Removing it makes the node rebuild the
	// pchannel from the start of the WAL.
	ErrCorruptState = errors.New("node: corrupt state file")
	// ErrStarted reports a second Start.
	ErrStarted = errors.New("node: already started")
	// ErrClosed reports use of a closed node.
	ErrClosed = errors.New("node: closed")
)

func (cfg Config) withDefaults() Config {
	cfg.Backoff = cfg.Backoff.WithDefaults()
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = 30 * time.Second
	}
	if cfg.SnapshotEvery == 0 {
		cfg.SnapshotEvery = 256
	}
	if cfg.SnapshotInterval == 0 {
		cfg.SnapshotInterval = time.Second
	}
	if cfg.LogCheckInterval == 0 {
		cfg.LogCheckInterval = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

func (cfg Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case cfg.Name == "":
		return bad("Name", "required")
	case cfg.WAL == nil:
		return bad("WAL", "required")
	case cfg.Applier == nil:
		return bad("Applier", "required")
	case cfg.Acker == nil:
		return bad("Acker", "required")
	case cfg.StateDir == "":
		return bad("StateDir", "required")
	case len(cfg.PChannels) == 0:
		return bad("PChannels", "at least one pchannel is required")
	}
	seen := make(map[message.PChannel]bool, len(cfg.PChannels))
	for _, p := range cfg.PChannels {
		if err := p.Validate(); err != nil {
			return bad("PChannels", "%v", err)
		}
		if seen[p] {
			return bad("PChannels", "%q named twice", p)
		}
		seen[p] = true
	}
	if cfg.Backoff.Initial <= 0 || cfg.Backoff.Multiplier < 1 || cfg.Backoff.Max < cfg.Backoff.Initial {
		return bad("Backoff", "need 0 < Initial <= Max and Multiplier >= 1, got %+v", cfg.Backoff)
	}
	if cfg.AckTimeout < 0 {
		return bad("AckTimeout", "%v is negative", cfg.AckTimeout)
	}
	if cfg.SnapshotEvery < 0 {
		return bad("SnapshotEvery", "%d is negative", cfg.SnapshotEvery)
	}
	if cfg.SnapshotInterval < 0 {
		return bad("SnapshotInterval", "%v is negative", cfg.SnapshotInterval)
	}
	return nil
}
