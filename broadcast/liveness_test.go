package broadcast_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// Callers that give up while they wait (R11.5, R7.3): each test starts a
// request on its own goroutine, waits for the event that shows it waiting
// where the test wants it (never for a time), cancels its context, and
// checks that it returned the context's error and that the core keeps
// nothing of it: no admission slot, Resolve, handle, lock request or task
// waiter outlives a caller that has returned.

// giveUp runs call on its own goroutine with a context it cancels once
// waiting reports the call waits where the test wants it, and returns the
// call's error.
func giveUp(t *testing.T, what string, waiting func() bool, call func(ctx context.Context) error) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- call(ctx) }()
	waitFor(t, what, func() bool {
		select {
		case err := <-done:
			t.Fatalf("%s: returned before it waited: %v", what, err)
		default:
		}
		return waiting()
	})
	cancel()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: still waiting 20s after its context ended", what)
		return nil
	}
}

// canceled checks that err is the context's, as a caller that gave up gets.
func canceled(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("%s: %v, want the context's error", what, err)
	}
}

// outstanding checks what b's core holds for requests: exactly want.
func outstanding(t *testing.T, b *broadcast.Broadcaster, what string, want string) {
	t.Helper()
	if got := fmt.Sprintf("%+v", b.Outstanding()); got != want {
		t.Fatalf("%s: the core holds %s, want %s", what, got, want)
	}
}

const nothingOutstanding = "{Admissions:0 Resolving:0 Handles:0 TaskWaiters:0}"

// lockWaiters counts the lock requests queued in b's lock table.
func lockWaiters(b *broadcast.Broadcaster) int {
	n := 0
	for _, ks := range b.Locks() {
		n += len(ks.Waiters)
	}
	return n
}

// TestR7_3_GivenUpSameKeyRequestsLeaveTheKeyUsable is the stuck key of
// issue 34: something holds a collection's key; two identical requests with
// one idempotency key arrive, the first waits for the key, the second for
// the first's admission slot; both callers give up (in either order); the
// holder ends. The same request again must be answered, as new work, and a
// retry of it by its original. Before the fix, the second request's Resolve
// stayed queued on the slot: when the first gave the slot back it was
// admitted for a caller that was gone, and held the slot forever.
func TestR7_3_GivenUpSameKeyRequestsLeaveTheKeyUsable(t *testing.T) {
	for _, order := range []string{"second-gives-up-first", "first-gives-up-first"} {
		t.Run(order, func(t *testing.T) {
			e := newEnv(t)
			b := e.open()
			ctx := ctxT(t, 30*time.Second)
			blocker := resource.ExclusiveCollection("zz", "blocker")
			g, err := b.Locker().Lock(ctx, blocker)
			if err != nil {
				t.Fatal(err)
			}
			k := message.ClusterKey("K")
			targets := []message.VChannel{vch(1, "zz")}
			request := func(ctx context.Context) (*broadcast.Result, error) {
				return keyed(ctx, b, typCreate, k, "p", targets, blocker)
			}
			ctx1, cancel1 := context.WithCancel(ctx)
			defer cancel1()
			first := make(chan error, 1)
			go func() { _, err := request(ctx1); first <- err }()
			waitFor(t, "the first request to wait for the key", func() bool { return lockWaiters(b) == 1 })
			ctx2, cancel2 := context.WithCancel(ctx)
			defer cancel2()
			second := make(chan error, 1)
			go func() { _, err := request(ctx2); second <- err }()
			waitFor(t, "the second request to wait for the first's slot", func() bool { return b.Outstanding().Resolving == 1 })
			if order == "second-gives-up-first" {
				cancel2()
				canceled(t, "the second request", <-second)
				outstanding(t, b, "after the second gave up", "{Admissions:1 Resolving:0 Handles:2 TaskWaiters:0}")
				cancel1()
				canceled(t, "the first request", <-first)
			} else {
				cancel1()
				canceled(t, "the first request", <-first)
				// The second took the slot over and waits for the key now.
				waitFor(t, "the second request to wait for the key", func() bool { return lockWaiters(b) == 1 })
				cancel2()
				canceled(t, "the second request", <-second)
			}
			outstanding(t, b, "after both gave up", "{Admissions:0 Resolving:0 Handles:1 TaskWaiters:0}")
			if n := lockWaiters(b); n != 0 {
				t.Fatalf("%d lock requests queued after their callers gave up", n)
			}
			g.Unlock()
			outstanding(t, b, "after the holder ended", nothingOutstanding)
			if _, err := b.Lookup(ctx, typCreate, k); !errors.Is(err, broadcast.ErrNotFound) {
				t.Fatalf("lookup of a key nobody broadcast: %v", err)
			}
			res, err := request(ctxT(t, 20*time.Second))
			if err != nil || res.Duplicated != nil {
				t.Fatalf("the request again: %+v, %v; want it answered as new work", res, err)
			}
			again, err := request(ctxT(t, 20*time.Second))
			if err != nil || again.Duplicated == nil || again.BroadcastID != res.BroadcastID {
				t.Fatalf("its retry: %+v, %v; want broadcast %d's result", again, err, res.BroadcastID)
			}
			if st := b.Stats(); st.Broadcasts != 1 {
				t.Fatalf("%d broadcasts, want 1", st.Broadcasts)
			}
			waitIdle(t, b)
			outstanding(t, b, "at the end", nothingOutstanding)
		})
	}
}

