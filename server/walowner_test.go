package server_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/internal/embedetcd"
	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/server"
)

// TestR8_2_NewCatalogOnAnotherClustersStreamsIsRefused: a coordinator of
// cluster "walcast" broadcasts on a NATS server; a second cluster of the
// same name with a new catalog prefix (as on a shared etcd) on the same
// streams is refused at start, naming the stream prefix — it would take the
// first cluster's entries for its own — while the same cluster with its own
// stream prefix, or under another name, starts. The first cluster itself,
// restarted on its catalog, starts too.
func TestR8_2_NewCatalogOnAnotherClustersStreamsIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	etcd, err := embedetcd.Start(ctx, embedetcd.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	ns, err := embednats.Start(ctx, embednats.Config{Dir: t.TempDir(), SyncAlways: true, Monitor: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	cfg := coordConfig(t, etcd.Endpoints(), ns.ClientURL())
	cfg.WAL.NATS.MonitorURLs = []string{ns.MonitorURL()}
	cfg.Catalog.Prefix = "first/"
	p := startCoordinator(t, ctx, cfg)
	waitUntil(t, "the coordinator to lead", func() bool { _, err := p.Coord.Current(); return err == nil })
	broadcastOnce(t, p)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	second := cfg
	second.Catalog.Prefix = "second/"
	_, err = server.StartCoordinator(ctx, second, app.Generic{})
	if !errors.Is(err, server.ErrConfig) || !strings.Contains(err.Error(), "wal.nats.stream_prefix") || !strings.Contains(err.Error(), `written by a cluster named "walcast"`) {
		t.Fatalf("a new catalog on the streams of a cluster of the same name: %v", err)
	}
	own := second
	own.WAL.NATS.StreamPrefix = "SECOND"
	startCoordinator(t, ctx, own).Close()
	other := second
	other.Catalog.Prefix, other.Cluster.Name = "third/", "third"
	startCoordinator(t, ctx, other).Close()
	startCoordinator(t, ctx, cfg).Close()
}
