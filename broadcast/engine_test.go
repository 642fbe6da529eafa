package broadcast_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

func TestR4_6_BroadcastReturnsAfterCallbackAndTombstone(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	targets := []message.VChannel{vch(1, "c1v0"), vch(2, "c1v1")}
	res, err := do(ctx, b, msgOf(t, typCreate, "p", targets), resource.SharedDatabase("db"), resource.ExclusiveCollection("db", "c1"))
	if err != nil {
		t.Fatal(err)
	}
	// The callback ran before Broadcast returned, and its effect is durable.
	if got := e.effects()[res.BroadcastID]; got != 1 {
		t.Fatalf("effect count %d after Broadcast returned", got)
	}
	ti, err := b.Task(res.BroadcastID)
	if err != nil || ti.State != broadcast.Tombstone {
		t.Fatalf("task state %v, %v", ti.State, err)
	}
	// R2.2: the control channel got a copy and is in the results.
	if len(res.Appends) != 3 {
		t.Fatalf("results %v, want 2 targets + control channel", res.Appends)
	}
	for _, v := range append(targets, cchan) {
		if res.Appends.Map()[v].TimeTick == 0 {
			t.Errorf("no result for %s", v)
		}
	}
	if string(res.Outcome.Data) != "done-"+itoa(res.BroadcastID) || res.Outcome.Status != broadcast.Succeeded {
		t.Fatalf("outcome %+v", res.Outcome)
	}
	if res.Duplicated != nil {
		t.Fatal("first broadcast marked duplicated")
	}
	// The keys are free again.
	if len(b.Locks()) != 0 {
		t.Fatalf("locks held: %+v", b.Locks())
	}
}

// TestR4_9_TwoCommitsOnCriticalPath: PENDING, then TOMBSTONE with checkpoints
// and effects.
func TestR4_9_TwoCommitsOnCriticalPath(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	res, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a"), vch(2, "b"), vch(3, "c")}), resource.ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	ti, err := b.Task(res.BroadcastID)
	if err != nil {
		t.Fatal(err)
	}
	_ = ti
	st := b.Stats()
	// One commit reserved the id block; the broadcast itself made two.
	if st.CatalogCommits != 3 {
		t.Fatalf("%d catalog commits, want 1 id block + 2 for the broadcast", st.CatalogCommits)
	}
	before := e.store.Applied()
	if _, err := do(ctx, b, msgOf(t, typCreate, "q", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c")); err != nil {
		t.Fatal(err)
	}
	if n := e.store.Applied() - before; n != 2 {
		t.Fatalf("second broadcast made %d catalog commits, want 2", n)
	}
}

// TestR4_9_GroupCommitSharesCommits runs concurrent broadcasts through a
// group-commit catalog and checks they shared round trips.
func TestR4_9_GroupCommitSharesCommits(t *testing.T) {
	e := newEnv(t)
	e.store.SetLatency(time.Millisecond) // a commit takes time, as etcd's does
	var g *catalog.Group
	b := e.open(func(c *broadcast.Config) {
		g = e.group(c.Catalog)
		c.Catalog = g
	})
	ctx := ctxT(t, 20*time.Second)
	var wg sync.WaitGroup
	const n = 64
	for i := range n {
		wg.Go(func() {
			name := itoa(uint64(i))
			if _, err := do(ctx, b, msgOf(t, typCreate, name, []message.VChannel{vch(i%4, "c"+name)}), resource.ExclusiveCollection("db", name)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	trips, commits := g.RoundTrips()
	t.Logf("%d broadcasts: %d commits in %d round trips", n, commits, trips)
	if commits < 2*n || trips >= commits {
		t.Fatalf("%d round trips for %d commits: nothing shared", trips, commits)
	}
}

func TestR4_2_PersistBeforeAppend(t *testing.T) {
	e := newEnv(t)
	var violations atomic.Int32
	e.log.SetHook(func(p message.PChannel, data []byte) wmem.Fault {
		cs, err := wal.Decode(0, data)
		if err != nil {
			violations.Add(1)
			return wmem.Fault{}
		}
		for _, c := range cs {
			// The hook runs under the log's lock; the store has its own.
			if len(e.store.Keys(taskKeyPrefix(c.Message.Broadcast.ID))) != 1 {
				violations.Add(1)
			}
		}
		return wmem.Fault{}
	})
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	for i := range 10 {
		if _, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(i%4, "x")}), resource.ExclusiveCollection("db", "c")); err != nil {
			t.Fatal(err)
		}
	}
	if v := violations.Load(); v != 0 {
		t.Fatalf("%d copies appended before their task was durable", v)
	}
}

func taskKeyPrefix(id uint64) string {
	return "walcast/tasks/" + pad20(id)
}

func pad20(id uint64) string {
	s := itoa(id)
	for len(s) < 20 {
		s = "0" + s
	}
	return s
}

func itoa(n uint64) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}

// TestR3_5_ConcurrentBroadcastsOnOneKeySerialise: callbacks of two broadcasts
// on one exclusive key never overlap, and both complete.
func TestR3_5_ConcurrentBroadcastsOnOneKeySerialise(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 20*time.Second)
	var inside, overlaps atomic.Int32
	typ := message.Type{Name: "Slow", Version: 1}
	e.types.MustRegister(message.TypeInfo{Type: typ})
	if err := broadcast.OnAck(e.cbs, typ, broadcast.Raw(), func(ctx context.Context, ev *broadcast.TypedEvent[[]byte]) error {
		if inside.Add(1) > 1 {
			overlaps.Add(1)
		}
		// Stay inside a while, yielding, so that a callback of the same
		// key that is not held back would run now and be counted.
		for range 200 {
			runtime.Gosched()
		}
		inside.Add(-1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b := e.open()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := do(ctx, b, msgOf(t, typ, "x", []message.VChannel{vch(1, "c")}), resource.ExclusiveCollection("db", "c")); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if overlaps.Load() != 0 {
		t.Fatalf("%d overlapping callbacks on one exclusive key", overlaps.Load())
	}
}

// TestR3_4_ExclusiveClusterBlocksAll: a holder of the exclusive Cluster key
// blocks every other broadcast until it closes.
func TestR3_4_ExclusiveClusterBlocksAll(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	h, err := b.WithResourceKeys(ctx, resource.ExclusiveCluster())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "other"))
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("broadcast ran while Cluster@X was held: %v", err)
	case <-time.After(30 * time.Millisecond):
	}
	h.Close() // never broadcast: releases the keys (R3.6)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestR3_6_CloseAfterBroadcastIsNoop: after Broadcast, the task owns the
// keys; Close must not release them while the callback runs.
func TestR3_6_CloseAfterBroadcastIsNoop(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	h, err := b.WithResourceKeys(ctx, resource.ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	e.mu.Lock()
	e.block[1] = release // the first broadcast id
	e.mu.Unlock()
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err = h.Broadcast(short, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}))
	if !errors.Is(err, context.DeadlineExceeded) || broadcast.IsTaskNotCreated(err) {
		t.Fatalf("Broadcast with a short deadline: %v, want a deadline error, task created", err)
	}
	h.Close()
	if _, err := b.Locker().TryLock(resource.ExclusiveCollection("db", "c")); !errors.Is(err, resource.ErrConflict) {
		t.Fatalf("Close after Broadcast released the task's key: %v", err)
	}
	close(release)
	waitIdle(t, b)
	if len(b.Locks()) != 0 {
		t.Fatalf("locks after completion: %+v", b.Locks())
	}
	if _, err := h.Broadcast(ctx, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")})); !errors.Is(err, broadcast.ErrHandleUsed) {
		t.Fatalf("second Broadcast on a handle: %v", err)
	}
}

