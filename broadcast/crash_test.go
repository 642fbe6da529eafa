package broadcast_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/broadcast/internal/crash"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/durablepb"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// commitKind classifies a broadcaster commit by what it writes.
func commitKind(ops []catalog.Op) string {
	k := ops[0].Key
	switch {
	case strings.HasPrefix(k, "walcast/ids/"):
		return "ids"
	case strings.HasPrefix(k, "walcast/promote/"):
		return "promote"
	case ops[0].Delete:
		return "gc"
	case strings.HasPrefix(k, "walcast/tasks/"):
		var pb durablepb.Task
		if err := proto.Unmarshal(ops[0].Value, &pb); err != nil {
			return "?"
		}
		switch pb.State {
		case durablepb.TaskState_TASK_STATE_PENDING:
			return "pending"
		case durablepb.TaskState_TASK_STATE_TOMBSTONE:
			return "tombstone"
		case durablepb.TaskState_TASK_STATE_REPLICATED:
			return "ack"
		}
	}
	return "?"
}

// crashPoint names where a process dies.
type crashPoint struct {
	name string
	// nth is the occurrence (1-based) of the matching call to crash at.
	nth int
	// catalog/log choose the crash; nil passes.
	catalog  func(kind string) crash.Action
	log      func() crash.Action
	callback bool // crash inside the nth callback
}

// TestR4_8_CrashPoints crashes a broadcaster at each named point of a
// broadcast's life by abandoning it (its catalog and WAL calls fail from then
// on, as a dead process's), recovers a new one from the same catalog and
// WAL, and checks SPEC §11: every persisted task completes, every target
// vchannel has its copy, every callback effect is applied exactly once, no
// key is left held, no goroutine is left (goleak in TestMain).
func TestR4_8_CrashPoints(t *testing.T) {
	for _, pt := range crashPoints {
		t.Run(pt.name, func(t *testing.T) { runCrashPoint(t, pt) })
	}
}

// TestR4_8_CrashPointsOnLanes runs the crash points with every pchannel
// folded into one WAL lane, where one entry carries copies for several
// pchannels.
func TestR4_8_CrashPointsOnLanes(t *testing.T) {
	for _, pt := range crashPoints {
		t.Run(pt.name, func(t *testing.T) { runCrashPointOn(t, newEnvLanes(t, 1), pt) })
	}
}

var crashPoints = []crashPoint{
	{name: "after-pending-commit", nth: 2, catalog: on("pending", crash.After)},
	{name: "pending-commit-lost", nth: 1, catalog: on("pending", crash.Before)},
	{name: "between-copies-of-one-round", nth: 1, log: func() crash.Action { return crash.After }},
	{name: "after-append-before-ack-persisted", nth: 6, log: func() crash.Action { return crash.After }},
	{name: "inside-callback", nth: 2, callback: true},
	{name: "after-callback-before-tombstone", nth: 2, catalog: on("tombstone", crash.Before)},
	{name: "tombstone-applied-answer-lost", nth: 2, catalog: on("tombstone", crash.After)},
	{name: "during-gc", nth: 1, catalog: on("gc", crash.After)},
	{name: "before-gc", nth: 1, catalog: on("gc", crash.Before)},
	{name: "id-block-reservation", nth: 1, catalog: on("ids", crash.After)},
}

func on(kind string, a crash.Action) func(string) crash.Action {
	return func(k string) crash.Action {
		if k == kind {
			return a
		}
		return crash.Pass
	}
}

func runCrashPoint(t *testing.T, pt crashPoint) { runCrashPointOn(t, newEnv(t), pt) }

