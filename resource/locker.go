package resource

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Locker is a Table that callers can wait on: a table of shared/exclusive
// locks on resource keys, safe for concurrent use. The zero value is not
// usable; create one with NewLocker.
type Locker struct {
	mu sync.Mutex
	t  Table // protected by mu, as is everything reachable from it
}

// NewLocker returns an empty lock table.
func NewLocker() *Locker { return &Locker{t: Table{Now: monoNow}} }

// Guard holds the keys of one successful Lock or TryLock.
type Guard struct {
	l        *Locker
	r        Request
	ready    chan struct{} // closed when granted, for a waiting Lock
	unlocked atomic.Bool
}

// epoch anchors the Locker's clock: reading the monotonic clock since epoch
// costs about half of time.Now, and the uncontended Lock path reads it once.
var (
	epoch      = time.Now()
	epochNanos = epoch.UnixNano()
)

func monoNow() int64 { return epochNanos + int64(time.Since(epoch)) }

func (l *Locker) newGuard(keys []Key) (*Guard, error) {
	g := &Guard{l: l}
	g.r.Ref = g
	if err := l.t.initRequest(&g.r, keys); err != nil {
		return nil, err
	}
	return g, nil
}

// Lock acquires every key, blocking until it can, and returns the guard that
// releases them. Keys are normalised first (see Normalize). If ctx ends while
// waiting, Lock gives back whatever it acquired and returns ctx.Err(). An
// invalid key is reported with ErrInvalidKey before anything is acquired.
func (l *Locker) Lock(ctx context.Context, keys ...Key) (*Guard, error) {
	g, err := l.newGuard(keys)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.t.Acquire(&g.r) {
		l.mu.Unlock()
		return g, nil
	}
	g.ready = make(chan struct{})
	l.mu.Unlock()
	select {
	case <-g.ready:
		return g, nil
	case <-ctx.Done():
		l.mu.Lock()
		l.wake(l.t.Release(&g.r))
		l.mu.Unlock()
		return nil, ctx.Err()
	}
}

// wake signals the guards of granted requests. Caller holds l.mu.
func (l *Locker) wake(granted []*Request) {
	for _, r := range granted {
		close(r.Ref.(*Guard).ready)
	}
}

// TryLock acquires every key without blocking, or nothing. It fails with an
// error wrapping ErrConflict only when some key is held in a conflicting mode;
// queued waiters do not make it fail (see the package documentation for why).
func (l *Locker) TryLock(keys ...Key) (*Guard, error) {
	g, err := l.newGuard(keys)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.t.TryAcquire(&g.r); err != nil {
		return nil, err
	}
	return g, nil
}

// Unlock releases every key, in reverse acquisition order. Only the first call
// does anything; Unlock on a nil guard is a no-op.
func (g *Guard) Unlock() {
	if g == nil || !g.unlocked.CompareAndSwap(false, true) {
		return
	}
	g.l.mu.Lock()
	g.l.wake(g.l.t.Release(&g.r))
	g.l.mu.Unlock()
}

// Keys returns the normalised keys the guard holds (or held).
func (g *Guard) Keys() []Key { return g.r.Keys() }

// SetOwner labels the guard for introspection, e.g. "broadcast 42".
func (g *Guard) SetOwner(owner string) {
	g.l.mu.Lock()
	g.r.Owner = owner
	g.l.mu.Unlock()
}

// Snapshot lists every key that is held or waited for, ordered by (domain,
// name), with holders oldest first.
func (l *Locker) Snapshot() []KeyState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.t.Snapshot()
}

// Len returns how many (domain, name) entries are held or awaited. A lock table
// with nothing held and nobody waiting has Len 0.
func (l *Locker) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.t.Len()
}
