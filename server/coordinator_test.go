package server_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/embedetcd"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/server"
	"github.com/walcast/walcast/server/internal/metrics"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// TestR9_2_DeposedLeaderIsFencedAndStepsDown makes a leading coordinator a
// zombie: its election key disappears (as when its lease expired on the
// server while it did not notice) but it keeps running. Its next catalog
// write fails as fenced, the broadcast is refused, the fencing metric
// counts it, and the coordinator steps down and campaigns again.
func TestR9_2_DeposedLeaderIsFencedAndStepsDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	srv, err := embedetcd.Start(ctx, embedetcd.Config{Dir: filepath.Join(dir, "etcd")})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	client, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	types := message.NewRegistry()
	if err := (app.Generic{}).Register(types, broadcast.NewCallbacks()); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	obs, err := metrics.NewBroadcaster(reg)
	if err != nil {
		t.Fatal(err)
	}
	pchans := []message.PChannel{"wal-0", "wal-1"}
	coord, err := server.NewCoordinator(server.CoordinatorConfig{
		Client: client, Prefix: "zombie/", Limits: catalog.Limits{MaxOps: srv.MaxTxnOps(), MaxBytes: 1 << 20},
		Advertise: "127.0.0.1:1", TTL: 5 * time.Second, Logger: slog.New(slog.DiscardHandler),
		Broadcast: broadcast.Config{WAL: wal.New(wmem.New(pchans...)), Types: types, Callbacks: broadcast.NewCallbacks(),
			ControlChannel: pchans[0].Control(), PChannels: pchans, Observer: obs, Logger: slog.New(slog.DiscardHandler),
			Backoff: broadcast.Backoff{Initial: time.Millisecond, Multiplier: 2, Max: 50 * time.Millisecond}},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- coord.Run(runCtx) }()
	defer func() { stop(); <-done }()

	var b *broadcast.Broadcaster
	waitUntil(t, "leadership", func() bool { b, err = coord.Current(); return err == nil })
	broadcastOnce := func(b *broadcast.Broadcaster) error {
		h, err := b.WithResourceKeys(ctx, resource.ExclusiveCollection("db", "c"))
		if err != nil {
			return err
		}
		defer h.Close()
		m, _ := message.NewBroadcast(app.GenericType, []byte("x"), []message.VChannel{"wal-1/a"})
		_, err = h.Broadcast(ctx, m)
		return err
	}
	if err := broadcastOnce(b); err != nil {
		t.Fatal(err)
	}
	// The zombie: its leader key is gone, its session still alive.
	resp, err := client.Get(ctx, "zombie.election/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("election keys: %v, %v", resp, err)
	}
	if _, err := client.Delete(ctx, string(resp.Kvs[0].Key)); err != nil {
		t.Fatal(err)
	}
	err = broadcastOnce(b)
	if !errors.Is(err, broadcast.ErrTaskNotCreated) || !strings.Contains(err.Error(), "fenced") {
		t.Fatalf("broadcast of a deposed leader: %v, want not created (fenced)", err)
	}
	select {
	case <-b.Done():
	case <-ctx.Done():
		t.Fatal("the fenced broadcaster did not stop")
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP walcast_broadcaster_fenced_total Times the catalog reported a newer coordinator term and the broadcaster stopped.
# TYPE walcast_broadcaster_fenced_total counter
walcast_broadcaster_fenced_total 1
`), "walcast_broadcaster_fenced_total"); err != nil {
		t.Fatalf("fencing metric: %v", err)
	}
	waitUntil(t, "a new term", func() bool { return coord.Terms() == 2 })
	b2, err := coord.Current()
	if err != nil || b2 == b {
		t.Fatalf("after stepping down: %v", err)
	}
	if err := broadcastOnce(b2); err != nil {
		t.Fatalf("broadcast in the new term: %v", err)
	}
	_ = os.RemoveAll(dir)
}
