package catalog

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Group is a Catalog that coalesces concurrent Commits into shared
// transactions of the Catalog it wraps (group commit, SPEC R4.9). Each
// caller's ops stay together in one transaction, so a caller's atomicity is
// kept; callers whose keys overlap go into successive transactions in arrival
// order; a transaction never exceeds the wrapped catalog's Limits.
//
// While one transaction is in flight, new Commits queue; when it returns, the
// next transaction takes everything queued that fits. Under load the number
// of round trips per Commit falls well below one; alone, a Commit costs one
// round trip as before.
//
// If the shared transaction fails, every caller in it gets that error, with
// the same meaning (definite or ambiguous) as for a single Commit.
//
// The flusher, the goroutine that sends the transactions, waits up to
// Linger for the next Commit once the queue is empty, then exits; Close
// ends a waiting one at once. A goroutine started afresh for each Commit
// of a sequential caller (a broadcast's PENDING, then its TOMBSTONE) grows
// its stack again through the etcd client's calls, which cost each such
// transaction tens of microseconds.
type Group struct {
	c       Catalog
	timeout time.Duration

	mu sync.Mutex
	// queue holds Commits not yet taken into a transaction; flushing says a
	// flush goroutine is running. Protected by mu.
	queue    []*groupCall
	flushing bool
	// idle says the flusher waits for the next Commit, which wakes it
	// through kick; closed, that it no longer waits (Close).
	idle, closed bool
	kick         chan struct{}
	// The flusher's (one at a time): its buffers, and the context that
	// bounds its transactions, with its deadline.
	batch   []*groupCall
	ops     []Op
	keys    map[string]struct{}
	txn     context.Context
	txnEnd  time.Time
	txnStop context.CancelFunc
	// lingerFor is Linger (a test's own value); lingerT times the wait.
	lingerFor time.Duration
	lingerT   *time.Timer

	trips atomic.Int64
	calls atomic.Int64
	// free are groupCalls to reuse: one goes back once its Commit received
	// its answer (a Commit that gave up keeps its call, which flush still
	// answers). The Group's own, not the process's: a channel made inside
	// a testing/synctest bubble must never reach another Group.
	free sync.Pool
}

var _ AsyncCommitter = (*Group)(nil)

type groupCall struct {
	ops []Op
	err error
	// done gets one value when err is set; async, if set, hears err
	// instead (CommitAsync).
	done  chan struct{}
	async Completion
}

// newGroupCall makes a groupCall for Group.free.
func newGroupCall() any { return &groupCall{done: make(chan struct{}, 1)} }

// NewGroup wraps c. timeout bounds each shared transaction (callers' own
// contexts cannot, since a transaction serves many callers): each gets at
// least nine tenths of it and at most all of it, so that one context serves
// the transactions of a tenth of it. 0 means 30s.
func NewGroup(c Catalog, timeout time.Duration) *Group {
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	return &Group{c: c, timeout: timeout, kick: make(chan struct{}, 1), lingerFor: Linger, free: sync.Pool{New: newGroupCall}}
}

// Linger is how long the flusher waits for another Commit once the queue is
// empty, before it exits: longer than the gap between a broadcast's two
// commits, short enough that an idle Group holds no goroutine for long.
const Linger = 100 * time.Millisecond

// Close ends the flusher if it waits for Commits, and makes it exit as soon
// as the queue is empty from then on. Commits still work after Close (the
// wrapped catalog decides whether it takes them).
func (g *Group) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	g.wake()
}