// TestR3_6_InvalidMessageReleasesKeys: a rejected broadcast creates nothing
// and leaves no key held.
func TestR3_6_InvalidMessageReleasesKeys(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	bad := []*message.Message{
		nil,
		{Type: message.Type{Name: "Unknown", Version: 1}, Broadcast: message.BroadcastHeader{VChannels: []message.VChannel{vch(1, "a")}}},
		{Type: typCreate},
		{Type: typCreate, Broadcast: message.BroadcastHeader{VChannels: []message.VChannel{vch(1, "a"), vch(1, "a")}}},
		{Type: typCreate, Broadcast: message.BroadcastHeader{VChannels: []message.VChannel{"no-slash"}}},
		{Type: typCreate, IdempotencyKey: "1:01:x", Broadcast: message.BroadcastHeader{VChannels: []message.VChannel{vch(1, "a")}}},
		{Type: typCreate, Payload: make([]byte, 300<<10), Broadcast: message.BroadcastHeader{VChannels: []message.VChannel{vch(1, "a")}}},
	}
	for i, m := range bad {
		_, err := do(ctx, b, m, resource.ExclusiveCollection("db", "c"))
		if !errors.Is(err, broadcast.ErrInvalidArgument) {
			t.Errorf("case %d: %v, want ErrInvalidArgument", i, err)
		}
	}
	if n := e.store.Applied(); n != 0 {
		t.Fatalf("%d catalog commits for invalid input", n)
	}
	if n := e.log.Appends(); n != 0 {
		t.Fatalf("%d appends for invalid input", n)
	}
	if len(b.Locks()) != 0 {
		t.Fatalf("locks held: %+v", b.Locks())
	}
	if _, err := b.WithResourceKeys(ctx, resource.Key{Domain: 9, Name: "x", Mode: resource.Shared}); !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("bad resource key: %v", err)
	}
}

