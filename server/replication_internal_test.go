package server

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/replicate"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// fakeReplicators stands in for replicators: it counts the ones started and
// the ones still running (not cancelled).
type fakeReplicators struct {
	started, live atomic.Int32
}

func (f *fakeReplicators) start(ctx context.Context, b *broadcast.Broadcaster, source string) (*replicatorRun, error) {
	// Yield a little, as opening the primary's WAL would, so that
	// concurrent reconciles interleave here.
	for range 10 {
		runtime.Gosched()
	}
	f.started.Add(1)
	f.live.Add(1)
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	run := &replicatorRun{source: source, b: b, cancel: cancel, done: make(chan struct{}),
		status: func() []replicate.PChannelStatus { return nil }}
	go func() {
		defer close(run.done)
		<-rctx.Done()
		f.live.Add(-1)
	}()
	return run, nil
}

// secondaryReplication returns the replication of cluster west, a secondary
// of east, with fake replicators.
func secondaryReplication(t *testing.T) (*replication, *fakeReplicators) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	pchans := []message.PChannel{"wal-0", "wal-1"}
	b, err := broadcast.New(ctx, broadcast.Config{Catalog: cmem.New(), WAL: wal.New(wmem.New(pchans...)), Types: message.NewRegistry(),
		ControlChannel: pchans[0].Control(), PChannels: pchans, ClusterName: "west", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	topo := broadcast.ReplicateConfig{Primary: "east", Secondaries: []broadcast.SecondaryConfig{{Name: "west", Source: "nats://east:4222"}}}
	if err := b.Follow(ctx, topo); err != nil {
		t.Fatal(err)
	}
	rp := newReplication(func() (*broadcast.Broadcaster, bool) { return b, true }, nil, pchans, 0, "west", log)
	f := &fakeReplicators{}
	rp.start = f.start
	return rp, f
}

// TestR8_2_OneReplicatorAtATime reconciles from many goroutines at once, as
// the replication loop and Follow handlers do: one replicator starts, and
// once the loop ends none runs, and none starts again.
func TestR8_2_OneReplicatorAtATime(t *testing.T) {
	rp, f := secondaryReplication(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for range 16 {
		wg.Go(func() {
			<-gate
			for range 5 {
				rp.reconcile(ctx)
			}
		})
	}
	close(gate)
	wg.Wait()
	if n := f.started.Load(); n != 1 {
		t.Fatalf("%d replicators started, want 1", n)
	}
	if running, _ := rp.status(); !running {
		t.Fatal("status: not replicating")
	}
	rp.close()
	if n := f.live.Load(); n != 0 {
		t.Fatalf("%d replicators still run after close", n)
	}
	rp.reconcile(ctx) // a Follow handler finishing late
	if n, live := f.started.Load(), f.live.Load(); n != 1 || live != 0 {
		t.Fatalf("after close: %d started, %d running", n, live)
	}
}

// TestR8_3_ForcePromotePausesReplication: while a force promote runs, the
// loop does not restart the replicator it stopped, although the engine does
// not report Promoting yet; it may once the promote returned.
func TestR8_3_ForcePromotePausesReplication(t *testing.T) {
	rp, f := secondaryReplication(t)
	ctx := context.Background()
	rp.reconcile(ctx)
	if f.started.Load() != 1 || f.live.Load() != 1 {
		t.Fatalf("%d started, %d running, want 1, 1", f.started.Load(), f.live.Load())
	}
	rp.pause()
	if f.live.Load() != 0 {
		t.Fatal("pause left the replicator running")
	}
	rp.reconcile(ctx) // the loop's tick during the promote
	if n := f.started.Load(); n != 1 {
		t.Fatalf("the replicator restarted during a force promote (%d starts)", n)
	}
	if running, _ := rp.status(); running {
		t.Fatal("status: replicating during a force promote")
	}
	rp.resume()
	rp.reconcile(ctx) // the promote failed: the secondary replicates again
	if f.started.Load() != 2 || f.live.Load() != 1 {
		t.Fatalf("after resume: %d started, %d running, want 2, 1", f.started.Load(), f.live.Load())
	}
	rp.close()
	if f.live.Load() != 0 {
		t.Fatal("close left the replicator running")
	}
}
