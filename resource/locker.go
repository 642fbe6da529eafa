package resource

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Locker is a table of shared/exclusive locks on resource keys. The zero value
// is not usable; create one with NewLocker. A Locker is safe for concurrent use.
type Locker struct {
	mu sync.Mutex
	// table holds an entry for every (domain, name) that is held or waited
	// for, and recently idle ones: an entry that empties stays (so that
	// locking the same key again costs one lookup and no allocation) until
	// more than maxIdle entries are idle, when idle entries are swept.
	// Protected by mu, as is everything reachable from it.
	table  map[lockID]*entry
	idle   int
	nextID uint64
}

// maxIdle bounds how many idle entries the table keeps.
const maxIdle = 256

type lockID struct {
	domain Domain
	name   string
}

// entry is the state of one (domain, name).
//
// Invariant (checked by promote): if waiters is not empty, its head is
// incompatible with the current holders. New Lock requests queue behind any
// waiter, which is what makes Lock fair.
type entry struct {
	shared    int  // number of shared holders
	exclusive bool // an exclusive holder exists
	holders   []holding
	waiters   []*waiter
	counted   bool // counted in Locker.idle
}

type holding struct {
	g     *Guard
	mode  Mode
	since mono
}

type waiter struct {
	g       *Guard
	mode    Mode
	since   mono
	ready   chan struct{} // closed when granted
	granted bool          // protected by Locker.mu
}

// mono is a monotonic instant: nanoseconds since epoch. Reading it costs about
// half of time.Now, and the uncontended Lock path reads it once.
type mono int64

var epoch = time.Now()

func monoNow() mono { return mono(time.Since(epoch)) }

func (m mono) time() time.Time { return epoch.Add(time.Duration(m)) }

// NewLocker returns an empty lock table.
func NewLocker() *Locker {
	return &Locker{table: make(map[lockID]*entry)}
}

// Guard holds the keys of one successful Lock or TryLock.
type Guard struct {
	l  *Locker
	id uint64
	// keys are normalised, in acquisition order; ents[i] is the table entry of
	// keys[i] while it is held. Both are fixed once the guard is returned.
	keys []Key
	ents []*entry
	// held counts the keys acquired so far (all of them once returned).
	held     int
	owner    string // protected by l.mu
	unlocked atomic.Bool
	small    [3]Key
	smallE   [3]*entry
}

func (l *Locker) newGuard(keys []Key) (*Guard, error) {
	for i := range keys {
		if err := keys[i].Validate(); err != nil {
			return nil, err
		}
	}
	g := &Guard{l: l}
	if len(keys) <= len(g.small) {
		g.keys = g.small[:len(keys)]
		g.ents = g.smallE[:0]
	} else {
		g.keys = make([]Key, len(keys))
	}
	copy(g.keys, keys)
	g.keys = normalize(g.keys)
	if cap(g.ents) < len(g.keys) {
		g.ents = make([]*entry, 0, len(g.keys))
	}
	g.ents = g.ents[:len(g.keys)]
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
	now := monoNow()
	l.mu.Lock()
	l.nextID++
	g.id = l.nextID
	for i, k := range g.keys {
		e := l.entryFor(k)
		l.use(e)
		if len(e.waiters) == 0 && e.compatible(k.Mode) {
			e.grant(g, k.Mode, now)
			g.ents[i] = e
			g.held++
			continue
		}
		w := &waiter{g: g, mode: k.Mode, since: now, ready: make(chan struct{})}
		e.waiters = append(e.waiters, w)
		l.mu.Unlock()
		select {
		case <-w.ready:
			now = monoNow()
			l.mu.Lock()
		case <-ctx.Done():
			l.mu.Lock()
			if !w.granted {
				e.removeWaiter(w)
				l.promote(e)
				l.maybeFree(e)
				g.releaseLocked()
				l.mu.Unlock()
				return nil, ctx.Err()
			}
			// Granted while we were being cancelled: count it so that
			// releaseLocked gives it back with the rest.
			g.ents[i] = e
			g.held++
			g.releaseLocked()
			l.mu.Unlock()
			return nil, ctx.Err()
		}
		g.ents[i] = e
		g.held++
	}
	l.mu.Unlock()
	return g, nil
}

// TryLock acquires every key without blocking, or nothing. It fails with an
// error wrapping ErrConflict only when some key is held in a conflicting mode;
// queued waiters do not make it fail (see the package documentation for why).
func (l *Locker) TryLock(keys ...Key) (*Guard, error) {
	g, err := l.newGuard(keys)
	if err != nil {
		return nil, err
	}
	now := monoNow()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range g.keys {
		if e, ok := l.table[lockID{k.Domain, k.Name}]; ok && !e.compatible(k.Mode) {
			return nil, fmt.Errorf("%w: %s is held by %s", ErrConflict, k, e.describeHolders())
		}
	}
	l.nextID++
	g.id = l.nextID
	for i, k := range g.keys {
		e := l.entryFor(k)
		l.use(e)
		e.grant(g, k.Mode, now)
		g.ents[i] = e
		g.held++
	}
	return g, nil
}

// entryFor returns the entry of k, creating it if needed. Caller holds l.mu.
func (l *Locker) entryFor(k Key) *entry {
	id := lockID{k.Domain, k.Name}
	if e, ok := l.table[id]; ok {
		return e
	}
	e := &entry{}
	l.table[id] = e
	return e
}

// use marks e busy before a grant or enqueue. Caller holds l.mu.
func (l *Locker) use(e *entry) {
	if e.counted {
		e.counted = false
		l.idle--
	}
}

