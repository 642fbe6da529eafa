package broadcast_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// Edge cases of shutdown, promotion and callbacks that need the driver
// (goroutines, contexts, Close) rather than the decision core alone; those
// the core decides alone are scripted in broadcast/internal/sim.

// hangLog makes appends to one pchannel hang until their context ends.
type hangLog struct {
	wal.Log
	hang func(p message.PChannel, data []byte) bool
}

func (l hangLog) Append(ctx context.Context, p message.PChannel, id string, data []byte) (uint64, error) {
	if l.hang(p, data) {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	return l.Log.Append(ctx, p, id, data)
}

// closesWithin fails the test unless Close returns within d.
func closesWithin(t *testing.T, b *broadcast.Broadcaster, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { _ = b.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("Close did not return within %v", d)
	}
}

// TestR5_1_CallbackAfterNewRefused: a callback registered after New would
// miss the tasks New recovered (they would complete without it): it is
// refused.
func TestR5_1_CallbackAfterNewRefused(t *testing.T) {
	e := newEnv(t)
	e.open()
	typ := message.Type{Name: "Late", Version: 1}
	e.types.MustRegister(message.TypeInfo{Type: typ})
	err := broadcast.OnAck(e.cbs, typ, broadcast.Raw(), func(context.Context, *broadcast.TypedEvent[[]byte]) error { return nil })
	if !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("OnAck after New: %v, want ErrInvalidArgument", err)
	}
	err = broadcast.OnAckOnce(e.cbs, typ, broadcast.Raw(), func(context.Context, *broadcast.TypedAckEvent[[]byte]) error { return nil })
	if !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("OnAckOnce after New: %v, want ErrInvalidArgument", err)
	}
}

// TestR8_3_PromoteDeadlineWhileClusterHeld: a force promote whose context
// ends while the Cluster key is held elsewhere returns the context's error,
// broadcasts nothing and holds nothing.
func TestR8_3_PromoteDeadlineWhileClusterHeld(t *testing.T) {
	p := newPromoteEnv(t)
	ctx := ctxT(t, 10*time.Second)
	g, err := p.b.Locker().Lock(ctx, resource.ExclusiveCluster())
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if _, err := p.b.ForcePromote(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ForcePromote: %v, want the deadline", err)
	}
	g.Unlock()
	waitFor(t, "every key released", func() bool { return len(p.b.Locks()) == 0 })
	if st := p.b.Stats(); st.Broadcasts != 0 {
		t.Fatalf("%d broadcasts after a promote that never got its key", st.Broadcasts)
	}
	if p.b.Role() != broadcast.Secondary {
		t.Fatalf("role %s", p.b.Role())
	}
}

// TestR4_7_ClosePromoteWaitingForAcks: Close while a force promote waits for
// its nodes' acks (a lagging node cannot deliver them yet: its acks fail and
// it retries): Close returns promptly, the cluster stays secondary, and after
// a restart the resumed promote completes once the acks arrive.
func TestR4_7_ClosePromoteWaitingForAcks(t *testing.T) {
	p := newPromoteEnv(t)
	p.acker.mu.Lock()
	p.acker.fail = func(a broadcast.Ack) bool {
		return a.Message != nil && a.Message.Type == broadcast.AlterReplicateConfig
	}
	p.acker.mu.Unlock()
	ctx := ctxT(t, 20*time.Second)
	errs := make(chan error, 1)
	go func() { _, err := p.b.ForcePromote(ctx); errs <- err }()
	waitFor(t, "the promote's copies appended", func() bool {
		ts, _ := p.b.Tasks(broadcast.Filter{Type: broadcast.AlterReplicateConfig, States: []broadcast.State{broadcast.Pending}})
		return len(ts) == 1 && ts[0].Stage == "acking"
	})
	closesWithin(t, p.b, 5*time.Second)
	if err := <-errs; !errors.Is(err, broadcast.ErrClosed) || broadcast.IsTaskNotCreated(err) {
		t.Fatalf("ForcePromote after Close: %v, want created, completes after recovery", err)
	}
	b := p.open(func(c *broadcast.Config) { c.PChannels = pchans })
	if b.Role() != broadcast.Secondary {
		t.Fatalf("role %s after a restart mid-promote", b.Role())
	}
	p.acker.mu.Lock()
	p.acker.fail = nil
	p.acker.mu.Unlock()
	p.acker.set(b)
	// The node's retried acks reach the restarted coordinator.
	resumedPromote(ctx, t, b)
}