// TestR11_5_WaitsHonourTheirContext: a caller whose context ends while it
// waits gets the context's error at once, wherever it waits, and leaves
// nothing behind in the core; work it already submitted goes on without
// it.
func TestR11_5_WaitsHonourTheirContext(t *testing.T) {
	targets := []message.VChannel{vch(1, "c")}
	coll := resource.ExclusiveCollection("db", "c")

	t.Run("lock", func(t *testing.T) {
		e := newEnv(t)
		b := e.open()
		g, err := b.Locker().Lock(ctxT(t, 10*time.Second), coll)
		if err != nil {
			t.Fatal(err)
		}
		err = giveUp(t, "a request waiting for its keys", func() bool { return lockWaiters(b) == 1 }, func(ctx context.Context) error {
			_, err := do(ctx, b, msgOf(t, typCreate, "p", targets), coll)
			return err
		})
		canceled(t, "lock wait", err)
		if n := lockWaiters(b); n != 0 {
			t.Fatalf("%d lock requests queued after their caller gave up", n)
		}
		outstanding(t, b, "after the lock wait", "{Admissions:0 Resolving:0 Handles:1 TaskWaiters:0}")
		g.Unlock()
		outstanding(t, b, "after the holder ended", nothingOutstanding)
	})

	t.Run("duplicate", func(t *testing.T) {
		e := newEnv(t)
		b := e.open()
		release := e.blockCallback(1)
		k := message.ClusterKey("dup")
		orig := make(chan error, 1)
		go func() { _, err := keyed(ctxT(t, 20*time.Second), b, typCreate, k, "p", targets, coll); orig <- err }()
		waitFor(t, "the original to wait for its callback", func() bool { return b.Waiters(1) == 1 })
		err := giveUp(t, "a duplicate waiting for its original", func() bool { return b.Waiters(1) == 2 }, func(ctx context.Context) error {
			_, err := keyed(ctx, b, typCreate, k, "p", targets, coll)
			return err
		})
		canceled(t, "duplicate wait", err)
		outstanding(t, b, "after the duplicate gave up", "{Admissions:0 Resolving:0 Handles:0 TaskWaiters:1}")
		close(release)
		if err := <-orig; err != nil {
			t.Fatal(err)
		}
		outstanding(t, b, "at the end", nothingOutstanding)
	})

	t.Run("submit", func(t *testing.T) {
		e := newEnv(t)
		b := e.open()
		release := e.blockCallback(1)
		k := message.ClusterKey("sub")
		err := giveUp(t, "a broadcast waiting for its callback", func() bool { return e.callbackRuns(1) && b.Waiters(1) == 1 }, func(ctx context.Context) error {
			_, err := keyed(ctx, b, typCreate, k, "p", targets, coll)
			return err
		})
		canceled(t, "submit wait", err)
		if !strings.Contains(err.Error(), "broadcast 1 was waiting for its callback to return") {
			t.Fatalf("error %q does not say what the broadcast waited for", err)
		}
		outstanding(t, b, "after its caller gave up", nothingOutstanding)
		// The broadcast goes on without its caller; a retry gets it.
		close(release)
		res, err := keyed(ctxT(t, 20*time.Second), b, typCreate, k, "p", targets, coll)
		if err != nil || res.BroadcastID != 1 || res.Duplicated == nil {
			t.Fatalf("the retry: %+v, %v; want broadcast 1's result", res, err)
		}
		waitIdle(t, b)
		if e.effects()[1] != 1 {
			t.Fatal("the broadcast did not complete once")
		}
		outstanding(t, b, "at the end", nothingOutstanding)
	})

	t.Run("id", func(t *testing.T) {
		e := newEnv(t)
		g := newCommitGate()
		g.closed.Store(true)
		b := e.open(g.install)
		err := giveUp(t, "a broadcast waiting for its id", g.holding, func(ctx context.Context) error {
			_, err := do(ctx, b, msgOf(t, typCreate, "p", targets), coll)
			return err
		})
		canceled(t, "id wait", err)
		if !strings.Contains(err.Error(), "waiting for the catalog to allocate the broadcast's id") {
			t.Fatalf("error %q does not say what the broadcast waited for", err)
		}
		// Submitted: the broadcast goes on once the catalog answers,
		// without a waiter.
		outstanding(t, b, "while its id is allocated", "{Admissions:0 Resolving:0 Handles:1 TaskWaiters:0}")
		g.open()
		waitFor(t, "the broadcast", func() bool { return b.Stats().Broadcasts == 1 })
		waitIdle(t, b)
		outstanding(t, b, "at the end", nothingOutstanding)
	})

	t.Run("owner", func(t *testing.T) {
		e := newEnv(t)
		withGroupTypes(t, e)
		b := e.open()
		release := e.blockCallback(1)
		imp := make(chan error, 1)
		go func() { _, err := do(ctxT(t, 20*time.Second), b, msgOf(t, typImport, "7", targets), coll); imp <- err }()
		waitFor(t, "the import's callback", func() bool { return b.Waiters(1) == 1 })
		// The end waits for the owner's callback: queued in its group.
		queued := func() bool {
			gs, err := b.Groups()
			return err == nil && len(gs) == 1 && gs[0].Queued == 1
		}
		err := giveUp(t, "an end waiting for its owner", queued, func(ctx context.Context) error {
			_, err := b.EndOwnership(ctx, msgOf(t, typCommitIm, "7", targets))
			return err
		})
		canceled(t, "owner wait", err)
		if !strings.Contains(err.Error(), "waiting for its turn in group 1") {
			t.Fatalf("error %q does not say what the end waited for", err)
		}
		close(release)
		if err := <-imp; err != nil {
			t.Fatal(err)
		}
		// The end was submitted: it goes on, and ends the ownership.
		waitFor(t, "the ownership to end", func() bool {
			gs, _ := b.Groups()
			return len(gs) == 0
		})
		waitIdle(t, b)
		outstanding(t, b, "at the end", nothingOutstanding)
	})

	t.Run("acked", func(t *testing.T) {
		e := newEnv(t)
		b := e.open()
		src, dst := vch(1, "c_0"), vch(2, "c_1")
		m := msgOf(t, typCreate, "split", []message.VChannel{src, dst}, message.WithAppendFirst(src))
		go func() { _, _ = do(ctxT(t, 20*time.Second), b, m, coll) }()
		waitFor(t, "the first phase", func() bool { return b.Waiters(1) == 1 })
		err := giveUp(t, "a wait for acks", func() bool { return b.Outstanding().TaskWaiters == 2 }, func(ctx context.Context) error {
			return b.WaitVChannelsAcked(ctx, 1, src)
		})
		canceled(t, "ack wait", err)
		outstanding(t, b, "after the ack wait", "{Admissions:0 Resolving:0 Handles:0 TaskWaiters:1}")
		// Close answers a wait under way with the stopped error, and a
		// wait after it too.
		closed := make(chan error, 1)
		go func() { closed <- b.WaitVChannelsAcked(context.Background(), 1, src) }()
		waitFor(t, "a second wait for acks", func() bool { return b.Outstanding().TaskWaiters == 2 })
		_ = b.Close()
		if err := <-closed; !errors.Is(err, broadcast.ErrClosed) {
			t.Fatalf("a wait for acks under way at Close: %v, want ErrClosed", err)
		}
		if err := b.WaitVChannelsAcked(ctxT(t, time.Second), 1, src); !errors.Is(err, broadcast.ErrClosed) {
			t.Fatalf("a wait for acks after Close: %v, want ErrClosed", err)
		}
	})

	t.Run("ack", func(t *testing.T) {
		// A secondary answers an ack once it is durable (R8.2): the
		// catalog holds the write, the acker gives up, the ack still
		// counts.
		e := newEnv(t)
		g := newCommitGate()
		b := e.open(g.install)
		e.secondary(b)
		g.closed.Store(true)
		m := replicated(10, typCreate, []message.VChannel{vch(1, "x")}, coll)
		err := giveUp(t, "an ack waiting to be durable", func() bool { return g.holding() && b.Outstanding().TaskWaiters == 1 },
			func(ctx context.Context) error { return b.Ack(ctx, ackOf(m, cchan, 100)) })
		canceled(t, "ack wait", err)
		outstanding(t, b, "after the acker gave up", nothingOutstanding)
		g.open()
		ctx := ctxT(t, 20*time.Second)
		for _, ack := range []broadcast.Ack{ackOf(m, cchan, 100), ackOf(m, vch(1, "x"), 101)} {
			if err := b.Ack(ctx, ack); err != nil {
				t.Fatal(err)
			}
		}
		waitIdle(t, b)
		outstanding(t, b, "at the end", nothingOutstanding)
	})

	t.Run("promote", func(t *testing.T) {
		e := newEnv(t)
		b := e.open(func(c *broadcast.Config) { c.PChannels = pchans })
		e.secondary(b)
		// No streaming node acks the promote's copies yet: it waits.
		err := giveUp(t, "a promote waiting for its acks", func() bool {
			id := b.PromoteTask()
			return id != 0 && b.Waiters(id) == 1
		}, func(ctx context.Context) error {
			_, err := b.ForcePromote(ctx)
			return err
		})
		canceled(t, "promote wait", err)
		id := b.PromoteTask()
		if n := b.Waiters(id); n != 0 {
			t.Fatalf("%d callers wait for the promote after its caller gave up", n)
		}
		// A second call waits for the promote under way.
		err = giveUp(t, "a promote waiting for the one under way", func() bool { return b.Waiters(id) == 1 }, func(ctx context.Context) error {
			_, err := b.ForcePromote(ctx)
			return err
		})
		canceled(t, "second promote wait", err)
		outstanding(t, b, "after both gave up", nothingOutstanding)
		// The promote goes on: once the nodes ack, the cluster is primary.
		startNode(t, e, &liveAcker{b: b})
		if _, err := b.ForcePromote(ctxT(t, 20*time.Second)); err != nil {
			t.Fatal(err)
		}
		if b.Role() != broadcast.Primary {
			t.Fatalf("role %s after the promote", b.Role())
		}
	})
}