func TestR4_7_ClosedBroadcasterRefusesWithTaskNotCreated(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	h, err := b.WithResourceKeys(ctx, resource.ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = h.Broadcast(ctx, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}))
	if !broadcast.IsTaskNotCreated(err) {
		t.Fatalf("Broadcast on a closed broadcaster: %v, want task not created", err)
	}
	if _, err := b.WithResourceKeys(ctx); !broadcast.IsTaskNotCreated(err) {
		t.Fatalf("WithResourceKeys on a closed broadcaster: %v", err)
	}
	if err := b.Ack(ctx, broadcast.Ack{BroadcastID: 1, VChannel: vch(1, "a")}); !errors.Is(err, broadcast.ErrClosed) {
		t.Fatalf("Ack on a closed broadcaster: %v", err)
	}
	if e.store.Applied() != 0 {
		t.Fatal("a refused broadcast wrote to the catalog")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestR4_3_AppendRetriedWithBackoff fails one pchannel's appends three times:
// only its copies are retried, and the broadcast completes.
func TestR4_3_AppendRetriedWithBackoff(t *testing.T) {
	e := newEnv(t)
	e.log.FailNext("wal-2", 3, wmem.Fault{Fail: true})
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	res, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a"), vch(2, "b")}), resource.ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.AppendRetries != 3 {
		t.Fatalf("%d append retries, want 3", st.AppendRetries)
	}
	if n := len(e.log.Entries("wal-1")); n != 1 {
		t.Fatalf("wal-1 has %d entries: the healthy pchannel was re-appended", n)
	}
	if n := len(e.log.Entries("wal-2")); n != 1 {
		t.Fatalf("wal-2 has %d entries", n)
	}
	ti, _ := b.Task(res.BroadcastID)
	if ti.State != broadcast.Tombstone {
		t.Fatal("not completed")
	}
}

// TestR4_3_LostAppendAnswerNotDuplicated: the retry of an append whose answer
// was lost is deduplicated by the backend (same entry bytes).
func TestR4_3_LostAppendAnswerNotDuplicated(t *testing.T) {
	e := newEnv(t)
	e.log.FailNext("wal-1", 1, wmem.Fault{LoseAnswer: true})
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	if _, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c")); err != nil {
		t.Fatal(err)
	}
	if n := len(e.log.Entries("wal-1")); n != 1 {
		t.Fatalf("wal-1 has %d entries after a lost answer, want 1", n)
	}
}

// TestR4_3_RetriesGoAheadOfNewWork: copies queued behind a failing append
// land after it, in one later entry.
func TestR4_3_RetriesGoAheadOfNewWork(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	e.log.FailNext("wal-1", 2, wmem.Fault{Fail: true})
	first := make(chan uint64, 1)
	go func() {
		res, err := do(ctx, b, msgOf(t, typCreate, "first", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "a"))
		if err != nil {
			t.Error(err)
			first <- 0
			return
		}
		first <- res.BroadcastID
	}()
	waitFor(t, "first append to fail", func() bool { return b.Stats().AppendRetries >= 1 })
	res2, err := do(ctx, b, msgOf(t, typCreate, "second", []message.VChannel{vch(1, "b")}), resource.ExclusiveCollection("db", "b"))
	if err != nil {
		t.Fatal(err)
	}
	id1 := <-first
	entries := e.log.Entries("wal-1")
	cs, err := wal.Decode(0, entries[0])
	if err != nil {
		t.Fatal(err)
	}
	if cs[0].Message.Broadcast.ID != id1 || cs[0].Message.Broadcast.ID == res2.BroadcastID {
		t.Fatalf("first entry on wal-1 holds broadcast %d; the retried one (%d) must go first", cs[0].Message.Broadcast.ID, id1)
	}
}

// TestR4_4_FastAckAndAckSyncUp: without AckSyncUp the broadcast completes
// from append results; with it, only consumer acks count.
func TestR4_4_FastAckAndAckSyncUp(t *testing.T) {
	// In a bubble: once the copies are appended, synctest.Wait returns
	// when nothing in the broadcaster can move without an outside event,
	// so "no completion without consumer acks" is checked, not hoped for.
	synctest.Test(t, testAckSyncUpWaitsForConsumers)
}

func testAckSyncUpWaitsForConsumers(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	targets := []message.VChannel{vch(1, "a"), vch(2, "b")}
	type out struct {
		res *broadcast.Result
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := do(ctx, b, msgOf(t, typSync, "t", targets), resource.ExclusiveCollection("db", "c"))
		done <- out{res, err}
	}()
	var id uint64
	waitFor(t, "the task to be appended", func() bool {
		ts, _ := b.Tasks(broadcast.Filter{States: []broadcast.State{broadcast.Pending}})
		if len(ts) == 1 && ts[0].VChannels[0].Appended && ts[0].VChannels[1].Appended && ts[0].VChannels[2].Appended {
			id = ts[0].ID
			return true
		}
		return false
	})
	synctest.Wait()
	select {
	case o := <-done:
		t.Fatalf("AckSyncUp broadcast completed without consumer acks: %+v %v", o.res, o.err)
	default:
	}
	cps := map[message.VChannel]wal.Checkpoint{}
	for i, v := range append(targets, cchan) {
		cp := wal.Checkpoint{MessageID: uint64(100 + i), TimeTick: uint64(100 + i), LastConfirmed: uint64(100 + i)}
		cps[v] = cp
		if err := b.Ack(ctx, broadcast.Ack{BroadcastID: id, VChannel: v, Checkpoint: cp}); err != nil {
			t.Fatal(err)
		}
	}
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	for v, cp := range cps {
		if o.res.Appends.Map()[v] != cp {
			t.Errorf("%s: result %+v, want the consumer's checkpoint %+v", v, o.res.Appends.Map()[v], cp)
		}
	}
}