// TestR4_7_CloseWithHungSupplement: the WAL hangs appends of a force
// promote's supplement; Close still returns within a bound (goleak in
// TestMain checks nothing is left).
func TestR4_7_CloseWithHungSupplement(t *testing.T) {
	p := newPromoteEnv(t, func(c *broadcast.Config) {
		c.WAL = wal.New(hangLog{Log: c.WAL.Log(), hang: func(_ message.PChannel, data []byte) bool {
			cs, err := wal.Decode(0, data)
			return err == nil && len(cs) > 0 && cs[0].Message.Broadcast.ID == 10 && cs[0].Message.Replicate == nil
		}})
	})
	m := replicated(10, typCreate, []message.VChannel{vch(1, "x")}, resource.ExclusiveCollection("db", "c"))
	p.replicate(t, m, cchan)
	ctx := ctxT(t, 20*time.Second)
	go func() { _, _ = p.b.ForcePromote(ctx) }()
	waitFor(t, "the supplement appending", func() bool {
		ti, err := p.b.Task(10)
		return err == nil && ti.AppendAttempts == 0 && p.b.Promoting() && !ti.VChannels[0].Appended && ti.Stage == "queued"
	})
	closesWithin(t, p.b, 5*time.Second)
}

// TestR4_7_CloseWhileAckOnceBlocks: Close while a consumer's Ack waits in a
// slow ack-once callback: Close returns promptly, the Ack returns an error,
// and after a restart the copy is not acked.
func TestR4_7_CloseWhileAckOnceBlocks(t *testing.T) {
	typ := message.Type{Name: "SlowOnce", Version: 1}
	e := newEnv(t)
	e.types.MustRegister(message.TypeInfo{Type: typ, AckSyncUp: true})
	entered := make(chan struct{})
	var once sync.Once
	if err := broadcast.OnAckOnce(e.cbs, typ, broadcast.Raw(), func(ctx context.Context, _ *broadcast.TypedAckEvent[[]byte]) error {
		once.Do(func() { close(entered) })
		<-ctx.Done()
		return ctx.Err()
	}); err != nil {
		t.Fatal(err)
	}
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	go func() {
		_, _ = do(ctx, b, msgOf(t, typ, "p", []message.VChannel{vch(1, "x")}), resource.ExclusiveCollection("db", "c"))
	}()
	waitFor(t, "the task appended", func() bool {
		ti, err := b.Task(1)
		return err == nil && ti.VChannels[0].Appended
	})
	acked := make(chan error, 1)
	go func() { acked <- b.Ack(ctx, broadcast.Ack{BroadcastID: 1, VChannel: vch(1, "x")}) }()
	<-entered
	closesWithin(t, b, 5*time.Second)
	if err := <-acked; err == nil {
		t.Fatal("Ack blocked in its ack-once callback returned nil after Close")
	}
	b = e.open()
	ti, err := b.Task(1)
	if err != nil {
		t.Fatal(err)
	}
	if ti.VChannels[0].Acked {
		t.Fatal("the copy is acked after a restart, though its ack never completed")
	}
}