func runCrashPointOn(t *testing.T, e *env, pt crashPoint) {
	if e.lanes > 0 && pt.log != nil {
		// One lane packs the six broadcasts into fewer entries.
		pt.nth = min(pt.nth, 2)
	}
	sw := crash.NewSwitch()
	var catHits, logHits, cbHits atomic.Int32
	crashCat := func(c *broadcast.Config) {
		c.Catalog = &crash.Catalog{Catalog: c.Catalog, S: sw, Hook: func(ops []catalog.Op) crash.Action {
			if pt.catalog == nil {
				return crash.Pass
			}
			a := pt.catalog(commitKind(ops))
			if a != crash.Pass && int(catHits.Add(1)) != pt.nth {
				return crash.Pass
			}
			return a
		}}
		c.WAL = wal.New(&crash.Log{Log: e.be.log(), S: sw, Hook: func(message.PChannel, []byte) crash.Action {
			if pt.log == nil || int(logHits.Add(1)) != pt.nth {
				return crash.Pass
			}
			return pt.log()
		}}, wal.WithLanes(e.lanes, pchans))
		// GC keeps at most two tombstones, so the GC points are reached.
		c.Tombstone.MaxCount = 2
	}
	if pt.callback {
		typ := message.Type{Name: "CrashInCallback", Version: 1}
		e.types.MustRegister(message.TypeInfo{Type: typ})
		_ = broadcast.OnAck(e.cbs, typ, broadcast.Raw(), func(ctx context.Context, ev *broadcast.TypedEvent[[]byte]) error {
			if int(cbHits.Add(1)) == pt.nth {
				sw.Crash()
			}
			return e.callback(ctx, ev.Event)
		})
	}
	b1 := e.open(crashCat)
	typ := typCreate
	if pt.callback {
		typ = message.Type{Name: "CrashInCallback", Version: 1}
	}
	// Six broadcasts: pairs conflict on a collection, each spans pchannels.
	ctx := ctxT(t, 20*time.Second)
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			targets := []message.VChannel{vch(1+i%3, fmt.Sprintf("c%dv0", i)), vch((2+i)%4, fmt.Sprintf("c%dv1", i))}
			_, _ = do(ctx, b1, msgOf(t, typ, fmt.Sprint("p", i), targets), resource.SharedDatabase("db"), resource.ExclusiveCollection("db", fmt.Sprint("c", i/2)))
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-sw.Crashed():
	case <-done:
		// Every broadcast finished first; GC points are reached after.
		select {
		case <-sw.Crashed():
		case <-time.After(5 * time.Second):
			t.Fatalf("crash point %s was never reached", pt.name)
		}
	}
	if err := b1.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	// What the dead process left durable, each record read with its key:
	// a commit the process had in flight when it died may still land (a
	// GC delete of a TOMBSTONE, say), so a key listed first may be gone
	// when read after.
	persisted := map[uint64][]message.VChannel{}
	if err := e.cat.List(context.Background(), "walcast/tasks/", func(_ string, v []byte) error {
		var pb durablepb.Task
		if err := proto.Unmarshal(v, &pb); err != nil {
			return err
		}
		m, err := message.Unmarshal(pb.Message)
		if err != nil {
			return err
		}
		persisted[m.Broadcast.ID] = m.Broadcast.VChannels
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b2 := e.open(func(c *broadcast.Config) { c.Tombstone.MaxCount = 2 })
	e.checkInvariants(b2, persisted)
	// Effects of tasks already deleted by GC are still exactly once.
	for id, n := range e.effects() {
		if n != 1 {
			t.Errorf("broadcast %d: effect applied %d times", id, n)
		}
	}
	conflictOrder(t, e.callsCopy())
	// A new broadcast works on the recovered instance, on a conflicting key.
	if _, err := do(ctx, b2, msgOf(t, typCreate, "after", []message.VChannel{vch(1, "z")}), resource.ExclusiveCollection("db", "c0")); err != nil {
		t.Fatal(err)
	}
}

// TestR4_8_RecoveredTombstonesKeepTheirAge: a tombstone's age counts from its
// persisted completion time, so a restart does not extend it (R6.3).
func TestR4_8_RecoveredTombstonesKeepTheirAge(t *testing.T) {
	e := newEnv(t)
	now := newManualClock()
	clock := func(c *broadcast.Config) {
		c.Clock = now
		c.Tombstone.MaxLifetime = time.Hour
		c.Tombstone.CheckInterval = time.Hour
	}
	b := e.open(clock)
	ctx := ctxT(t, 10*time.Second)
	res, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}, message.WithIdempotencyKey(message.ClusterKey("k"))), resource.ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	latest := res.Window.ExpiresLatest
	if !latest.Equal(now.Now().Add(time.Hour)) {
		t.Fatalf("window %+v", res.Window)
	}
	_ = b.Close()
	now.Add(50 * time.Minute)
	b = e.open(clock)
	st, err := b.Lookup(ctx, typCreate, message.ClusterKey("k"))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Window.ExpiresLatest.Equal(latest) {
		t.Fatalf("restart moved the window's end from %v to %v", latest, st.Window.ExpiresLatest)
	}
	_ = b.Close()
	now.Add(11 * time.Minute) // 61 minutes after completion
	b = e.open(clock)
	waitFor(t, "GC of the expired tombstone", func() bool { return b.Stats().Tombstones == 0 })
	if _, err := b.Lookup(ctx, typCreate, message.ClusterKey("k")); err == nil {
		t.Fatal("expired key still found")
	}
	if st := b.Stats(); st.Evicted != 1 || st.EarlyEvicted != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestR6_1_MaxCountEvictsOldestAndCountsEarly.