// TestR4_5_AcksAreIdempotent covers repeats, outsiders, unknown and
// tombstoned ids, and legacy acks without a checkpoint.
func TestR4_5_AcksAreIdempotent(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	res, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	before := e.store.Applied()
	for range 3 {
		if err := b.Ack(ctx, broadcast.Ack{BroadcastID: res.BroadcastID, VChannel: vch(1, "a"), Checkpoint: wal.Checkpoint{MessageID: 9, TimeTick: 9}}); err != nil {
			t.Fatalf("ack of a tombstoned task: %v", err)
		}
	}
	// Unknown to it but within the ids it reserved (a collected tombstone
	// looks the same): ignored.
	if err := b.Ack(ctx, broadcast.Ack{BroadcastID: res.BroadcastID + 1, VChannel: vch(1, "a")}); err != nil {
		t.Fatalf("ack of an unknown task: %v", err)
	}
	// Above every id it reserved: a newer leader's broadcast, which this
	// coordinator must not swallow (it is deposed and has not noticed).
	if err := b.Ack(ctx, broadcast.Ack{BroadcastID: 999999, VChannel: vch(1, "a")}); !errors.Is(err, catalog.ErrFenced) {
		t.Fatalf("ack of a broadcast it did not issue: %v, want an error wrapping catalog.ErrFenced", err)
	}
	if e.store.Applied() != before {
		t.Fatal("ignored acks wrote to the catalog")
	}
	// A live task: repeated and legacy acks.
	id, done := startSyncTask(ctx, t, b, vch(1, "a"))
	if err := b.Ack(ctx, broadcast.Ack{BroadcastID: id, VChannel: vch(3, "elsewhere")}); !errors.Is(err, broadcast.ErrVChannelNotInTask) {
		t.Fatalf("ack outside the task: %v", err)
	}
	first := wal.Checkpoint{MessageID: 5, TimeTick: 5, LastConfirmed: 5}
	if err := b.Ack(ctx, broadcast.Ack{BroadcastID: id, VChannel: vch(1, "a"), Checkpoint: first}); err != nil {
		t.Fatal(err)
	}
	if err := b.Ack(ctx, broadcast.Ack{BroadcastID: id, VChannel: vch(1, "a"), Checkpoint: wal.Checkpoint{MessageID: 6, TimeTick: 6}}); err != nil {
		t.Fatal(err)
	}
	// Legacy ack: no checkpoint, the append result stands in.
	if err := b.Ack(ctx, broadcast.Ack{BroadcastID: id, VChannel: cchan}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.Appends.Map()[vch(1, "a")] != first {
		t.Fatalf("first checkpoint did not win: %+v", r.Appends.Map()[vch(1, "a")])
	}
	if r.Appends.Map()[cchan].TimeTick == 0 {
		t.Fatal("legacy ack left the control channel without a checkpoint")
	}
}

// startSyncTask starts an AckSyncUp broadcast to targets (and the control
// channel) and waits until its task is pending with every target's copy
// appended; the broadcast's result (nil if it failed) arrives on done once
// consumers acked it.
func startSyncTask(ctx context.Context, t *testing.T, b *broadcast.Broadcaster, targets ...message.VChannel) (id uint64, done chan *broadcast.Result) {
	t.Helper()
	done = make(chan *broadcast.Result, 1)
	go func() {
		r, err := do(ctx, b, msgOf(t, typSync, "t", targets), resource.ExclusiveCollection("db", "c"))
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	waitFor(t, "the AckSyncUp task", func() bool {
		ts, _ := b.Tasks(broadcast.Filter{States: []broadcast.State{broadcast.Pending}})
		if len(ts) != 1 {
			return false
		}
		for _, vc := range ts[0].VChannels {
			if slices.Contains(targets, vc.VChannel) && !vc.Appended {
				return false
			}
		}
		id = ts[0].ID
		return true
	})
	return id, done
}

// TestR4_5_AckAllAnswersEachAckAsAckWould: the acks of one entry, given
// together, are each answered as Ack alone answers them; one refused does
// not refuse the others, and the taken ones complete the task.
func TestR4_5_AckAllAnswersEachAckAsAckWould(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	id, done := startSyncTask(ctx, t, b, vch(1, "a"), vch(2, "b"))
	cpA := wal.Checkpoint{MessageID: 7, TimeTick: 7, LastConfirmed: 7}
	cpB := wal.Checkpoint{MessageID: 8, TimeTick: 8, LastConfirmed: 8}
	acks := []broadcast.Ack{
		{BroadcastID: id, VChannel: vch(1, "a"), Checkpoint: cpA},
		{BroadcastID: id, VChannel: vch(3, "elsewhere")},
		{BroadcastID: id, VChannel: vch(2, "b"), Checkpoint: cpB, Extra: make([]byte, broadcast.MaxAckExtraBytes+1)},
		{BroadcastID: id, VChannel: vch(2, "b"), Checkpoint: cpB},
		{BroadcastID: id, VChannel: cchan},
	}
	errs := b.AckAll(ctx, acks)
	if len(errs) != len(acks) {
		t.Fatalf("AckAll answered %d of %d acks: %v", len(errs), len(acks), errs)
	}
	for i, want := range []error{nil, broadcast.ErrVChannelNotInTask, broadcast.ErrInvalidArgument, nil, nil} {
		if want == nil && errs[i] != nil || want != nil && !errors.Is(errs[i], want) {
			t.Errorf("ack %d (%s): %v, want %v", i, acks[i].VChannel, errs[i], want)
		}
	}
	r := <-done
	if r == nil {
		t.FailNow()
	}
	if r.Appends.Map()[vch(1, "a")] != cpA || r.Appends.Map()[vch(2, "b")] != cpB {
		t.Fatalf("the taken acks' checkpoints are not the result's: %+v", r.Appends)
	}
	// Every ack taken: no answers to read.
	if errs := b.AckAll(ctx, acks[:1]); errs != nil {
		t.Fatalf("AckAll of a tombstoned task's ack: %v, want nil", errs)
	}
	b.Close()
	errs = b.AckAll(ctx, acks[:2])
	if len(errs) != 2 || !errors.Is(errs[0], broadcast.ErrClosed) || !errors.Is(errs[1], broadcast.ErrClosed) {
		t.Fatalf("AckAll after Close: %v, want ErrClosed for each", errs)
	}
}

// TestR5_2_CallbackRetriedAndVisible: a failing callback is retried with
// backoff, its failures visible, until it succeeds.
func TestR5_2_CallbackRetriedAndVisible(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	e.mu.Lock()
	e.failNext[1] = 3
	e.mu.Unlock()
	res, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	attempts := e.attempts[res.BroadcastID]
	e.mu.Unlock()
	if attempts != 4 || e.effects()[res.BroadcastID] != 1 {
		t.Fatalf("%d attempts, effect %d; want 4 attempts, effect once", attempts, e.effects()[res.BroadcastID])
	}
	if b.Stats().CallbackFailures != 3 {
		t.Fatalf("%d callback failures counted", b.Stats().CallbackFailures)
	}
}

// TestR5_6_OperatorRetryAndComplete: a stuck callback shows its error and
// the history of its attempts, can be retried now, and can be completed by
// an operator, which releases its keys.
func TestR5_6_OperatorRetryAndComplete(t *testing.T) {
	e := newEnv(t)
	b := e.open(func(c *broadcast.Config) {
		c.Backoff = broadcast.Backoff{Initial: time.Hour, Multiplier: 2, Max: time.Hour}
	})
	ctx := ctxT(t, 10*time.Second)
	e.mu.Lock()
	e.failNext[1] = 1000
	e.mu.Unlock()
	go func() {
		_, _ = do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c"))
	}()
	var ti broadcast.TaskInfo
	waitFor(t, "a failed callback", func() bool {
		var err error
		ti, err = b.Task(1)
		return err == nil && ti.Callback.Attempts == 1 && ti.Callback.LastError != ""
	})
	if !ti.Callback.Running || ti.Callback.NextAttemptAt.Before(time.Now().Add(30*time.Minute)) {
		t.Fatalf("callback info %+v", ti.Callback)
	}
	if err := b.RetryCallback(1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the retry's failure", func() bool {
		ti, _ = b.Task(1)
		h := ti.Callback.History
		return ti.Callback.Attempts == 2 && len(h) == 2 && h[1].Err != ""
	})
	// Each attempt is in the history, oldest first, with its times and
	// error (the console's task page shows it).
	if h := ti.Callback.History; len(h) != 2 || h[0].N != 1 || h[1].N != 2 {
		t.Fatalf("attempt history %+v, want attempts 1 and 2", h)
	}
	for _, a := range ti.Callback.History {
		if a.Err == "" || a.Started.IsZero() || a.Ended.Before(a.Started) || a.Ended.IsZero() {
			t.Fatalf("attempt %+v: want its error and its start and end", a)
		}
	}
	if err := b.CompleteCallback(ctx, 1, "operator: collection repaired by hand"); err != nil {
		t.Fatal(err)
	}
	ti, _ = b.Task(1)
	if ti.State != broadcast.Tombstone || ti.Outcome.Status != broadcast.ForceCompleted || ti.Outcome.Detail == "" {
		t.Fatalf("after CompleteCallback: %+v", ti)
	}
	if e.effects()[1] != 0 {
		t.Fatal("a force-completed task applied its effect")
	}
	if len(b.Locks()) != 0 {
		t.Fatalf("keys still held: %+v", b.Locks())
	}
	if err := b.RetryCallback(1); !errors.Is(err, broadcast.ErrFailedPrecondition) {
		t.Fatalf("retry of a finished task: %v", err)
	}
	if err := b.RetryCallback(42); !errors.Is(err, broadcast.ErrNotFound) {
		t.Fatalf("retry of an unknown task: %v", err)
	}
}

// TestR5_5_AckOnceFailureKeepsAckRetryable.
func TestR5_5_AckOnceFailureKeepsAckRetryable(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	e.mu.Lock()
	e.onceErr = 2
	e.mu.Unlock()
	res, err := do(ctx, b, msgOf(t, typOnce, "p", []message.VChannel{vch(1, "a"), vch(2, "b")}), resource.ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	runs := e.onceRuns
	e.mu.Unlock()
	// Three copies acked once each, plus the two injected failures retried.
	if runs != 5 || len(res.Appends) != 3 {
		t.Fatalf("ack-once callback ran %d times, results %v", runs, res.Appends)
	}
}

// TestR5_1_TypeWithoutCallbackCompletes: a type with no registered callback
// completes as soon as every copy is acked (nothing to call).
func TestR5_1_TypeWithoutCallbackCompletes(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	res, err := do(ctx, b, msgOf(t, typPlain, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c"))
	if err != nil || res.Outcome.Status != broadcast.Succeeded {
		t.Fatalf("%+v, %v", res, err)
	}
}

// TestR5_1_CallbackGetsMessageAndAllResults: a typed callback registered for
// a type receives the stamped message with its payload decoded, and the
// append result of every target vchannel, the control channel's included,
// the same results Broadcast returns.
func TestR5_1_CallbackGetsMessageAndAllResults(t *testing.T) {
	type createIndex struct {
		Collection string
		Field      string
	}
	typIndex := message.Type{Name: "CreateIndex", Version: 2}
	e := newEnv(t)
	e.types.MustRegister(message.TypeInfo{Type: typIndex})
	type seen struct {
		payload createIndex
		msg     *message.Message
		results map[message.VChannel]wal.Checkpoint
		attempt int
		effects bool
	}
	got := make(chan seen, 4)
	if err := broadcast.OnAck(e.cbs, typIndex, broadcast.JSON[createIndex](), func(_ context.Context, ev *broadcast.TypedEvent[createIndex]) error {
		got <- seen{payload: ev.Payload, msg: ev.Message, results: ev.Results.Map(), attempt: ev.Attempt, effects: ev.Effects != nil}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	targets := []message.VChannel{vch(1, "c1v0"), vch(2, "c1v1"), vch(0, "c1v2")}
	payload := `{"Collection":"db:c1","Field":"vec"}`
	res, err := do(ctx, b, msgOf(t, typIndex, payload, targets, message.WithProperty("k", "v")), resource.ExclusiveCollection("db", "c1"))
	if err != nil {
		t.Fatal(err)
	}
	var ev seen
	select {
	case ev = <-got:
	default:
		t.Fatal("Broadcast returned without calling the type's callback")
	}
	if len(got) != 0 {
		t.Fatal("callback called more than once")
	}
	if ev.payload != (createIndex{Collection: "db:c1", Field: "vec"}) {
		t.Fatalf("decoded payload %+v", ev.payload)
	}
	m := ev.msg
	if m == nil || m.Type != typIndex || m.Broadcast.ID != res.BroadcastID || string(m.Payload) != payload || m.Properties["k"] != "v" {
		t.Fatalf("callback message %+v, broadcast %d", m, res.BroadcastID)
	}
	if want := append(slices.Clone(targets), cchan); !slices.Equal(m.Broadcast.VChannels, want) {
		t.Fatalf("callback message targets %v, want %v", m.Broadcast.VChannels, want)
	}
	if !slices.Contains(m.Broadcast.ResourceKeys, resource.ExclusiveCollection("db", "c1")) ||
		!slices.Contains(m.Broadcast.ResourceKeys, resource.SharedCluster()) {
		t.Fatalf("callback message keys %v", m.Broadcast.ResourceKeys)
	}
	if ev.attempt != 1 || !ev.effects {
		t.Fatalf("attempt %d, effects %v", ev.attempt, ev.effects)
	}
	if len(ev.results) != len(targets)+1 {
		t.Fatalf("callback results %v, want %d targets + control channel", ev.results, len(targets))
	}
	cc, ok := ev.results[cchan]
	if !ok || cc.MessageID == 0 || cc.TimeTick == 0 {
		t.Fatalf("control channel result %+v (present %v)", cc, ok)
	}
	for _, v := range append(targets, cchan) {
		if cp, ok := ev.results[v]; !ok || cp != res.Appends.Map()[v] || cp.TimeTick == 0 {
			t.Errorf("%s: callback got %+v (present %v), Broadcast returned %+v", v, cp, ok, res.Appends.Map()[v])
		}
	}
	// Other types' callbacks were not called for this one.
	if calls := e.callsCopy(); len(calls) != 0 {
		t.Fatalf("callbacks of other types ran: %+v", calls)
	}
}

// TestR4_7_CloseLeavesNoGoroutines: Close with broadcasts in every stage
// returns promptly (goleak checks the rest in TestMain).
func TestR4_7_CloseLeavesNoGoroutines(t *testing.T) {
	e := newEnv(t)
	e.log.SetHook(func(p message.PChannel, _ []byte) wmem.Fault {
		if p == "wal-3" {
			return wmem.Fault{Hang: true}
		}
		return wmem.Fault{}
	})
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	e.mu.Lock()
	e.block[2] = make(chan struct{}) // never released
	e.mu.Unlock()
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			_, _ = do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(i%4, "a")}), resource.ExclusiveCollection("db", itoa(uint64(i))))
		})
	}
	waitFor(t, "every broadcast to be persisted", func() bool { return len(e.store.Keys("walcast/tasks/")) == 6 })
	start := time.Now()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %v", d)
	}
	wg.Wait()
}

