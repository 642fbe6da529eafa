package resource

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/walcast/walcast/internal/cputime"
	"github.com/walcast/walcast/internal/wait"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// counters record, per key, how many goroutines are inside a critical section
// in each mode, so the property test can check mutual exclusion directly.
type counters struct {
	shared    atomic.Int32
	exclusive atomic.Int32
}

func (c *counters) enter(k Key) error {
	if k.Mode == Exclusive {
		if n := c.exclusive.Add(1); n != 1 {
			return fmt.Errorf("%s: %d exclusive holders", k, n)
		}
		if n := c.shared.Load(); n != 0 {
			return fmt.Errorf("%s: exclusive holder with %d shared holders", k, n)
		}
		return nil
	}
	c.shared.Add(1)
	if n := c.exclusive.Load(); n != 0 {
		return fmt.Errorf("%s: shared holder with %d exclusive holders", k, n)
	}
	return nil
}

func (c *counters) leave(k Key) {
	if k.Mode == Exclusive {
		c.exclusive.Add(-1)
	} else {
		c.shared.Add(-1)
	}
}

// lockID names one (domain, name) of the test's key space.
type lockID struct {
	domain Domain
	name   string
}

// TestR3_3_NoDeadlockAndMutualExclusion locks random subsets of a small key
// space, in random orders and modes, from many goroutines, and checks inside
// every critical section that no conflicting holder exists. The run must
// finish within a bound, which is how a deadlock would show.
func TestR3_3_NoDeadlockAndMutualExclusion(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		space := []lockID{{Collection, "db:a"}, {Collection, "db:b"}, {Database, "db"}, {Privilege, ""}, {Cluster, ""}}
		ctrs := make(map[lockID]*counters, len(space))
		for _, id := range space {
			ctrs[id] = &counters{}
		}
		workers := rapid.IntRange(2, 12).Draw(t, "workers")
		rounds := rapid.IntRange(1, 40).Draw(t, "rounds")
		plans := make([][][]Key, workers)
		holds := make([][]time.Duration, workers)
		for w := range plans {
			plans[w] = make([][]Key, rounds)
			holds[w] = make([]time.Duration, rounds)
			for r := range plans[w] {
				n := rapid.IntRange(1, 4).Draw(t, "nkeys")
				for range n {
					id := rapid.SampledFrom(space).Draw(t, "key")
					m := rapid.SampledFrom([]Mode{Shared, Exclusive}).Draw(t, "mode")
					plans[w][r] = append(plans[w][r], Key{Domain: id.domain, Name: id.name, Mode: m})
				}
				holds[w][r] = time.Duration(rapid.IntRange(0, 50).Draw(t, "hold")) * time.Microsecond
			}
		}
		l := NewLocker()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, workers*rounds*4)
		for w := range workers {
			wg.Go(func() {
				for r, keys := range plans[w] {
					g, err := l.Lock(ctx, keys...)
					if err != nil {
						errs <- fmt.Errorf("worker %d: %w (deadlock?)", w, err)
						return
					}
					held := g.Keys()
					for _, k := range held {
						if err := ctrs[lockID{k.Domain, k.Name}].enter(k); err != nil {
							errs <- err
						}
					}
					time.Sleep(holds[w][r])
					for _, k := range held {
						ctrs[lockID{k.Domain, k.Name}].leave(k)
					}
					g.Unlock()
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if n := l.Len(); n != 0 {
			t.Fatalf("lock table has %d entries after every guard was released", n)
		}
	})
}

// TestR3_3_OppositeOrdersDoNotDeadlock is the classic AB/BA case.
func TestR3_3_OppositeOrdersDoNotDeadlock(t *testing.T) {
	l := NewLocker()
	a, b := ExclusiveCollection("db", "a"), ExclusiveCollection("db", "b")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			for range 2000 {
				keys := []Key{a, b}
				if i == 1 {
					keys = []Key{b, a}
				}
				g, err := l.Lock(ctx, keys...)
				if err != nil {
					t.Errorf("deadlock: %v", err)
					return
				}
				g.Unlock()
			}
		})
	}
	wg.Wait()
}