func TestR6_1_MaxCountEvictsOldestAndCountsEarly(t *testing.T) {
	e := newEnv(t)
	b := e.open(func(c *broadcast.Config) { c.Tombstone.MaxCount = 3 })
	ctx := ctxT(t, 10*time.Second)
	var ids []uint64
	for i := range 5 {
		res, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}, message.WithIdempotencyKey(message.ClusterKey(fmt.Sprint("k", i)))), resource.ExclusiveCollection("db", "c"))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.BroadcastID)
	}
	waitFor(t, "GC down to MaxCount", func() bool { return b.Stats().Tombstones == 3 })
	for i, id := range ids {
		_, err := b.Task(id)
		if (i < 2) != (err != nil) {
			t.Errorf("tombstone %d (%d): %v", i, id, err)
		}
	}
	if st := b.Stats(); st.EarlyEvicted != 2 {
		t.Fatalf("early evictions %d, want 2", st.EarlyEvicted)
	}
	// The keys of evicted tombstones are forgotten together with them (R6.2).
	if _, err := b.Lookup(ctx, typCreate, message.ClusterKey("k0")); err == nil {
		t.Fatal("evicted key still indexed")
	}
	st, err := b.Lookup(ctx, typCreate, message.ClusterKey("k2"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Window.CountHeadroom != 0 {
		t.Fatalf("oldest kept tombstone has headroom %d, want 0", st.Window.CountHeadroom)
	}
	if n := len(e.store.Keys("walcast/tasks/")); n != 3 {
		t.Fatalf("%d task records in the catalog, want 3", n)
	}
}

// TestR6_2_FailedGCKeepsIndex: a GC delete that fails leaves the tombstone and
// its index entry in place; a later run deletes both.
func TestR6_2_FailedGCKeepsIndex(t *testing.T) {
	e := newEnv(t)
	var failGC atomic.Bool
	var gcFailed atomic.Int32
	failGC.Store(true)
	b := e.open(func(c *broadcast.Config) {
		c.Tombstone.MaxCount = 1
		c.Catalog = &crash.Catalog{Catalog: c.Catalog, S: crash.NewSwitch(), Hook: func(ops []catalog.Op) crash.Action { return crash.Pass }}
		inner := c.Catalog
		c.Catalog = failing{Catalog: inner, fail: func(ops []catalog.Op) bool {
			fail := failGC.Load() && commitKind(ops) == "gc"
			if fail {
				gcFailed.Add(1)
			}
			return fail
		}}
	})
	ctx := ctxT(t, 10*time.Second)
	for i := range 2 {
		if _, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}, message.WithIdempotencyKey(message.ClusterKey(fmt.Sprint("k", i)))), resource.ExclusiveCollection("db", "c")); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "a GC delete to fail", func() bool { return gcFailed.Load() > 0 })
	if _, err := b.Lookup(ctx, typCreate, message.ClusterKey("k0")); err != nil {
		t.Fatalf("index entry retired although the delete failed: %v", err)
	}
	failGC.Store(false)
	if _, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "GC after the failure", func() bool { return b.Stats().Tombstones == 1 })
	if _, err := b.Lookup(ctx, typCreate, message.ClusterKey("k0")); err == nil {
		t.Fatal("key of a deleted tombstone still indexed")
	}
}

// failing is a catalog whose Commit fails definitely when fail says so.
type failing struct {
	catalog.Catalog
	fail func([]catalog.Op) bool
}