// TestR2_3_UnknownPChannelRefused: a target on a pchannel the cluster does
// not have is bad input, refused before anything is persisted.
func TestR2_3_UnknownPChannelRefused(t *testing.T) {
	e := newEnv(t)
	b := e.open(func(c *broadcast.Config) { c.PChannels = pchans })
	ctx := ctxT(t, 10*time.Second)
	m := msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a"), "wal-9/x"})
	if err := b.Check(m); !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("Check: %v", err)
	}
	if _, err := do(ctx, b, m, resource.ExclusiveCollection("db", "c")); !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("Broadcast: %v", err)
	}
	if e.store.Applied() != 0 || e.log.Appends() != 0 {
		t.Fatal("refused broadcast wrote something")
	}
	if _, err := e.tryOpen(func(c *broadcast.Config) { c.PChannels = []message.PChannel{"wal-1"} }); !errors.Is(err, broadcast.ErrInvalidConfig) {
		t.Fatalf("control channel outside PChannels: %v", err)
	}
}

// TestR2_3_UnknownPChannelRefusedByTheWAL: without Config.PChannels, a
// target on a pchannel the WAL does not have is still bad input, refused
// with ErrInvalidArgument before anything is persisted or appended, and its
// keys are free at once (before, the task was created and its append
// retried for ever, holding them). With lanes the WAL's lane map decides;
// without, the backend. A WAL that cannot tell now refuses the broadcast as
// not created, to be retried.
func TestR2_3_UnknownPChannelRefusedByTheWAL(t *testing.T) {
	for _, lanes := range []int{0, 2} {
		t.Run(fmt.Sprint("lanes=", lanes), func(t *testing.T) {
			e := newEnvLanes(t, lanes)
			b := e.open()
			ctx := ctxT(t, 10*time.Second)
			key := resource.ExclusiveCollection("db", "c")
			m := msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a"), "wal-9/x"})
			if err := b.Check(m); !errors.Is(err, broadcast.ErrInvalidArgument) || !errors.Is(err, wal.ErrUnknownPChannel) {
				t.Fatalf("Check: %v", err)
			}
			if _, err := do(ctx, b, m, key); !errors.Is(err, broadcast.ErrInvalidArgument) || !errors.Is(err, wal.ErrUnknownPChannel) {
				t.Fatalf("Broadcast: %v", err)
			}
			if e.store.Applied() != 0 || e.log.Appends() != 0 {
				t.Fatal("refused broadcast wrote something")
			}
			h, err := b.TryWithResourceKeys(ctx, key)
			if err != nil {
				t.Fatalf("the refused broadcast's key is still held: %v", err)
			}
			res, err := h.Broadcast(ctx, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}))
			h.Close()
			if err != nil || res.BroadcastID == 0 {
				t.Fatalf("a good broadcast on the key: %v", err)
			}
		})
	}
	t.Run("cannot tell", func(t *testing.T) {
		e := newEnv(t)
		b := e.open(func(c *broadcast.Config) { c.WAL = wal.New(endFails{e.log}) })
		m := msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")})
		if _, err := do(ctxT(t, 10*time.Second), b, m, resource.ExclusiveCollection("db", "c")); !broadcast.IsTaskNotCreated(err) {
			t.Fatalf("Broadcast with a WAL that cannot tell: %v", err)
		}
		if e.store.Applied() != 0 || e.log.Appends() != 0 {
			t.Fatal("refused broadcast wrote something")
		}
	})
}

