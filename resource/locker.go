package resource

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Locker is a Table that callers can wait on: a table of shared/exclusive
// locks on resource keys, safe for concurrent use. It stamps grants and
// waits for introspection (Snapshot) with a coarse clock, at most about a
// millisecond old (coarseClock). The zero value is not usable; create one
// with NewLocker.
type Locker struct {
	mu    sync.Mutex
	t     Table       // protected by mu, as is everything reachable from it
	clock coarseClock // the table's Now
	// free holds the states of released guards for the next Lock to reuse,
	// at most maxFree of them; protected by mu.
	free []*lockState
}

// maxFree bounds how many released lock states a Locker keeps for reuse.
const maxFree = 128

// NewLocker returns an empty lock table.
func NewLocker() *Locker {
	l := &Locker{}
	l.t.Now = l.clock.now
	return l
}

// lockState is the part of a guard that the lock table points to while the
// guard holds or waits for keys, so it cannot move: it lives on the heap.
// Allocating one per Lock was, with the garbage collector's share of it,
// about 40% of an uncontended Lock + Unlock, so the Locker reuses it once
// released. A Guard is a value that outlives its Unlock (a second Unlock,
// Keys afterwards), so it remembers the generation of the state it was
// given: after the state's release bumps the generation, the state is no
// longer that guard's, and the guard's Unlock and SetOwner do nothing.
type lockState struct {
	l     *Locker       // fixed at creation
	r     Request       // Ref is this lockState
	gen   uint64        // bumped by each release; protected by l.mu
	ready chan struct{} // closed when granted, for a waiting Lock; protected by l.mu
}

// Guard holds the keys of one successful Lock or TryLock. It is a small
// value: copies of it are the same guard (the first Unlock of any of them
// releases the keys, later ones do nothing). The zero Guard, which Lock and
// TryLock return with an error, holds nothing.
type Guard struct {
	st  *lockState
	gen uint64 // st.gen when st was given to this guard
	// The normalised keys: the first n of small, or all of more when there
	// are more than len(small) of them. The guard keeps its own copy so that
	// Keys after Unlock does not read a state another Lock reuses.
	n     int
	small [3]Key
	more  []Key
}

// epoch anchors the Locker's clock: reading the monotonic clock since epoch
// costs about half of time.Now.
var (
	epoch      = time.Now()
	epochNanos = epoch.UnixNano()
)

func monoNow() int64 { return epochNanos + int64(time.Since(epoch)) }

// coarseTick is how often a coarseClock in use reads the clock.
const coarseTick = time.Millisecond

// coarseClock is the Locker's clock for grant and wait times, which only
// introspection reads (R3.7: hold and wait ages): a reading at most about
// coarseTick old serves it. Reading the system clock was a tenth of an
// uncontended Lock + Unlock (a clock read costs 60-90 ns on some virtual
// machines); a coarseClock is read with an atomic load. While it is read,
// a timer refreshes it every coarseTick; a tick that finds it unread since
// the last one stops the timer, so an idle Locker costs nothing, and the
// next read after that reads the system clock itself and starts the timer
// again. The zero value is ready to use.
type coarseClock struct {
	nanos   atomic.Int64 // the last reading, Unix nanoseconds
	ticking atomic.Bool  // a refresh is scheduled
	read    atomic.Bool  // read since the last refresh
}

// now returns the time, at most about coarseTick old.
func (c *coarseClock) now() int64 {
	if c.ticking.Load() {
		if !c.read.Load() {
			c.read.Store(true)
		}
		return c.nanos.Load()
	}
	n := monoNow()
	c.nanos.Store(n)
	if c.ticking.CompareAndSwap(false, true) {
		time.AfterFunc(coarseTick, c.refresh)
	}
	return n
}

// refresh is the timer's: it reads the clock and schedules the next
// refresh, unless nobody read the clock since the last one.
func (c *coarseClock) refresh() {
	c.nanos.Store(monoNow())
	if c.read.Swap(false) {
		time.AfterFunc(coarseTick, c.refresh)
		return
	}
	c.ticking.Store(false)
}