// TestR3_3_SharedAndExclusiveSameKeyMeansExclusive checks that naming a key
// in both modes neither self-deadlocks nor lets a second locker in.
func TestR3_3_SharedAndExclusiveSameKeyMeansExclusive(t *testing.T) {
	l := NewLocker()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := l.Lock(ctx, SharedDatabase("db"), ExclusiveDatabase("db"), SharedDatabase("db"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Unlock()
	if keys := g.Keys(); len(keys) != 1 || keys[0] != ExclusiveDatabase("db") {
		t.Fatalf("held %v, want only the exclusive key", keys)
	}
	if _, err := l.TryLock(SharedDatabase("db")); !errors.Is(err, ErrConflict) {
		t.Fatalf("shared TryLock against an exclusive holder: %v, want ErrConflict", err)
	}
}

// TestR3_5_ExclusiveWaiterNotStarvedByReaders keeps a continuous stream of
// shared lockers going and checks that a queued exclusive locker gets in.
func TestR3_5_ExclusiveWaiterNotStarvedByReaders(t *testing.T) {
	l := NewLocker()
	k := SharedCollection("db", "c")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Readers overlap each other, so without fairness the key would never
	// be free of shared holders.
	var holding atomic.Int32
	var overlapped atomic.Bool
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				g, err := l.Lock(ctx, k)
				if err != nil {
					return
				}
				if holding.Add(1) > 1 {
					overlapped.Store(true)
				}
				time.Sleep(200 * time.Microsecond) // the reader's work
				holding.Add(-1)
				g.Unlock()
			}
		})
	}
	waitFor(t, overlapped.Load)
	g, err := l.Lock(ctx, ExclusiveCollection("db", "c"))
	close(stop)
	if err != nil {
		wg.Wait()
		t.Fatalf("exclusive locker starved: %v", err)
	}
	g.Unlock()
	wg.Wait()
}