// Commit queues ops for the next shared transaction and waits for it. If ctx
// ends first, Commit returns ctx.Err(), an ambiguous error: the ops may still
// be committed.
func (g *Group) Commit(ctx context.Context, ops ...Op) error {
	if err := Check(g.c.Limits(), ops); err != nil {
		return err
	}
	call := g.free.Get().(*groupCall)
	call.ops = ops
	g.enqueue(call)
	select {
	case <-call.done:
		err := call.err
		*call = groupCall{done: call.done}
		g.free.Put(call)
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// CommitAsync queues ops for the next shared transaction and returns; done
// hears the transaction's answer (see AsyncCommitter). It returns an error
// only if ops do not pass Check.
func (g *Group) CommitAsync(done Completion, ops ...Op) error {
	if err := Check(g.c.Limits(), ops); err != nil {
		return err
	}
	call := g.free.Get().(*groupCall)
	call.ops, call.async = ops, done
	g.enqueue(call)
	return nil
}

// enqueue queues call and starts the flusher if none runs.
func (g *Group) enqueue(call *groupCall) {
	g.calls.Add(1)
	g.mu.Lock()
	g.queue = append(g.queue, call)
	if !g.flushing {
		g.flushing = true
		go g.flush()
	}
	g.wake()
	g.mu.Unlock()
}

// wake wakes the flusher if it waits. Caller holds g.mu.
func (g *Group) wake() {
	if g.idle {
		g.idle = false
		g.kick <- struct{}{} // never blocks: one kick per wait
	}
}

// flush commits queued calls until the queue has stayed empty for Linger
// (or is empty after Close), then exits.
func (g *Group) flush() {
	lim := g.c.Limits()
	for {
		g.mu.Lock()
		batch, n := g.take(lim)
		if len(batch) == 0 {
			if !g.wait() {
				return
			}
			continue
		}
		g.mu.Unlock()
		ops := batch[0].ops
		if len(batch) > 1 {
			ops = slices.Grow(g.ops[:0], n)
			for _, c := range batch {
				ops = append(ops, c.ops...)
			}
		}
		err := g.c.Commit(g.txnContext(), ops...)
		g.trips.Add(1)
		for _, c := range batch {
			if done := c.async; done != nil {
				*c = groupCall{done: c.done}
				g.free.Put(c)
				done.Committed(err)
				continue
			}
			c.err = err
			c.done <- struct{}{}
		}
		// Kept for the next batch, without what they point to.
		clear(batch)
		g.batch = batch[:0]
		if len(batch) > 1 {
			clear(ops)
			g.ops = ops[:0]
		}
	}
}

// wait, called with g.mu held and released, waits for a Commit (or Close)
// for at most Linger. It returns true if the flusher is to look at the
// queue again, false if it is to exit (flushing is then off).
func (g *Group) wait() bool {
	if g.closed {
		g.flushing = false
		g.mu.Unlock()
		return false
	}
	g.idle = true
	g.mu.Unlock()
	if g.lingerT == nil {
		g.lingerT = time.NewTimer(g.lingerFor)
	} else {
		g.lingerT.Reset(g.lingerFor)
	}
	select {
	case <-g.kick:
		g.lingerT.Stop()
		return true
	case <-g.lingerT.C:
	}
	g.mu.Lock()
	if g.idle { // no Commit came: exit
		g.idle = false
		g.flushing = false
		g.mu.Unlock()
		return false
	}
	g.mu.Unlock()
	<-g.kick // sent under g.mu when idle went false
	return true
}

// txnContext returns the context of the flusher's next transaction: it has
// at least nine tenths of the timeout left.
func (g *Group) txnContext() context.Context {
	if now := time.Now(); g.txn == nil || g.txnEnd.Sub(now) < g.timeout-g.timeout/10 || g.txn.Err() != nil {
		if g.txnStop != nil {
			g.txnStop()
		}
		g.txnEnd = now.Add(g.timeout)
		g.txn, g.txnStop = context.WithDeadline(context.Background(), g.txnEnd)
	}
	return g.txn
}

// take removes from the queue the longest prefix of calls that fits one
// transaction with distinct keys, and returns it with its number of ops. The
// first call always fits (Commit checked it alone). Caller holds g.mu.
func (g *Group) take(lim Limits) (batch []*groupCall, ops int) {
	n, bytes := 0, 0
	var keys map[string]struct{} // filled once a second call is considered
	for _, c := range g.queue {
		size := Size(c.ops)
		if n > 0 {
			if ops+len(c.ops) > lim.MaxOps || bytes+size > lim.MaxBytes {
				break
			}
			if keys == nil {
				if g.keys == nil {
					g.keys = make(map[string]struct{}, ops+len(c.ops))
				}
				keys = g.keys
				defer clear(keys)
				addKeys(keys, g.queue[0].ops)
			}
			if !addKeys(keys, c.ops) {
				break
			}
		}
		n++
		ops += len(c.ops)
		bytes += size
	}
	batch = append(g.batch[:0], g.queue[:n]...)
	g.batch = nil // the flusher's until it gives it back
	rest := copy(g.queue, g.queue[n:])
	clear(g.queue[rest:])
	g.queue = g.queue[:rest]
	return batch, ops
}

// addKeys adds the keys of ops to keys; it reports false, leaving keys
// partly updated, if one was there already.
func addKeys(keys map[string]struct{}, ops []Op) bool {
	for _, o := range ops {
		if _, ok := keys[o.Key]; ok {
			return false
		}
		keys[o.Key] = struct{}{}
	}
	return true
}

// Get reads from the wrapped catalog.
func (g *Group) Get(ctx context.Context, key string) ([]byte, error) { return g.c.Get(ctx, key) }

// List reads from the wrapped catalog.
func (g *Group) List(ctx context.Context, prefix string, fn func(string, []byte) error) error {
	return g.c.List(ctx, prefix, fn)
}

// Limits are the wrapped catalog's.
func (g *Group) Limits() Limits { return g.c.Limits() }

// RoundTrips returns how many transactions Group sent to the wrapped catalog,
// and how many Commits it was given.
func (g *Group) RoundTrips() (trips, commits int64) { return g.trips.Load(), g.calls.Load() }