// newGuard validates and normalises keys into a guard that has no state
// yet. It touches no Locker, so it needs no lock, and it allocates nothing
// for up to three keys.
func newGuard(keys []Key) (Guard, error) {
	var g Guard
	for i := range keys {
		if err := keys[i].Validate(); err != nil {
			return Guard{}, err
		}
	}
	if len(keys) <= len(g.small) {
		copy(g.small[:], keys)
		g.n = len(normalize(g.small[:len(keys)]))
		return g, nil
	}
	g.more = normalize(slices.Clone(keys))
	g.n = len(g.more)
	return g, nil
}

// take gives g a lock state, a released one if there is one, with g's
// keys. Caller holds l.mu.
func (l *Locker) take(g *Guard) *lockState {
	st := l.state()
	if g.more != nil {
		st.r.setKeys(nil, g.more)
	} else {
		st.r.setKeys(g.small[:g.n], nil)
	}
	g.st, g.gen = st, st.gen
	return st
}

// state returns a released lock state, or a new one. Caller holds l.mu.
func (l *Locker) state() *lockState {
	if n := len(l.free); n > 0 {
		st := l.free[n-1]
		l.free[n-1] = nil
		l.free = l.free[:n-1]
		return st
	}
	st := &lockState{l: l}
	st.r.Ref = st
	return st
}

// release gives back everything st holds or waits for, ends its guard's
// generation and keeps st for reuse. Caller holds l.mu.
func (l *Locker) release(st *lockState) {
	granted := l.t.Release(&st.r)
	l.recycle(st)
	for _, r := range granted {
		close(r.Ref.(*lockState).ready)
	}
}

// recycle ends st's generation and keeps it for reuse, without the keys'
// names (which the free list would otherwise keep alive). Caller holds
// l.mu, and st holds and waits for nothing.
func (l *Locker) recycle(st *lockState) {
	st.gen++
	st.r = Request{Ref: st}
	st.ready = nil
	if len(l.free) < maxFree {
		l.free = append(l.free, st)
	}
}

// Lock acquires every key, blocking until it can, and returns the guard that
// releases them. Keys are normalised first (see Normalize). If ctx ends while
// waiting, Lock gives back whatever it acquired and returns ctx.Err(). An
// invalid key is reported with ErrInvalidKey before anything is acquired.
func (l *Locker) Lock(ctx context.Context, keys ...Key) (Guard, error) {
	g, err := newGuard(keys)
	if err != nil {
		return Guard{}, err
	}
	if err := ctx.Err(); err != nil {
		return Guard{}, err
	}
	l.mu.Lock()
	st := l.take(&g)
	return l.acquire(ctx, g, st)
}

// acquire acquires st's keys for g, blocking until it can, as Lock does.
// Caller holds l.mu, which acquire releases.
func (l *Locker) acquire(ctx context.Context, g Guard, st *lockState) (Guard, error) {
	if l.t.Acquire(&st.r) {
		l.mu.Unlock()
		return g, nil
	}
	ready := make(chan struct{})
	st.ready = ready
	l.mu.Unlock()
	select {
	case <-ready:
		return g, nil
	case <-ctx.Done():
		l.mu.Lock()
		l.release(st)
		l.mu.Unlock()
		return Guard{}, ctx.Err()
	}
}