// TestR3_5_CancelledWaiterLeavesTableClean cancels a queued waiter and
// checks that it holds nothing afterwards, that the request queued behind it
// proceeds, and that the table empties.
func TestR3_5_CancelledWaiterLeavesTableClean(t *testing.T) {
	l := NewLocker()
	bg := context.Background()
	holder, err := l.Lock(bg, SharedDatabase("db"))
	if err != nil {
		t.Fatal(err)
	}
	// The waiter takes Collection first (free), then queues on Database.
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() {
		_, err := l.Lock(ctx, ExclusiveCollection("db", "c"), ExclusiveDatabase("db"))
		done <- err
	}()
	waitFor(t, func() bool { return waiters(l, Database, "db") == 1 })
	// A shared request queues behind the exclusive waiter (fairness).
	behind := make(chan Guard, 1)
	go func() {
		g, err := l.Lock(bg, SharedDatabase("db"))
		if err != nil {
			t.Error(err)
		}
		behind <- g
	}()
	waitFor(t, func() bool { return waiters(l, Database, "db") == 2 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Lock returned %v", err)
	}
	g := <-behind // granted once the exclusive waiter left the queue
	c, err := l.TryLock(ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatalf("collection key still held after the waiter was cancelled: %v", err)
	}
	c.Unlock()
	g.Unlock()
	holder.Unlock()
	if n := l.Len(); n != 0 {
		t.Fatalf("lock table has %d entries, want 0: %+v", n, l.Snapshot())
	}
}

// TestR3_5_CancelledWaiterAfterTryLockLeavesNothing is a smaller check that a
// Lock cancelled while queued leaves the table exactly as it found it.
func TestR3_5_CancelledWaiterAfterTryLockLeavesNothing(t *testing.T) {
	l := NewLocker()
	g, err := l.TryLock(ExclusiveCluster())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := l.Lock(ctx, SharedDatabase("x"), SharedCluster()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock behind an exclusive cluster holder: %v", err)
	}
	if n := l.Len(); n != 1 {
		t.Fatalf("table has %d entries, want only the cluster key", n)
	}
	g.Unlock()
	if n := l.Len(); n != 0 {
		t.Fatalf("table has %d entries after unlock", n)
	}
}

// TestR3_5_TryLockIgnoresQueuedWriter: a shared TryLock succeeds while an
// exclusive Lock is queued behind shared holders, because nothing held
// conflicts with it. It fails only against a real conflicting holder.
func TestR3_5_TryLockIgnoresQueuedWriter(t *testing.T) {
	l := NewLocker()
	r1, err := l.Lock(context.Background(), SharedCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	writer := make(chan Guard, 1)
	go func() {
		g, err := l.Lock(context.Background(), ExclusiveCollection("db", "c"))
		if err != nil {
			t.Error(err)
		}
		writer <- g
	}()
	waitFor(t, func() bool { return waiters(l, Collection, "db:c") == 1 })
	r2, err := l.TryLock(SharedCollection("db", "c"))
	if err != nil {
		t.Fatalf("shared TryLock failed with only a queued writer: %v", err)
	}
	if _, err := l.TryLock(ExclusiveCollection("db", "c")); !errors.Is(err, ErrConflict) {
		t.Fatalf("exclusive TryLock against shared holders: %v, want ErrConflict", err)
	}
	r1.Unlock()
	select {
	case <-writer:
		t.Fatal("writer granted while a shared holder remains")
	case <-time.After(10 * time.Millisecond):
	}
	r2.Unlock()
	w := <-writer
	w.Unlock()
	if n := l.Len(); n != 0 {
		t.Fatalf("table has %d entries", n)
	}
}

func TestTryLockIsAllOrNothing(t *testing.T) {
	l := NewLocker()
	g, err := l.TryLock(ExclusiveDatabase("b"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryLock(ExclusiveDatabase("a"), ExclusiveDatabase("b")); !errors.Is(err, ErrConflict) {
		t.Fatalf("got %v, want ErrConflict", err)
	}
	if _, err := l.TryLock(ExclusiveDatabase("a")); err != nil {
		t.Fatalf("a failed TryLock kept key a: %v", err)
	}
	g.Unlock()
}

func TestGuardUnlockOnceInReverse(t *testing.T) {
	l := NewLocker()
	g, err := l.Lock(context.Background(), ExclusiveCluster(), ExclusiveDatabase("d"), SharedCollection("d", "c"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Key{SharedCollection("d", "c"), ExclusiveDatabase("d"), ExclusiveCluster()}
	if got := g.Keys(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("acquisition order %v, want %v", got, want)
	}
	g.Unlock()
	// A second holder takes the keys; a repeated Unlock of the old guard must
	// not release them.
	g2, err := l.TryLock(ExclusiveDatabase("d"))
	if err != nil {
		t.Fatal(err)
	}
	g.Unlock()
	if _, err := l.TryLock(ExclusiveDatabase("d")); !errors.Is(err, ErrConflict) {
		t.Fatalf("second Unlock released someone else's key: %v", err)
	}
	g2.Unlock()
	var nilGuard *Guard
	nilGuard.Unlock()
}

// TestGuardStateReuseIsInvisible checks what the Locker's reuse of released
// lock states must not change: a guard released and then reused by another
// Lock (same state, next generation) neither unlocks nor relabels the new
// holder, still reports its own keys, and copies of a guard are the same
// guard. A state recycled from a cancelled waiter serves the next Lock too.
func TestGuardStateReuseIsInvisible(t *testing.T) {
	l := NewLocker()
	bg := context.Background()
	g1, err := l.Lock(bg, ExclusiveDatabase("a"), SharedCluster())
	if err != nil {
		t.Fatal(err)
	}
	copied := g1
	copied.Unlock() // releases g1: a copy is the same guard
	a, err := l.TryLock(ExclusiveDatabase("a"))
	if err != nil {
		t.Fatalf("Unlock of a copy did not release the keys: %v", err)
	}
	a.Unlock()
	g2, err := l.Lock(bg, ExclusiveDatabase("b"))
	if err != nil {
		t.Fatal(err)
	}
	if g2.st != g1.st {
		t.Fatal("the second Lock did not reuse the released state; this test checks nothing")
	}
	g1.Unlock()
	copied.Unlock()
	g1.SetOwner("stale")
	if _, err := l.TryLock(ExclusiveDatabase("b")); !errors.Is(err, ErrConflict) {
		t.Fatalf("a stale guard's Unlock released the reusing guard's key: %v", err)
	}
	if snap := l.Snapshot(); len(snap) != 1 || snap[0].Name != "b" || len(snap[0].Holders) != 1 || snap[0].Holders[0].Owner == "stale" {
		t.Fatalf("snapshot %+v: want b held by the reusing guard, not labelled by the stale one", snap)
	}
	if got, want := fmt.Sprint(g1.Keys()), fmt.Sprint([]Key{ExclusiveDatabase("a"), SharedCluster()}); got != want {
		t.Fatalf("released guard's Keys = %s, want its own %s", got, want)
	}
	g2.Unlock()

	// A waiter that gives up leaves its state for the next Lock.
	h, err := l.Lock(bg, ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bg, 10*time.Millisecond)
	defer cancel()
	if _, err := l.Lock(ctx, SharedCollection("db", "c"), SharedDatabase("db"), ExclusivePrivilege(), SharedCluster()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock behind an exclusive holder: %v", err)
	}
	g3, err := l.Lock(bg, SharedDatabase("db"))
	if err != nil {
		t.Fatal(err)
	}
	if snap := l.Snapshot(); len(snap) != 2 || snap[0].Name != "db:c" || len(snap[0].Waiters) != 0 || snap[1].Name != "db" || len(snap[1].Holders) != 1 {
		t.Fatalf("snapshot %+v: want db:c held without waiters and db held once", snap)
	}
	g3.Unlock()
	h.Unlock()
	if n := l.Len(); n != 0 {
		t.Fatalf("table has %d entries", n)
	}
	var zero Guard
	zero.Unlock()
	zero.SetOwner("nobody")
	if k := zero.Keys(); len(k) != 0 {
		t.Fatalf("zero guard holds %v", k)
	}
}

// TestLockUnlockDoesNotAllocate keeps B7's main saving: an uncontended Lock
// and Unlock of up to three keys reuses the lock state and allocates
// nothing (an allocation, with the collector's share of it, was about 40%
// of the operation).
func TestLockUnlockDoesNotAllocate(t *testing.T) {
	l := NewLocker()
	ctx := context.Background()
	keys := []Key{ExclusiveCollection("db", "orders"), SharedDatabase("db"), SharedCluster()}
	allocs := testing.AllocsPerRun(1000, func() {
		g, err := l.Lock(ctx, keys...)
		if err != nil {
			t.Fatal(err)
		}
		g.Unlock()
	})
	if allocs != 0 {
		t.Fatalf("Lock + Unlock of 3 keys allocates %v times", allocs)
	}
}

func TestR3_7_SnapshotShowsHoldersAndWaiters(t *testing.T) {
	l := NewLocker()
	// The table's bookkeeping with an exact clock (the Locker's own is
	// coarse: TestCoarseClock).
	l.t.Now = monoNow
	g, err := l.Lock(context.Background(), ExclusiveDatabase("d"))
	if err != nil {
		t.Fatal(err)
	}
	g.SetOwner("broadcast 7")
	asked := time.Now() // the waiter's request is no earlier than this
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = l.Lock(ctx, SharedDatabase("d"))
	}()
	waitFor(t, func() bool { return waiters(l, Database, "d") == 1 })
	snap := l.Snapshot()
	if len(snap) != 1 {
		t.Fatalf("snapshot %+v", snap)
	}
	ks := snap[0]
	if ks.Domain != Database || ks.Name != "d" || len(ks.Holders) != 1 || ks.Holders[0].Owner != "broadcast 7" ||
		ks.Holders[0].Mode != Exclusive || len(ks.Waiters) != 1 || ks.Waiters[0].Mode != Shared {
		t.Fatalf("snapshot %+v", ks)
	}
	if ks.Holders[0].Since.IsZero() || time.Since(ks.Waiters[0].Since) < 0 {
		t.Fatalf("missing ages in %+v", ks)
	}
	// The ages are real times: set, not in the future, and the waiter's no
	// earlier than its request and no earlier than the holder's grant.
	now := time.Now()
	hs, ws := ks.Holders[0].Since, ks.Waiters[0].Since
	if hs.IsZero() || hs.After(now) || hs.After(asked) {
		t.Fatalf("holder since %v (asked %v, now %v)", hs, asked, now)
	}
	if ws.IsZero() || ws.After(now) || ws.Before(asked) || ws.Before(hs) {
		t.Fatalf("waiter since %v (holder since %v, asked %v, now %v)", ws, hs, asked, now)
	}
	cancel()
	<-done
	g.Unlock()
	if len(l.Snapshot()) != 0 {
		t.Fatal("snapshot not empty after release")
	}
}

func TestLockRejectsInvalidKeys(t *testing.T) {
	l := NewLocker()
	for _, k := range []Key{{Domain: 7, Name: "x", Mode: Shared}, {Domain: Database, Name: "x"}, {Domain: Database, Name: "\xff", Mode: Shared}} {
		if _, err := l.Lock(context.Background(), k); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("Lock(%+v) = %v, want ErrInvalidKey", k, err)
		}
		if _, err := l.TryLock(k); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("TryLock(%+v) = %v, want ErrInvalidKey", k, err)
		}
	}
	if l.Len() != 0 {
		t.Fatal("invalid keys left entries")
	}
}

func waiters(l *Locker, d Domain, name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.t.lookup(d, name); e != nil {
		return len(e.waiters)
	}
	return 0
}

// TestCoarseClock: the Locker's clock reads the time to within about a
// tick, never goes back, and stops its timer when nobody reads it.
func TestCoarseClock(t *testing.T) {
	var c coarseClock
	prev := int64(0)
	// Read it without pause, as a busy Locker does, until the timer has
	// moved it several ticks on.
	start, deadline := c.now(), time.Now().Add(wait.Patience)
	for prev < start+5*int64(coarseTick) {
		if time.Now().After(deadline) {
			t.Fatalf("the clock read %d, %v after %d", prev, wait.Patience, start)
		}
		before := monoNow()
		got := c.now()
		after := monoNow()
		// A reading is at most a tick old, plus what the timer's run was
		// late by: allow for a loaded machine (-race, CI).
		if got > after || got < before-int64(coarseTick)-int64(time.Second) {
			t.Fatalf("reading %d outside [%d - tick, %d]", got, before, after)
		}
		if got < prev {
			t.Fatalf("the clock went back: %d after %d", got, prev)
		}
		prev = got
		runtime.Gosched()
	}
	// Read often, it moves: the timer refreshes it.
	first := c.now()
	waitFor(t, func() bool { return c.now() > first })
	// Unread, it stops ticking by itself (goleak checks that no timer's
	// goroutine outlives the tests).
	waitFor(t, func() bool { return !c.ticking.Load() })
	// And the next read takes the system clock (a kept reading would be
	// older than this), then stops again unread.
	before := monoNow()
	if got := c.now(); got < before {
		t.Fatalf("the first reading after the clock stopped is %d, before %d", got, before)
	}
	waitFor(t, func() bool { return !c.ticking.Load() })
}

// waitFor waits for cond: see wait.For.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	wait.For(t, "the condition", cond)
}

func BenchmarkLockUnlock3Keys(b *testing.B) {
	l := NewLocker()
	ctx := context.Background()
	keys := []Key{ExclusiveCollection("db", "orders"), SharedDatabase("db"), SharedCluster()}
	b.ReportAllocs()
	cpu := cputime.Process()
	for b.Loop() {
		g, err := l.Lock(ctx, keys...)
		if err != nil {
			b.Fatal(err)
		}
		g.Unlock()
	}
	cputime.ReportPerOp(b, cpu, b.N)
}

// BenchmarkLockUnlock3KeysBusyTable is BenchmarkLockUnlock3Keys on a table
// that holds 10,000 other collection keys and 100 other database keys, as a
// busy broadcaster's does: its lookups hash, where a near-empty table's
// small maps compare a few strings.
func BenchmarkLockUnlock3KeysBusyTable(b *testing.B) {
	l := NewLocker()
	ctx := context.Background()
	for i := range 10_000 {
		if _, err := l.Lock(ctx, ExclusiveCollection(fmt.Sprint("db", i%100), fmt.Sprint("c", i)), SharedDatabase(fmt.Sprint("db", i%100))); err != nil {
			b.Fatal(err)
		}
	}
	keys := []Key{ExclusiveCollection("db", "orders"), SharedDatabase("db"), SharedCluster()}
	b.ReportAllocs()
	cpu := cputime.Process()
	for b.Loop() {
		g, err := l.Lock(ctx, keys...)
		if err != nil {
			b.Fatal(err)
		}
		g.Unlock()
	}
	cputime.ReportPerOp(b, cpu, b.N)
}

// BenchmarkLockUnlock3KeysContended runs parallel lockers that really
// collide: goroutines pair up on an exclusive collection key (goroutines 0
// and 1 on c0, 2 and 3 on c1, ..., over 4 collections, then around again),
// so every collection key in use has at least two lockers competing for it;
// all share the database and cluster keys. SetParallelism(2) runs
// 2 x GOMAXPROCS goroutines, so there is a pair even with GOMAXPROCS=1 (on 2
// procs: 4 goroutines, two on c0 and two on c1).
func BenchmarkLockUnlock3KeysContended(b *testing.B) {
	l := NewLocker()
	ctx := context.Background()
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(2)
	b.RunParallel(func(pb *testing.PB) {
		i := n.Add(1) - 1
		keys := []Key{ExclusiveCollection("db", fmt.Sprint("c", i/2%4)), SharedDatabase("db"), SharedCluster()}
		for pb.Next() {
			g, err := l.Lock(ctx, keys...)
			if err != nil {
				b.Fatal(err)
			}
			g.Unlock()
		}
	})
}
