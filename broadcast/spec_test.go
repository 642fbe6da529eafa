package broadcast_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/durablepb"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// TestR2_4_CheckpointsAndTimeTicks: a broadcast's result gives every target
// vchannel, the control channel included, a checkpoint {message id, time
// tick, last confirmed}; time ticks strictly increase per pchannel across
// broadcasts and across a restart of the broadcaster on the same catalog and
// WAL, and a reader of each pchannel sees the copies in that order at exactly
// those checkpoints. With one pchannel per backend channel and with every
// pchannel folded into one lane.
func TestR2_4_CheckpointsAndTimeTicks(t *testing.T) {
	for _, lanes := range []int{0, 1} {
		t.Run(fmt.Sprint("lanes=", lanes), func(t *testing.T) {
			e := newEnvLanes(t, lanes)
			ctx := ctxT(t, 20*time.Second)
			type landed struct {
				id uint64
				v  message.VChannel
			}
			results := map[landed]wal.Checkpoint{}
			last := map[message.PChannel]uint64{} // highest tick seen per pchannel so far
			run := func(b *broadcast.Broadcaster, round int) {
				t.Helper()
				for i := range 6 {
					name := fmt.Sprint("r", round, "i", i)
					// Two vchannels on one pchannel, one on the control
					// channel's pchannel, and one elsewhere.
					targets := []message.VChannel{vch(1+i%3, name+"a"), vch(1+i%3, name+"b"), vch(0, name+"c"), vch(1+(i+1)%3, name+"d")}
					res, err := do(ctx, b, msgOf(t, typCreate, name, targets), resource.ExclusiveCollection("db", "c"))
					if err != nil {
						t.Fatal(err)
					}
					if len(res.Appends) != len(targets)+1 {
						t.Fatalf("broadcast %d: results %v, want %d targets + control channel", res.BroadcastID, res.Appends, len(targets))
					}
					ticks := map[message.PChannel][]uint64{}
					for _, v := range append(targets, cchan) {
						cp, ok := res.Appends.Map()[v]
						if !ok {
							t.Fatalf("broadcast %d: no result for %s", res.BroadcastID, v)
						}
						if cp.MessageID == 0 || cp.TimeTick == 0 || cp.LastConfirmed == 0 {
							t.Fatalf("broadcast %d: incomplete checkpoint %+v for %s", res.BroadcastID, cp, v)
						}
						if cp.LastConfirmed > cp.MessageID {
							t.Fatalf("broadcast %d: %s last confirmed %d beyond its own message id %d", res.BroadcastID, v, cp.LastConfirmed, cp.MessageID)
						}
						results[landed{res.BroadcastID, v}] = cp
						ticks[v.PChannel()] = append(ticks[v.PChannel()], cp.TimeTick)
					}
					// Copies of one broadcast on one pchannel get distinct
					// ticks, all above every earlier broadcast's there.
					for p, ts := range ticks {
						slices.Sort(ts)
						if len(slices.Compact(slices.Clone(ts))) != len(ts) {
							t.Fatalf("broadcast %d: repeated tick on %s: %v", res.BroadcastID, p, ts)
						}
						if ts[0] <= last[p] {
							t.Fatalf("broadcast %d (round %d): tick %d on %s not above the earlier %d", res.BroadcastID, round, ts[0], p, last[p])
						}
						last[p] = ts[len(ts)-1]
					}
				}
			}
			b := e.open()
			run(b, 0)
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			run(e.open(), 1) // a restarted broadcaster continues above the old ticks

			// Readers see every copy in tick order, at its result's checkpoint.
			w := wal.New(e.log, wal.WithLanes(lanes, pchans))
			found := 0
			for _, p := range pchans {
				var prev uint64
				err := w.ReadToEnd(ctx, p, 0, func(c wal.Copy) error {
					if c.VChannel.PChannel() != p {
						return fmt.Errorf("reader of %s got a copy for %s", p, c.VChannel)
					}
					if c.Checkpoint.TimeTick <= prev {
						return fmt.Errorf("%s: reader order has tick %d after %d", p, c.Checkpoint.TimeTick, prev)
					}
					prev = c.Checkpoint.TimeTick
					want, ok := results[landed{c.Message.Broadcast.ID, c.VChannel}]
					if !ok {
						return fmt.Errorf("%s: copy of broadcast %d for %s was never reported", p, c.Message.Broadcast.ID, c.VChannel)
					}
					if c.Checkpoint != want {
						return fmt.Errorf("%s: broadcast %d read at %+v, reported at %+v", c.VChannel, c.Message.Broadcast.ID, c.Checkpoint, want)
					}
					found++
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			if found != len(results) {
				t.Fatalf("readers found %d copies, results reported %d", found, len(results))
			}
		})
	}
}

// stateRecorder is a catalog that records, per task, the state of every task
// record a successful commit wrote ("deleted" for a delete).
type stateRecorder struct {
	catalog.Catalog
	mu     sync.Mutex
	states map[uint64][]string
	errs   []string
}

func newStateRecorder(c catalog.Catalog) *stateRecorder {
	return &stateRecorder{Catalog: c, states: map[uint64][]string{}}
}

func (r *stateRecorder) Commit(ctx context.Context, ops ...catalog.Op) error {
	if err := r.Catalog.Commit(ctx, ops...); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, op := range ops {
		rest, ok := strings.CutPrefix(op.Key, "walcast/tasks/")
		if !ok {
			continue
		}
		id, err := strconv.ParseUint(rest, 10, 64)
		if err != nil {
			r.errs = append(r.errs, fmt.Sprintf("task key %q: %v", op.Key, err))
			continue
		}
		if op.Delete {
			r.states[id] = append(r.states[id], "deleted")
			continue
		}
		var pb durablepb.Task
		if err := proto.Unmarshal(op.Value, &pb); err != nil {
			r.errs = append(r.errs, fmt.Sprintf("task record %d: %v", id, err))
			continue
		}
		r.states[id] = append(r.states[id], strings.TrimPrefix(pb.State.String(), "TASK_STATE_"))
	}
	return nil
}

func (r *stateRecorder) snapshot() (map[uint64][]string, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[uint64][]string, len(r.states))
	for id, s := range r.states {
		out[id] = slices.Clone(s)
	}
	return out, slices.Clone(r.errs)
}

// transitions folds repeated writes of one state (a REPLICATED record
// rewritten as acks arrive): they are not state transitions. How many
// writes a broadcast costs is R4.9's business.
func transitions(states []string) []string { return slices.Compact(slices.Clone(states)) }

// TestR4_1_PersistedStateTransitions watches every task record the
// broadcaster commits: a broadcast task's record goes PENDING, then
// TOMBSTONE, then deleted by GC, and through no other state, whether its
// callback succeeds at once or is retried and whether it completes from
// append results or consumer acks. A replicated task's record goes
// REPLICATED → TOMBSTONE → deleted.
func TestR4_1_PersistedStateTransitions(t *testing.T) {
	now := newManualClock()
	ticking(t, now, time.Millisecond) // callback retries below wait on it
	var rec *stateRecorder
	setup := func(c *broadcast.Config) {
		rec = newStateRecorder(c.Catalog)
		c.Catalog = rec
		c.Clock = now
		c.Tombstone.MaxLifetime = time.Hour
		c.Tombstone.CheckInterval = 5 * time.Millisecond
	}
	// expire ages every tombstone past MaxLifetime and waits for GC.
	expire := func(t *testing.T, e *env, b *broadcast.Broadcaster) {
		t.Helper()
		now.Add(2 * time.Hour)
		waitFor(t, "GC of every tombstone", func() bool { return b.Stats().Tombstones == 0 })
		waitFor(t, "task records deleted", func() bool { return len(e.store.Keys("walcast/tasks/")) == 0 })
	}

	t.Run("broadcast", func(t *testing.T) {
		e := newEnv(t)
		b := e.open(setup)
		ctx := ctxT(t, 20*time.Second)
		// 1: plain, fast-acked; 2: callback fails twice first; 3: no
		// callback; 4: AckSyncUp, completed by consumer (legacy) acks;
		// 5-12: concurrent.
		if _, err := do(ctx, b, msgOf(t, typCreate, "one", []message.VChannel{vch(1, "a"), vch(2, "b")}), resource.ExclusiveCollection("db", "c1")); err != nil {
			t.Fatal(err)
		}
		e.mu.Lock()
		e.failNext[2] = 2
		e.mu.Unlock()
		res, err := do(ctx, b, msgOf(t, typCreate, "two", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c1"))
		if err != nil || res.BroadcastID != 2 {
			t.Fatalf("second broadcast %+v, %v", res, err)
		}
		if _, err := do(ctx, b, msgOf(t, typPlain, "three", []message.VChannel{vch(3, "a")}), resource.ExclusiveCollection("db", "c2")); err != nil {
			t.Fatal(err)
		}
		syncTargets := []message.VChannel{vch(2, "s"), cchan}
		done := make(chan error, 1)
		go func() {
			_, err := do(ctx, b, msgOf(t, typSync, "four", syncTargets[:1]), resource.ExclusiveCollection("db", "c3"))
			done <- err
		}()
		waitFor(t, "the AckSyncUp task appended", func() bool {
			ti, err := b.Task(4)
			return err == nil && ti.VChannels[0].Appended && ti.VChannels[1].Appended
		})
		for _, v := range syncTargets {
			if err := b.Ack(ctx, broadcast.Ack{BroadcastID: 4, VChannel: v}); err != nil {
				t.Fatal(err)
			}
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				if _, err := do(ctx, b, msgOf(t, typCreate, "c", []message.VChannel{vch(i%4, "x")}), resource.ExclusiveCollection("db", fmt.Sprint("k", i%3))); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		e.mu.Lock()
		a := e.attempts[2]
		e.mu.Unlock()
		if a != 3 {
			t.Fatalf("callback of broadcast 2 ran %d times, want 3 (two injected failures)", a)
		}
		expire(t, e, b)
		states, errs := rec.snapshot()
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		if len(states) != 12 {
			t.Fatalf("records of %d tasks written, want 12: %v", len(states), states)
		}
		want := []string{"PENDING", "TOMBSTONE", "deleted"}
		for id, s := range states {
			if !slices.Equal(transitions(s), want) {
				t.Errorf("task %d: record states %v, want transitions %v", id, s, want)
			}
		}
	})

	t.Run("replicated", func(t *testing.T) {
		e := newEnv(t)
		b := e.open(setup)
		e.secondary(b)
		ctx := ctxT(t, 20*time.Second)
		for id := uint64(20); id < 23; id++ {
			m := replicated(id, typCreate, []message.VChannel{vch(1, "x"), vch(2, "y")}, resource.ExclusiveCollection("db", fmt.Sprint("c", id)))
			for i, v := range []message.VChannel{cchan, vch(1, "x"), vch(2, "y")} {
				if err := b.Ack(ctx, ackOf(m, v, uint64(id*100)+uint64(i))); err != nil {
					t.Fatal(err)
				}
			}
		}
		waitIdle(t, b)
		expire(t, e, b)
		states, errs := rec.snapshot()
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		if len(states) != 3 {
			t.Fatalf("records of %d tasks written, want 3: %v", len(states), states)
		}
		want := []string{"REPLICATED", "TOMBSTONE", "deleted"}
		for id, s := range states {
			if !slices.Equal(transitions(s), want) {
				t.Errorf("task %d: record states %v, want transitions %v", id, s, want)
			}
		}
	})
}

// TestR2_5_ExclusiveAppendGetsEntriesOfItsOwn: copies queued behind a slow
// pchannel share WAL entries, except those of an ExclusiveAppend type: each
// of its appends is an entry holding its own copies only (the engine's lanes
// batch nothing with an ExclusiveAppend copy), so a consumer sees it as a
// barrier on its vchannels.
func TestR2_5_ExclusiveAppendGetsEntriesOfItsOwn(t *testing.T) {
	// In a bubble, so that "the copies are queued" is an event
	// (synctest.Wait: every goroutine of the broadcaster blocked), not a
	// pause.
	synctest.Test(t, testExclusiveAppendEntries)
}

func testExclusiveAppendEntries(t *testing.T) {
	e := newEnv(t)
	typExcl := message.Type{Name: "Barrier", Version: 1}
	e.types.MustRegister(message.TypeInfo{Type: typExcl, ExclusiveAppend: true})
	// wal-1 refuses appends until the gate opens, so that copies queue.
	var closed atomic.Bool
	closed.Store(true)
	e.log.SetHook(func(p message.PChannel, _ []byte) wmem.Fault {
		if p == "wal-1" && closed.Load() {
			return wmem.Fault{Fail: true}
		}
		return wmem.Fault{}
	})
	b := e.open()
	ctx := ctxT(t, 20*time.Second)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		excl = map[uint64]bool{}
	)
	launch := func(typ message.Type, name string, targets ...message.VChannel) {
		wg.Go(func() {
			res, err := do(ctx, b, msgOf(t, typ, name, targets), resource.ExclusiveCollection("db", name))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			excl[res.BroadcastID] = typ == typExcl
			mu.Unlock()
		})
	}
	// queued waits until n tasks are durable and their copies queued:
	// nothing in the bubble can move but the failing append's retries.
	queued := func(n int) {
		t.Helper()
		waitFor(t, fmt.Sprint(n, " tasks persisted"), func() bool { return len(e.store.Keys("walcast/tasks/")) == n })
		synctest.Wait()
	}
	launch(typPlain, "plug", vch(1, "plug"))
	waitFor(t, "the plug's append to fail", func() bool { return b.Stats().AppendRetries >= 1 })
	for i := range 3 {
		launch(typPlain, fmt.Sprint("p", i), vch(1, fmt.Sprint("p", i)))
	}
	queued(4)
	for i := range 2 {
		name := fmt.Sprint("x", i)
		launch(typExcl, name, vch(1, name+"a"), vch(1, name+"b"), vch(2, name+"c"))
	}
	queued(6)
	for i := 3; i < 5; i++ {
		launch(typPlain, fmt.Sprint("p", i), vch(1, fmt.Sprint("p", i)))
	}
	queued(8)
	closed.Store(false)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	shared := false // some wal-1 entry held copies of several broadcasts
	for _, p := range pchans {
		for off, data := range e.log.Entries(p) {
			cs, err := wal.Decode(uint64(off), data)
			if err != nil {
				t.Fatal(err)
			}
			ids := map[uint64]int{}
			for _, c := range cs {
				ids[c.Message.Broadcast.ID]++
			}
			if len(ids) > 1 && p == "wal-1" {
				shared = true
			}
			for id, n := range ids {
				if excl[id] && len(ids) != 1 {
					t.Errorf("%s entry %d: exclusive-append broadcast %d shares it with others: %v", p, off, id, ids)
				}
				if excl[id] && p == "wal-1" && n != 2 {
					t.Errorf("%s entry %d: exclusive-append broadcast %d has %d copies there, want both in one entry", p, off, id, n)
				}
			}
		}
	}
	if !shared {
		t.Fatal("no wal-1 entry held copies of several broadcasts: the test did not queue copies together")
	}
	// The plain broadcasts queued together on wal-1 shared entries; the
	// exclusive ones did not: at most 1 (plug) + 2 (plain groups) + 2
	// (exclusive) entries there.
	if n := len(e.log.Entries("wal-1")); n > 5 {
		t.Fatalf("wal-1 has %d entries for 1+5 plain and 2 exclusive broadcasts queued in three groups", n)
	}
}