func (f failing) Commit(ctx context.Context, ops ...catalog.Op) error {
	if f.fail(ops) {
		return fmt.Errorf("%w: injected", catalog.ErrNotApplied)
	}
	return f.Catalog.Commit(ctx, ops...)
}

// TestR6_1_GCDeletesInBatches: count-evictions are deleted many per catalog
// commit, and never more than MaxCount/16 past MaxCount wait.
func TestR6_1_GCDeletesInBatches(t *testing.T) {
	e := newEnv(t)
	var gcCommits atomic.Int32
	b := e.open(func(c *broadcast.Config) {
		c.Tombstone.MaxCount = 160 // batches of 10
		c.Catalog = failing{Catalog: c.Catalog, fail: func(ops []catalog.Op) bool {
			if commitKind(ops) == "gc" {
				gcCommits.Add(1)
			}
			return false
		}}
	})
	ctx := ctxT(t, 20*time.Second)
	for range 200 {
		if _, err := do(ctx, b, msgOf(t, typPlain, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c")); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "GC", func() bool { return b.Stats().Evicted >= 30 })
	st := b.Stats()
	if st.Tombstones > 160+10 || st.Tombstones < 160 {
		t.Fatalf("%d tombstones kept with MaxCount 160", st.Tombstones)
	}
	if n := int(gcCommits.Load()); n > st.Evicted/5 {
		t.Fatalf("%d GC commits for %d evictions: not batched", n, st.Evicted)
	}
}

// TestR4_8_RecoveredAckSyncUpReachesConsumersAgain: an AckSyncUp task's
// consumer acks are answered once written into its record (durableAcks).
// A coordinator that crashes while writing them answered nothing: the
// recovered task's copies are appended again as new entries (not
// deduplicated into the old ones by the WAL), so consumers see them and ack
// again, and the task completes. One that crashes after them, before the
// TOMBSTONE, recovers the acks: the task completes without new ones.
func TestR4_8_RecoveredAckSyncUpReachesConsumersAgain(t *testing.T) {
	for _, tc := range []struct {
		name      string
		crashAt   func(kind string, pendings int) bool
		reAppends bool
	}{
		{"crash writing the acks", func(kind string, pendings int) bool { return kind == "pending" && pendings == 2 }, true},
		{"crash writing the tombstone", func(kind string, _ int) bool { return kind == "tombstone" }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			sw := crash.NewSwitch()
			var mu sync.Mutex
			pendings := 0
			b := e.open(func(c *broadcast.Config) {
				c.Catalog = &crash.Catalog{Catalog: c.Catalog, S: sw, Hook: func(ops []catalog.Op) crash.Action {
					mu.Lock()
					defer mu.Unlock()
					kind := commitKind(ops)
					if kind == "pending" {
						pendings++
					}
					if tc.crashAt(kind, pendings) {
						return crash.Before
					}
					return crash.Pass
				}}
			})
			ctx := ctxT(t, 10*time.Second)
			targets := []message.VChannel{vch(1, "a")}
			go func() { _, _ = do(ctx, b, msgOf(t, typSync, "p", targets), resource.ExclusiveCollection("db", "c")) }()
			var id uint64
			waitFor(t, "the appended task", func() bool {
				ts, _ := b.Tasks(broadcast.Filter{States: []broadcast.State{broadcast.Pending}})
				if len(ts) == 1 && ts[0].VChannels[0].Appended && ts[0].VChannels[1].Appended {
					id = ts[0].ID
					return true
				}
				return false
			})
			acked := 0
			for _, v := range append(targets, cchan) {
				// An ack whose write crashed is not answered: the crashed
				// catalog fails every retry of it until Close.
				actx, cancel := context.WithTimeout(ctx, time.Second)
				err := b.Ack(actx, broadcast.Ack{BroadcastID: id, VChannel: v})
				cancel()
				if err == nil {
					acked++
				} else if !tc.reAppends {
					t.Fatal(err)
				}
			}
			if tc.reAppends && acked != 0 {
				t.Fatalf("%d acks answered although their write crashed", acked)
			}
			<-sw.Crashed()
			_ = b.Close()
			before := len(e.log.Entries("wal-1"))
			b = e.open()
			if tc.reAppends {
				waitFor(t, "the re-append", func() bool { return len(e.log.Entries("wal-1")) > before })
				for _, v := range append(targets, cchan) {
					if err := b.Ack(ctx, broadcast.Ack{BroadcastID: id, VChannel: v}); err != nil {
						t.Fatal(err)
					}
				}
			}
			waitIdle(t, b)
			if e.effects()[id] != 1 {
				t.Fatal("effect not applied once")
			}
			if !tc.reAppends && len(e.log.Entries("wal-1")) != before {
				t.Fatal("copies appended again although their acks were recovered")
			}
		})
	}
}

// TestR6_1_LongRunKeepsNewestTombstonesFindable: after many more evictions
// than MaxCount (the collector's order compacts several times), exactly the
// newest tombstones are kept, each found by id and by key with its own
// record, headroom counts down from the newest, and evicted ones are gone
// with their keys (R6.1, R6.2, R7.7).
func TestR6_1_LongRunKeepsNewestTombstonesFindable(t *testing.T) {
	const maxCount, total = 64, 2600
	e := newEnv(t)
	b := e.open(func(c *broadcast.Config) {
		c.Tombstone.MaxCount = maxCount
		c.Tombstone.CheckInterval = 10 * time.Millisecond // collects the last partial batch
	})
	ctx := ctxT(t, 60*time.Second)
	ids := make([]uint64, total)
	for i := range total {
		k := message.ClusterKey(fmt.Sprint("k", i))
		res, err := do(ctx, b, msgOf(t, typCreate, fmt.Sprint("p", i), []message.VChannel{vch(1, "a")}, message.WithIdempotencyKey(k)), resource.ExclusiveCollection("db", "c"))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = res.BroadcastID
		// The newest MaxCount are never evicted, whatever GC is doing: each
		// is found with its own record and its rank among the newest.
		for _, back := range []int{0, 1, maxCount / 2, maxCount - 1} {
			if j := i - back; j >= 0 {
				checkKept(ctx, t, b, ids[j], j, maxCount-1-back)
			}
		}
	}
	waitFor(t, "GC down to MaxCount", func() bool { return b.Stats().Tombstones == maxCount })
	if st := b.Stats(); st.Evicted != total-maxCount {
		t.Fatalf("evicted %d, want %d", st.Evicted, total-maxCount)
	}
	for i, id := range ids {
		if i < total-maxCount {
			_, errTask := b.Task(id)
			_, errKey := b.Lookup(ctx, typCreate, message.ClusterKey(fmt.Sprint("k", i)))
			if errTask == nil || errKey == nil {
				t.Fatalf("evicted tombstone %d (%d) still found: %v %v", i, id, errTask, errKey)
			}
			continue
		}
		checkKept(ctx, t, b, id, i, i-(total-maxCount))
	}
	if n := len(e.store.Keys("walcast/tasks/")); n != maxCount {
		t.Fatalf("%d task records in the catalog, want %d", n, maxCount)
	}
}

// checkKept asserts that tombstone id, the i-th broadcast of
// TestR6_1_LongRunKeepsNewestTombstonesFindable, is found by id and key with
// its own record and the given count headroom.
func checkKept(ctx context.Context, t *testing.T, b *broadcast.Broadcaster, id uint64, i, headroom int) {
	t.Helper()
	ti, err := b.Task(id)
	if err != nil {
		t.Fatalf("kept tombstone %d (%d): %v", i, id, err)
	}
	if ti.ID != id || ti.State != broadcast.Tombstone || string(ti.Message.Payload) != fmt.Sprint("p", i) {
		t.Fatalf("tombstone %d: got id %d state %v payload %q", id, ti.ID, ti.State, ti.Message.Payload)
	}
	ks, err := b.Lookup(ctx, typCreate, message.ClusterKey(fmt.Sprint("k", i)))
	if err != nil {
		t.Fatalf("key of kept tombstone %d: %v", i, err)
	}
	if ks.BroadcastID != id || ks.Window.CountHeadroom != headroom {
		t.Fatalf("key k%d: broadcast %d headroom %d, want %d headroom %d", i, ks.BroadcastID, ks.Window.CountHeadroom, id, headroom)
	}
}
