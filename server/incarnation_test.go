package server_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/embedetcd"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/server"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// TestR9_2_RestartedCoordinatorTakesOverAtOnce crashes a leading
// coordinator (its etcd client dies without resigning: its election lease
// lives on for its TTL, a minute here) and starts a new incarnation on the
// same state directory: it revokes its predecessor's lease and leads long
// before that lease could have expired, in a newer fencing term. A second
// coordinator on a directory in use is refused.
func TestR9_2_RestartedCoordinatorTakesOverAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	srv, err := embedetcd.Start(ctx, embedetcd.Config{Dir: filepath.Join(dir, "etcd")})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	pchans := []message.PChannel{"wal-0", "wal-1"}
	w := wal.New(wmem.New(pchans...))
	const ttl = time.Minute // far beyond the waits below
	state := filepath.Join(dir, "coord")
	newCoord := func(client *clientv3.Client) (*server.Coordinator, error) {
		types := message.NewRegistry()
		if err := (app.Generic{}).Register(types, broadcast.NewCallbacks()); err != nil {
			t.Fatal(err)
		}
		return server.NewCoordinator(server.CoordinatorConfig{
			Client: client, Prefix: "restart/", Limits: catalog.Limits{MaxOps: srv.MaxTxnOps(), MaxBytes: 1 << 20},
			Advertise: "127.0.0.1:1", TTL: ttl, Logger: slog.New(slog.DiscardHandler), StateDir: state,
			Broadcast: broadcast.Config{WAL: w, Types: types, Callbacks: broadcast.NewCallbacks(),
				ControlChannel: pchans[0].Control(), PChannels: pchans, Logger: slog.New(slog.DiscardHandler)},
		})
	}
	run := func(c *server.Coordinator) (stop func()) {
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(rctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}
	client1, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	first, err := newCoord(client1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newCoord(client1); !errors.Is(err, server.ErrStateDirInUse) {
		t.Fatalf("a second coordinator on a directory in use: %v, want ErrStateDirInUse", err)
	}
	stop1 := run(first)
	waitUntil(t, "the first incarnation to lead", func() bool { return first.Term() != 0 })
	term1 := first.Term()
	// The crash: the connection dies at once (nothing more reaches
	// etcd: the lease is no longer kept alive, nobody resigns or revokes).
	if err := client1.ActiveConnection().Close(); err != nil {
		t.Fatal(err)
	}
	stop1()
	client1.Close()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	client2, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer client2.Close()
	if r, err := client2.Get(ctx, "restart.election/", clientv3.WithPrefix()); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("the crashed incarnation's election key: %v, %v", r, err)
	}
	second, err := newCoord(client2)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	restarted := time.Now()
	stop2 := run(second)
	defer stop2()
	waitUntil(t, "the restarted incarnation to lead", func() bool { return second.Term() != 0 })
	t.Logf("restarted incarnation leads after %v (election ttl %v)", time.Since(restarted).Round(time.Millisecond), ttl)
	if second.Term() <= term1 {
		t.Fatalf("term %d after %d: the fencing term did not advance", second.Term(), term1)
	}
}