// maybeFree counts e as idle once nobody holds or waits for it, and sweeps
// idle entries when there are too many.
func (l *Locker) maybeFree(e *entry) {
	if e.counted || !e.idle() {
		return
	}
	e.counted = true
	l.idle++
	if l.idle <= maxIdle {
		return
	}
	for id, e := range l.table {
		if e.idle() {
			delete(l.table, id)
		}
	}
	l.idle = 0
}

func (e *entry) idle() bool { return e.shared == 0 && !e.exclusive && len(e.waiters) == 0 }

// promote grants queued waiters from the head of e's queue while they are
// compatible with the holders. Caller holds l.mu.
func (l *Locker) promote(e *entry) {
	if len(e.waiters) == 0 {
		return
	}
	now := monoNow()
	n := 0
	for n < len(e.waiters) && e.compatible(e.waiters[n].mode) {
		w := e.waiters[n]
		e.grant(w.g, w.mode, now)
		w.granted = true
		close(w.ready)
		n++
	}
	if n > 0 {
		rest := copy(e.waiters, e.waiters[n:])
		clear(e.waiters[rest:])
		e.waiters = e.waiters[:rest]
	}
}

func (e *entry) compatible(m Mode) bool {
	if m == Exclusive {
		return !e.exclusive && e.shared == 0
	}
	return !e.exclusive
}

func (e *entry) grant(g *Guard, m Mode, now mono) {
	if m == Exclusive {
		e.exclusive = true
	} else {
		e.shared++
	}
	e.holders = append(e.holders, holding{g: g, mode: m, since: now})
}

func (e *entry) release(g *Guard, m Mode) {
	if m == Exclusive {
		e.exclusive = false
	} else {
		e.shared--
	}
	for i := range e.holders {
		if e.holders[i].g == g {
			last := len(e.holders) - 1
			e.holders[i] = e.holders[last]
			e.holders[last] = holding{}
			e.holders = e.holders[:last]
			return
		}
	}
}

func (e *entry) removeWaiter(w *waiter) {
	if i := slices.Index(e.waiters, w); i >= 0 {
		e.waiters = slices.Delete(e.waiters, i, i+1)
	}
}

func (e *entry) describeHolders() string {
	parts := make([]string, 0, len(e.holders))
	for _, h := range e.holders {
		parts = append(parts, h.g.label()+"@"+h.mode.String())
	}
	return strings.Join(parts, ", ")
}

// releaseLocked gives back the keys held so far, in reverse order. Caller
// holds l.mu.
func (g *Guard) releaseLocked() {
	for i := g.held - 1; i >= 0; i-- {
		k, e := g.keys[i], g.ents[i]
		e.release(g, k.Mode)
		g.l.promote(e)
		g.l.maybeFree(e)
		g.ents[i] = nil
	}
	g.held = 0
}

// Unlock releases every key, in reverse acquisition order. Only the first call
// does anything; Unlock on a nil guard is a no-op.
func (g *Guard) Unlock() {
	if g == nil || !g.unlocked.CompareAndSwap(false, true) {
		return
	}
	g.l.mu.Lock()
	g.releaseLocked()
	g.l.mu.Unlock()
}

// Keys returns the normalised keys the guard holds (or held).
func (g *Guard) Keys() []Key { return slices.Clone(g.keys) }

// SetOwner labels the guard for introspection, e.g. "broadcast 42".
func (g *Guard) SetOwner(owner string) {
	g.l.mu.Lock()
	g.owner = owner
	g.l.mu.Unlock()
}

// label is the owner, or "guard #<id>" if none was set. Caller holds l.mu.
func (g *Guard) label() string {
	if g.owner != "" {
		return g.owner
	}
	return fmt.Sprintf("guard #%d", g.id)
}

// KeyState is the state of one locked or awaited (domain, name).
type KeyState struct {
	Domain  Domain
	Name    string
	Holders []Holder
	// Waiters are in queue order: the first is granted next.
	Waiters []Holder
}

// Holder is one holder or waiter of a key.
type Holder struct {
	Owner string
	Mode  Mode
	// Since is when the key was granted (holders) or requested (waiters).
	Since time.Time
}

// Snapshot lists every key that is held or waited for, ordered by (domain,
// name), with holders oldest first.
func (l *Locker) Snapshot() []KeyState {
	l.mu.Lock()
	out := make([]KeyState, 0, len(l.table))
	for id, e := range l.table {
		if e.idle() {
			continue
		}
		ks := KeyState{Domain: id.domain, Name: id.name}
		for _, h := range e.holders {
			ks.Holders = append(ks.Holders, Holder{Owner: h.g.label(), Mode: h.mode, Since: h.since.time()})
		}
		for _, w := range e.waiters {
			ks.Waiters = append(ks.Waiters, Holder{Owner: w.g.label(), Mode: w.mode, Since: w.since.time()})
		}
		out = append(out, ks)
	}
	l.mu.Unlock()
	slices.SortFunc(out, func(a, b KeyState) int {
		return less(Key{Domain: a.Domain, Name: a.Name}, Key{Domain: b.Domain, Name: b.Name})
	})
	for i := range out {
		slices.SortFunc(out[i].Holders, func(a, b Holder) int { return a.Since.Compare(b.Since) })
	}
	return out
}

// Len returns how many (domain, name) entries are held or awaited. A lock table
// with nothing held and nobody waiting has Len 0.
func (l *Locker) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.table) - l.idle
}