// TryLock acquires every key without blocking, or nothing. It fails with an
// error wrapping ErrConflict only when some key is held in a conflicting mode;
// queued waiters do not make it fail (see the package documentation for why).
func (l *Locker) TryLock(keys ...Key) (Guard, error) {
	g, err := newGuard(keys)
	if err != nil {
		return Guard{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tryAcquire(g, l.take(&g))
}

// tryAcquire acquires st's keys for g without blocking, or nothing, as
// TryLock does. Caller holds l.mu.
func (l *Locker) tryAcquire(g Guard, st *lockState) (Guard, error) {
	if err := l.t.TryAcquire(&st.r); err != nil {
		l.recycle(st) // it holds nothing
		return Guard{}, err
	}
	return g, nil
}

// Unlock releases every key, in reverse acquisition order. Only the first
// call on the guard or any copy of it does anything; Unlock on a nil or zero
// guard is a no-op.
func (g *Guard) Unlock() {
	if g == nil || g.st == nil {
		return
	}
	l := g.st.l
	l.mu.Lock()
	if g.st.gen == g.gen {
		l.release(g.st)
	}
	l.mu.Unlock()
}

// Keys returns the normalised keys the guard holds (or held).
func (g *Guard) Keys() []Key {
	if g == nil {
		return nil
	}
	if g.more != nil {
		return slices.Clone(g.more)
	}
	return slices.Clone(g.small[:g.n])
}

// SetOwner labels the guard for introspection, e.g. "broadcast 42". After
// Unlock it does nothing.
func (g *Guard) SetOwner(owner string) {
	if g == nil || g.st == nil {
		return
	}
	l := g.st.l
	l.mu.Lock()
	if g.st.gen == g.gen {
		g.st.r.Owner = owner
	}
	l.mu.Unlock()
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

// ErrKeySetClosed is the error of locking a KeySet after its Close.
var ErrKeySetClosed = errors.New("resource: key set closed")

// KeySet is a set of keys interned in a Locker: validated, normalised and
// resolved to the Locker's table entries once, so that locking the same
// keys again and again skips that work (validating, sorting and looking up
// the keys is about half of an uncontended Lock + Unlock). Lock and
// TryLock behave as the Locker's own with the same keys, and their guards
// are the same guards. The set keeps its keys' entries in the Locker's
// table until Close. Create one with Locker.Intern; it is safe for
// concurrent use.
type KeySet struct {
	l    *Locker
	keys []Key    // normalised; never changed
	ents []*entry // the entries of keys, pinned in l.t
	// closed is set by Close; protected by l.mu.
	closed bool
}

// Intern validates and normalises keys (see Normalize) into a KeySet of l.
// An invalid key is reported with ErrInvalidKey.
func (l *Locker) Intern(keys ...Key) (*KeySet, error) {
	norm, err := Normalize(keys)
	if err != nil {
		return nil, err
	}
	s := &KeySet{l: l, keys: norm, ents: make([]*entry, len(norm))}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, k := range norm {
		s.ents[i] = l.t.pin(k)
	}
	return s, nil
}

// Keys returns the set's normalised keys.
func (s *KeySet) Keys() []Key { return slices.Clone(s.keys) }

// Lock acquires the set's keys as Locker.Lock does. After Close it fails
// with ErrKeySetClosed.
func (s *KeySet) Lock(ctx context.Context) (Guard, error) {
	if err := ctx.Err(); err != nil {
		return Guard{}, err
	}
	l := s.l
	l.mu.Lock()
	if s.closed {
		l.mu.Unlock()
		return Guard{}, ErrKeySetClosed
	}
	g := s.guard()
	return l.acquire(ctx, g, g.st)
}

// TryLock acquires the set's keys as Locker.TryLock does. After Close it
// fails with ErrKeySetClosed.
func (s *KeySet) TryLock() (Guard, error) {
	l := s.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if s.closed {
		return Guard{}, ErrKeySetClosed
	}
	g := s.guard()
	return l.tryAcquire(g, g.st)
}

// guard returns a guard of the set's keys with a lock state. Caller holds
// s.l.mu.
func (s *KeySet) guard() Guard {
	st := s.l.state()
	st.r.setPinned(s.keys, s.ents)
	return Guard{st: st, gen: st.gen, n: len(s.keys), more: s.keys}
}

// Close lets the Locker forget the set's entries once nobody holds or
// waits for them. Guards of the set stay valid (their Unlock releases
// their keys), and a Lock of the set waiting at Close goes on. Closing
// twice does nothing.
func (s *KeySet) Close() {
	l := s.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	for _, e := range s.ents {
		l.t.unpin(e)
	}
}