// TestR5_5_BlockedAckOnceStallsNothingElse: A's ack-once callback blocks; an
// ack of an unrelated task and an unrelated broadcast complete meanwhile.
func TestR5_5_BlockedAckOnceStallsNothingElse(t *testing.T) {
	typ := message.Type{Name: "BlockOnce", Version: 1}
	e := newEnv(t)
	e.types.MustRegister(message.TypeInfo{Type: typ, AckSyncUp: true})
	release := make(chan struct{})
	var blocked atomic.Bool
	if err := broadcast.OnAckOnce(e.cbs, typ, broadcast.Raw(), func(ctx context.Context, ev *broadcast.TypedAckEvent[[]byte]) error {
		if string(ev.Payload) == "A" {
			blocked.Store(true)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b := e.open()
	defer close(release)
	ctx := ctxT(t, 10*time.Second)
	go func() {
		_, _ = do(ctx, b, msgOf(t, typ, "A", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "a"))
	}()
	waitFor(t, "A created", func() bool { _, err := b.Task(1); return err == nil })
	bDone := make(chan error, 1)
	go func() {
		_, err := do(ctx, b, msgOf(t, typ, "B", []message.VChannel{vch(2, "b")}), resource.ExclusiveCollection("db", "b"))
		bDone <- err
	}()
	waitFor(t, "both appended", func() bool {
		a, errA := b.Task(1)
		bb, errB := b.Task(2)
		return errA == nil && errB == nil && a.VChannels[0].Appended && bb.VChannels[0].Appended
	})
	go func() { _ = b.Ack(ctx, broadcast.Ack{BroadcastID: 1, VChannel: vch(1, "a")}) }()
	waitFor(t, "A's ack-once callback blocking", blocked.Load)
	for _, id := range []uint64{2} {
		for _, v := range []message.VChannel{vch(2, "b"), cchan} {
			if err := b.Ack(ctx, broadcast.Ack{BroadcastID: id, VChannel: v}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := <-bDone; err != nil {
		t.Fatalf("B with A blocked: %v", err)
	}
	if _, err := do(ctx, b, msgOf(t, typCreate, "C", []message.VChannel{vch(3, "c")}), resource.ExclusiveCollection("db", "c")); err != nil {
		t.Fatalf("an unrelated broadcast with A blocked: %v", err)
	}
}

// TestR8_3_PromoteCallerDeadlineJoinedLater: the caller's context ends while
// a supplemented task cannot complete (its callback fails until released):
// ForcePromote returns the context's error, the promote goes on, and a
// second ForcePromote joins it and returns its result.
func TestR8_3_PromoteCallerDeadlineJoinedLater(t *testing.T) {
	p := newPromoteEnv(t)
	m := replicated(10, typCreate, []message.VChannel{vch(1, "x")}, resource.ExclusiveCollection("db", "c"))
	p.replicate(t, m, cchan)
	p.mu.Lock()
	p.failNext[10] = 1 << 30
	p.mu.Unlock()
	ctx := ctxT(t, 20*time.Second)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := p.b.ForcePromote(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ForcePromote: %v, want the deadline", err)
	}
	if !p.b.Promoting() {
		t.Fatal("the promote stopped with its caller")
	}
	promote := p.b.PromoteTask()
	before := p.b.Waiters(promote)
	res := make(chan error, 1)
	go func() { _, err := p.b.ForcePromote(ctx); res <- err }()
	waitFor(t, "the second ForcePromote to join", func() bool { return p.b.Waiters(promote) > before })
	p.mu.Lock()
	p.failNext[10] = 0
	p.mu.Unlock()
	if err := p.b.RetryCallback(10); err != nil && !errors.Is(err, broadcast.ErrFailedPrecondition) {
		t.Fatal(err)
	}
	if err := <-res; err != nil {
		t.Fatalf("the second ForcePromote: %v", err)
	}
	if p.b.Role() != broadcast.Primary {
		t.Fatalf("role %s", p.b.Role())
	}
}

// TestR6_1_GCOnRealEtcdInBatches: on real etcd, more tombstones come due at
// once (MaxCount and MaxLifetime together) than one transaction may hold:
// GC collects them all, in several batches, none refused for size.
func TestR6_1_GCOnRealEtcdInBatches(t *testing.T) {
	if testing.Short() {
		t.Skip("real etcd")
	}
	e := newRealEnv(t)
	clk := newManualClock()
	const n = 300
	const maxOps = 64 // etcd here takes 1,024 per transaction: claim fewer
	b := e.open(func(c *broadcast.Config) {
		c.Catalog = limited{Catalog: c.Catalog, maxOps: maxOps}
		c.Clock = clk
		c.Tombstone.MaxCount = 100
		c.Tombstone.MaxLifetime = time.Hour
	})
	ctx := ctxT(t, 60*time.Second)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			coll := "c" + string(rune('a'+i%26)) + string(rune('a'+i/26))
			if _, err := do(ctx, b, msgOf(t, typPlain, "x", []message.VChannel{vch(i%4, coll)}), resource.ExclusiveCollection("db", coll)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	clk.Add(2 * time.Hour)   // everything expired...
	clk.Add(5 * time.Minute) // ...and the periodic check due
	waitFor(t, "GC of every tombstone", func() bool { return b.Stats().Tombstones == 0 })
	st := b.Stats()
	if st.Evicted != n {
		t.Fatalf("evicted %d of %d", st.Evicted, n)
	}
	if keys := e.be.keys(t, "tasks/"); len(keys) != 0 {
		t.Fatalf("%d task records left in etcd", len(keys))
	}
}

// limited reports smaller transaction limits than the catalog it wraps
// (and refuses bigger commits, as a server configured so would).
type limited struct {
	catalog.Catalog
	maxOps int
}

func (l limited) Limits() catalog.Limits {
	lim := l.Catalog.Limits()
	lim.MaxOps = l.maxOps
	return lim
}

func (l limited) Commit(ctx context.Context, ops ...catalog.Op) error {
	if len(ops) > l.maxOps {
		return fmt.Errorf("%w: %d ops", catalog.ErrTooLarge, len(ops))
	}
	return l.Catalog.Commit(ctx, ops...)
}

// TestR6_4_BurstLeavesOtherClassWindows: with imports in a retention class
// of their own, a burst of ten times the default class's MaxCount of other
// DDL evicts only default-class tombstones (early, counted for that class):
// every import key's window stays intact, and a retry of each is answered
// by its original.
func TestR6_4_BurstLeavesOtherClassWindows(t *testing.T) {
	typImp := message.Type{Name: "Import", Version: 1}
	e := newEnv(t)
	e.types.MustRegister(message.TypeInfo{Type: typImp})
	const maxCount = 8
	b := e.open(func(c *broadcast.Config) {
		c.Tombstone.MaxCount = maxCount
		c.Tombstone.Classes = []broadcast.RetentionClass{{Name: "import", Types: []message.Type{typImp}, MaxCount: 64}}
	})
	ctx := ctxT(t, 20*time.Second)
	var imports []uint64
	for i := range 5 {
		k := message.CollectionKey(7, "import-"+string(rune('a'+i)))
		res, err := keyed(ctx, b, typImp, k, "files", []message.VChannel{vch(1, "c7v0")}, resource.SharedCollection("db", "c7"))
		if err != nil {
			t.Fatal(err)
		}
		imports = append(imports, res.BroadcastID)
	}
	for i := range 10 * maxCount {
		coll := "burst" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if _, err := do(ctx, b, msgOf(t, typCreate, "x", []message.VChannel{vch(2, coll)}), resource.ExclusiveCollection("db", coll)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "GC of the burst", func() bool { return b.Stats().Tombstones <= maxCount+len(imports)+64 })
	for i, id := range imports {
		k := message.CollectionKey(7, "import-"+string(rune('a'+i)))
		ks, err := b.Lookup(ctx, typImp, k)
		if err != nil || ks.BroadcastID != id {
			t.Fatalf("import key %d after the burst: %+v, %v", i, ks, err)
		}
		if ks.Window.Class != "import" || ks.Window.ClassEarlyEvicted != 0 {
			t.Fatalf("import key %d window %+v: class import, nothing evicted early", i, ks.Window)
		}
		res, err := keyed(ctx, b, typImp, k, "files", []message.VChannel{vch(1, "c7v0")}, resource.SharedCollection("db", "c7"))
		if err != nil || res.Duplicated == nil || res.BroadcastID != id {
			t.Fatalf("retry of import %d: %+v, %v; want its original %d", i, res, err, id)
		}
	}
	early := b.EarlyEvictions()
	if early["default"] == 0 || early["import"] != 0 {
		t.Fatalf("early evictions per class %v: want some in default, none in import", early)
	}
}

// TestR9_6_TaskLifecycleLogged: the engine logs each stage a task enters at
// debug level and its completion at info, with its id, type, duration,
// catalog commits and outcome.
func TestR9_6_TaskLifecycleLogged(t *testing.T) {
	var buf strings.Builder
	var mu sync.Mutex
	e := newEnv(t)
	b := e.open(func(c *broadcast.Config) { c.Logger = newBufLogger(&buf, &mu) })
	ctx := ctxT(t, 10*time.Second)
	res, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	mu.Unlock()
	var stages []string
	completed := false
	for _, l := range lines {
		var r map[string]any
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		if r["broadcast"] != float64(res.BroadcastID) {
			continue
		}
		switch r["msg"] {
		case "task stage":
			stages = append(stages, r["to"].(string))
		case "task completed":
			completed = r["level"] == "INFO" && r["type"] == typCreate.String() && r["outcome"] == "succeeded" &&
				r["commits"] == float64(2) && r["duration"] != nil
		}
	}
	want := []string{"persisting", "appending", "acking", "queued", "calling", "tombstoning", "tombstoned"}
	if strings.Join(stages, ",") != strings.Join(want, ",") {
		t.Fatalf("stages logged %v, want %v", stages, want)
	}
	if !completed {
		t.Fatalf("no complete info line for broadcast %d in:\n%s", res.BroadcastID, buf.String())
	}
}