// endFails is a WAL backend whose End fails as if unreachable.
type endFails struct{ *wmem.Log }

func (endFails) End(context.Context, message.PChannel) (uint64, error) {
	return 0, errors.New("backend unreachable")
}

// TestR6_4_RetentionClassesBounded: more than MaxRetentionClasses classes
// is a configuration error, said as such, not a broadcaster whose
// tombstones mix up their classes.
func TestR6_4_RetentionClassesBounded(t *testing.T) {
	e := newEnv(t)
	if _, err := e.tryOpen(func(c *broadcast.Config) {
		for i := range broadcast.MaxRetentionClasses + 1 {
			typ := message.Type{Name: fmt.Sprint("T", i), Version: 1}
			c.Tombstone.Classes = append(c.Tombstone.Classes, broadcast.RetentionClass{Name: fmt.Sprint("c", i), Types: []message.Type{typ}})
		}
	}); !errors.Is(err, broadcast.ErrInvalidConfig) || !strings.Contains(err.Error(), "more than 1024") {
		t.Fatalf("%d retention classes: %v", broadcast.MaxRetentionClasses+1, err)
	}
}

// TestR9_5_TasksPageByCursor: Tasks pages through tasks newest first with an
// id cursor, live and tombstoned alike.
func TestR9_5_TasksPageByCursor(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	var ids []uint64
	for i := range 5 {
		res, err := do(ctx, b, msgOf(t, typCreate, fmt.Sprint("p", i), []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c"))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.BroadcastID)
	}
	var got []uint64
	cursor := uint64(0)
	for {
		page, err := b.Tasks(broadcast.Filter{Newest: true, Limit: 2, BeforeID: cursor})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		if len(page) > 2 {
			t.Fatalf("page of %d, limit 2", len(page))
		}
		for _, ti := range page {
			got = append(got, ti.ID)
		}
		cursor = page[len(page)-1].ID
	}
	want := slices.Clone(ids)
	slices.Reverse(want)
	if !slices.Equal(got, want) {
		t.Fatalf("pages gave %v, want %v", got, want)
	}
	asc, err := b.Tasks(broadcast.Filter{AfterID: ids[1], Limit: 2})
	if err != nil || len(asc) != 2 || asc[0].ID != ids[2] || asc[1].ID != ids[3] {
		t.Fatalf("ascending after %d: %+v, %v", ids[1], asc, err)
	}
}

// TestR4_6_DeadlineSaysWhatTheBroadcastWaitsFor: a caller whose context
// ends while its broadcast waits for a hung catalog write or a hung WAL
// append gets the deadline error (errors.Is finds it) naming the broadcast
// and what it was waiting for (issue 16: a frozen backend).
func TestR4_6_DeadlineSaysWhatTheBroadcastWaitsFor(t *testing.T) {
	for _, c := range []struct {
		name, want string
		hang       func(e *env)
	}{
		{"catalog, ids", "waiting for the catalog to allocate the broadcast's id", func(e *env) { e.store.FailNext(1, cmem.Hang) }},
		{"catalog, PENDING", "was waiting for the catalog to write its PENDING record", func(e *env) {
			e.store.FailNext(1, cmem.None)
			e.store.FailNext(1, cmem.Hang)
		}},
		{"wal", "was waiting for the WAL to append its copies", func(e *env) { e.log.FailNext("wal-1", 1, wmem.Fault{Hang: true}) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			b := e.open()
			c.hang(e)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c"))
			named := strings.Contains(err.Error(), "broadcast 1 ") || c.name == "catalog, ids"
			if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), c.want) || !named {
				t.Fatalf("got %v, want the deadline error naming broadcast 1 and %q", err, c.want)
			}
		})
	}
}

// TestDriverKeepsEachCallersOrder: a caller's requests reach the core in the
// order it made them, whether the caller steps the core itself or the loop
// does. A closed handle's keys are free for the same goroutine's next
// NoWait acquire, while other goroutines' broadcasts keep the loop busy
// (so some requests go through it and some do not).
func TestDriverKeepsEachCallersOrder(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 20*time.Second)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				m := msgOf(t, typCreate, "p", []message.VChannel{vch(i, "load")})
				if _, err := do(ctx, b, m, resource.ExclusiveCollection("load", fmt.Sprint(i, "-", n))); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	key := resource.ExclusiveCollection("db", "order")
	for i := range 2000 {
		h, err := b.TryWithResourceKeys(ctx, key)
		if err != nil {
			t.Fatalf("acquire %d after the previous handle's Close: %v", i, err)
		}
		h.Close()
	}
}