// callbackRuns reports whether broadcast id's callback has started.
func (e *env) callbackRuns(id uint64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.attempts[id] > 0
}

// commitGate holds the catalog's commits while it is closed, until open.
type commitGate struct {
	closed atomic.Bool
	gate   chan struct{}
	gated  chan struct{} // not empty once a commit was held
}

func newCommitGate() *commitGate {
	return &commitGate{gate: make(chan struct{}), gated: make(chan struct{}, 1)}
}

// install puts the gate in front of the broadcaster's catalog.
func (g *commitGate) install(c *broadcast.Config) {
	c.Catalog = hooked{Catalog: c.Catalog, commit: func(ctx context.Context, _ []catalog.Op, next func() error) error {
		if g.closed.Load() {
			select {
			case g.gated <- struct{}{}:
			default:
			}
			select {
			case <-g.gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return next()
	}}
}

// holding reports whether a commit was held.
func (g *commitGate) holding() bool { return len(g.gated) == 1 }

// open lets every commit through.
func (g *commitGate) open() { close(g.gate) }

// blockCallback makes broadcast id's callback wait until the returned
// channel is closed.
func (e *env) blockCallback(id uint64) chan struct{} {
	release := make(chan struct{})
	e.mu.Lock()
	e.block[id] = release
	e.mu.Unlock()
	e.t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	return release
}

// TestR11_5_LooksAfterCloseReturn: a look at the core (Stats, Locks,
// Lookup, Tasks) after Close returns, at once, every time: a look sent
// once the loop has exited is never stepped, and must not be waited for.
func TestR11_5_LooksAfterCloseReturn(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	_ = b.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 200 {
			b.Stats()
			b.Locks()
			_, _ = b.Tasks(broadcast.Filter{})
		}
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("a look at a closed broadcaster's core did not return in 20s")
	}
}
