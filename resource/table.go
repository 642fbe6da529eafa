package resource

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Table is the lock table behind Locker, as a plain data structure: no
// goroutines, no clock, no blocking. A caller that cannot wait (the
// broadcast engine's decision core, a simulator) uses it directly and learns
// from the return values which requests were granted; Locker adds the
// waiting. The time of each grant and wait comes from the Now function the
// table's user sets (Unix nanoseconds); it is only kept for introspection
// (R3.7), and read only when something is granted or queued.
//
// A Request acquires its keys in their normalised order (R3.3). When a key
// is held in a conflicting mode, or another request already waits for it,
// the request queues on that key, keeping the keys it holds; so a request
// that waits never overtakes an earlier one (fairness, R3.5) and ordered
// acquisition rules out deadlock. TryAcquire fails only on a key actually
// held in a conflicting mode, not because someone waits for it.
//
// A Table is not safe for concurrent use; the zero value is ready to use.
type Table struct {
	// Now returns the current time in Unix nanoseconds; nil reads 0.
	Now func() int64
	// doms holds, per domain, an entry for every name that is held or
	// waited for, and recently idle ones: an entry that empties stays (so
	// that locking the same key again costs one lookup and no allocation)
	// until more than maxIdle entries are idle, when idle entries are swept.
	// One string-keyed map per domain (a handful of domains, scanned) hashes
	// only the name: a map keyed by (domain, name) hashed both, and the
	// lookups were a quarter of an uncontended Lock + Unlock.
	doms    []domainEntries
	entries int // entries over all domains
	idle    int // idle entries counted for the sweep (entry.counted)
	parked  int // idle entries kept because they are pinned (entry.parked)
	nextID  uint64
}

// maxIdle bounds how many idle entries the table keeps.
const maxIdle = 256

type domainEntries struct {
	d Domain
	m map[string]*entry
}

// entry is the state of one (domain, name).
//
// Invariant: if waiters is not empty, its head is incompatible with the
// current holders. New requests queue behind any waiter, which is what makes
// the table fair.
type entry struct {
	domain    Domain
	name      string
	shared    int  // number of shared holders
	exclusive bool // an exclusive holder exists
	holders   []holding
	waiters   []waiting
	counted   bool // idle, counted in Table.idle
	// pins counts the interned key sets (Locker.Intern) that point at the
	// entry: it is never swept while pinned, and an idle pinned entry is
	// parked (counted in Table.parked) instead of counted.
	pins   int
	parked bool
	// gone is set when the sweep removed the entry from its map: a
	// request that still points at it (one of a key set closed while the
	// request waited) resolves its key again.
	gone bool
}

type holding struct {
	r     *Request
	mode  Mode
	since int64
}

type waiting struct {
	r     *Request
	mode  Mode
	since int64
}

// Request is one multi-key acquisition in a Table. Create it with
// NewRequest; it is used once.
type Request struct {
	// Ref is the caller's: the table reads it only to label the request
	// when Owner is empty and Ref is an OwnerLabeler. Locker keeps its
	// Guard there; the engine its handle or task.
	Ref any
	// Owner labels the request in Snapshot and conflict errors
	// ("broadcast 42"); if empty, an OwnerLabeler Ref labels it, else it
	// shows as "guard #<n>".
	Owner string

	id uint64
	// keys are normalised, in acquisition order; ents[i] is the entry of
	// keys[i] while it is held.
	keys []Key
	ents []*entry
	// pinned, if set, are the entries of keys, resolved and pinned
	// beforehand (an interned key set's): no lookup is needed.
	pinned []*entry
	// held counts the keys acquired so far; waitingOn is the entry this
	// request is queued on, nil if none.
	held      int
	waitingOn *entry
	done      bool // released or cancelled
	small     [3]Key
	smallE    [3]*entry
}

// NewRequest validates and normalises keys (see Normalize) into a request of
// t. An invalid key is reported with ErrInvalidKey.
func (t *Table) NewRequest(keys []Key) (*Request, error) {
	r := &Request{}
	if err := t.initRequest(r, keys); err != nil {
		return nil, err
	}
	return r, nil
}

// InitRequest is NewRequest into r, a zero Request the caller owns (one it
// embeds in a struct of its own, saving an allocation). r must not be used
// by another request of any table.
func (t *Table) InitRequest(r *Request, keys []Key) error { return t.initRequest(r, keys) }

// initRequest fills r in; Locker embeds a Request in its guard to save an
// allocation. It touches nothing of t, so it needs no lock.
func (t *Table) initRequest(r *Request, keys []Key) error {
	for i := range keys {
		if err := keys[i].Validate(); err != nil {
			return err
		}
	}
	if len(keys) <= len(r.small) {
		r.keys = r.small[:len(keys)]
		r.ents = r.smallE[:0]
	} else {
		r.keys = make([]Key, len(keys))
	}
	copy(r.keys, keys)
	r.keys = normalize(r.keys)
	if cap(r.ents) < len(r.keys) {
		r.ents = make([]*entry, 0, len(r.keys))
	}
	r.ents = r.ents[:len(r.keys)]
	return nil
}

// setKeys makes already normalised keys r's, for Locker, which normalises
// them outside its lock and reuses requests: small ones are copied into r,
// more (which nobody changes afterwards) becomes r's own. Copying small
// keeps the caller's array (a Guard on its stack) from escaping.
func (r *Request) setKeys(small, more []Key) {
	if more != nil {
		r.keys = more
		r.ents = make([]*entry, len(more))
		return
	}
	r.keys = r.small[:copy(r.small[:], small)]
	r.ents = r.smallE[:len(r.keys)]
}

// setPinned makes keys, already normalised, and their pinned entries r's.
// Nobody changes either afterwards.
func (r *Request) setPinned(keys []Key, ents []*entry) {
	r.keys, r.pinned = keys, ents
	if len(keys) <= len(r.smallE) {
		r.ents = r.smallE[:len(keys)]
	} else {
		r.ents = make([]*entry, len(keys))
	}
}

// pinnedEntry returns the pinned entry of r's i-th key, nil if r has no
// pinned entries or the sweep removed this one (r's key set was closed).
func (r *Request) pinnedEntry(i int) *entry {
	if r.pinned != nil && !r.pinned[i].gone {
		return r.pinned[i]
	}
	return nil
}

// entryOf returns the entry of r's i-th key, creating it if needed.
func (t *Table) entryOf(r *Request, i int) *entry {
	if e := r.pinnedEntry(i); e != nil {
		return e
	}
	return t.entryFor(r.keys[i])
}

// number gives r its id, the first time it is used.
func (t *Table) number(r *Request) {
	if r.id == 0 {
		t.nextID++
		r.id = t.nextID
	}
}

// Keys returns the request's normalised keys.
func (r *Request) Keys() []Key { return slices.Clone(r.keys) }

// Granted reports whether the request holds every key.
func (r *Request) Granted() bool { return !r.done && r.held == len(r.keys) }

// Acquire takes as many of r's keys as it can, in order, and queues r on the
// first one it cannot take. It reports whether r now holds every key; if
// not, a later Release or Cancel returns r once it does.
func (t *Table) Acquire(r *Request) bool {
	t.number(r)
	return t.advance(r, t.now())
}

// advance continues r's acquisition from its next key.
func (t *Table) advance(r *Request, now int64) bool {
	for r.held < len(r.keys) {
		k := r.keys[r.held]
		e := t.entryOf(r, r.held)
		t.use(e)
		if len(e.waiters) == 0 && e.compatible(k.Mode) {
			e.grant(r, k.Mode, now)
			r.ents[r.held] = e
			r.held++
			continue
		}
		e.waiters = append(e.waiters, waiting{r: r, mode: k.Mode, since: now})
		r.waitingOn = e
		return false
	}
	return true
}

// ConflictError is the error of a try-acquire that found a key held in a
// conflicting mode: errors.Is(err, ErrConflict) holds, and errors.As gives
// the key and who holds it, without parsing the message.
type ConflictError struct {
	// Key is the requested key (with the mode asked for).
	Key Key
	// Holders describes who holds it: "owner@mode", comma separated.
	Holders string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("%v: %s is held by %s", ErrConflict, e.Key, e.Holders)
}

// Unwrap makes errors.Is(err, ErrConflict) hold.
func (e *ConflictError) Unwrap() error { return ErrConflict }

// TryAcquire takes every key of r at once, or none: it fails with a
// *ConflictError (wrapping ErrConflict) only when a key is held in a
// conflicting mode.
func (t *Table) TryAcquire(r *Request) error {
	for i, k := range r.keys {
		e := r.pinnedEntry(i)
		if e == nil {
			e = t.lookup(k.Domain, k.Name)
		}
		if e != nil && !e.compatible(k.Mode) {
			return &ConflictError{Key: k, Holders: e.describeHolders()}
		}
	}
	t.number(r)
	now := t.now()
	for i, k := range r.keys {
		e := t.entryOf(r, i)
		t.use(e)
		e.grant(r, k.Mode, now)
		r.ents[r.held] = e
		r.held++
	}
	return nil
}

// Holder returns a description of who holds key k in a mode conflicting
// with it ("broadcast 42@X"), "" if nobody does.
func (t *Table) Holder(k Key) string {
	if e := t.lookup(k.Domain, k.Name); e != nil && !e.compatible(k.Mode) {
		return e.describeHolders()
	}
	return ""
}

// Release gives back every key r holds, in reverse order, and withdraws it
// from the queue it waits in (so Release also cancels a request not yet
// granted). It returns the requests that became fully granted as a result,
// in grant order. Releasing twice does nothing.
func (t *Table) Release(r *Request) []*Request {
	if r.done {
		return nil
	}
	r.done = true
	var granted []*Request
	if e := r.waitingOn; e != nil {
		e.removeWaiter(r)
		r.waitingOn = nil
		granted = t.promote(e, granted)
		t.maybeFree(e)
	}
	for i := r.held - 1; i >= 0; i-- {
		k, e := r.keys[i], r.ents[i]
		e.release(r, k.Mode)
		granted = t.promote(e, granted)
		t.maybeFree(e)
		r.ents[i] = nil
	}
	r.held = 0
	return granted
}

// Shrink gives back every key of the granted request r but its first n
// (in acquisition order), keeping those held without a gap: no other
// request can take them in between. It returns the requests that became
// fully granted. The broadcast engine uses it when a resource-key owner
// keeps its business keys but gives back the shared Cluster key, which is
// always last (R13.7).
func (t *Table) Shrink(r *Request, n int) []*Request {
	if r.done || !r.Granted() || n >= r.held || n < 0 {
		return nil
	}
	var granted []*Request
	for i := r.held - 1; i >= n; i-- {
		k, e := r.keys[i], r.ents[i]
		e.release(r, k.Mode)
		granted = t.promote(e, granted)
		t.maybeFree(e)
		r.ents[i] = nil
	}
	r.held = n
	r.keys = r.keys[:n]
	r.ents = r.ents[:n]
	if r.pinned != nil {
		r.pinned = r.pinned[:n]
	}
	return granted
}

func (t *Table) now() int64 {
	if t.Now == nil {
		return 0
	}
	return t.Now()
}

// domain returns the entries of d, nil if it has none yet.
func (t *Table) domain(d Domain) map[string]*entry {
	for i := range t.doms {
		if t.doms[i].d == d {
			return t.doms[i].m
		}
	}
	return nil
}

// lookup returns the entry of (d, name), nil if there is none.
func (t *Table) lookup(d Domain, name string) *entry {
	return t.domain(d)[name]
}

// entryFor returns the entry of k, creating it if needed.
func (t *Table) entryFor(k Key) *entry {
	m := t.domain(k.Domain)
	if e, ok := m[k.Name]; ok {
		return e
	}
	if m == nil {
		m = make(map[string]*entry)
		t.doms = append(t.doms, domainEntries{d: k.Domain, m: m})
	}
	e := &entry{domain: k.Domain, name: k.Name}
	m[k.Name] = e
	t.entries++
	return e
}

// use marks e busy before a grant or enqueue.
func (t *Table) use(e *entry) {
	if e.counted {
		e.counted = false
		t.idle--
	}
	if e.parked {
		e.parked = false
		t.parked--
	}
}

// pin resolves k to its entry, creating it if needed, and keeps the entry
// (never swept) until unpin.
func (t *Table) pin(k Key) *entry {
	e := t.entryFor(k)
	e.pins++
	t.use(e)       // no longer counted for the sweep
	t.maybeFree(e) // parked if idle
	return e
}

// unpin undoes a pin of e; an idle entry nobody pins any more can be
// swept again.
func (t *Table) unpin(e *entry) {
	e.pins--
	if e.pins == 0 && e.parked {
		e.parked = false
		t.parked--
		t.maybeFree(e)
	}
}

// maybeFree counts e as idle once nobody holds or waits for it (parks it
// if it is pinned), and sweeps idle entries when there are too many.
func (t *Table) maybeFree(e *entry) {
	if e.counted || e.parked || !e.idle() {
		return
	}
	if e.pins > 0 {
		e.parked = true
		t.parked++
		return
	}
	e.counted = true
	t.idle++
	if t.idle <= maxIdle {
		return
	}
	for _, de := range t.doms {
		for name, e := range de.m {
			if e.counted {
				delete(de.m, name)
				e.gone = true
				t.entries--
			}
		}
	}
	t.idle = 0
}

func (e *entry) idle() bool { return e.shared == 0 && !e.exclusive && len(e.waiters) == 0 }

// promote grants queued waiters from the head of e's queue while they are
// compatible with the holders; each granted request continues with its next
// keys at once. Requests that end up holding every key are appended to
// granted.
func (t *Table) promote(e *entry, granted []*Request) []*Request {
	var now int64
	for i := 0; len(e.waiters) > 0 && e.compatible(e.waiters[0].mode); i++ {
		if i == 0 {
			now = t.now()
		}
		w := e.waiters[0]
		rest := copy(e.waiters, e.waiters[1:])
		e.waiters[rest] = waiting{}
		e.waiters = e.waiters[:rest]
		r := w.r
		r.waitingOn = nil
		e.grant(r, w.mode, now)
		r.ents[r.held] = e
		r.held++
		if t.advance(r, now) {
			granted = append(granted, r)
		}
	}
	return granted
}

func (e *entry) compatible(m Mode) bool {
	if m == Exclusive {
		return !e.exclusive && e.shared == 0
	}
	return !e.exclusive
}

func (e *entry) grant(r *Request, m Mode, now int64) {
	if m == Exclusive {
		e.exclusive = true
	} else {
		e.shared++
	}
	e.holders = append(e.holders, holding{r: r, mode: m, since: now})
}

func (e *entry) release(r *Request, m Mode) {
	if m == Exclusive {
		e.exclusive = false
	} else {
		e.shared--
	}
	for i := range e.holders {
		if e.holders[i].r == r {
			last := len(e.holders) - 1
			e.holders[i] = e.holders[last]
			e.holders[last] = holding{}
			e.holders = e.holders[:last]
			return
		}
	}
}

func (e *entry) removeWaiter(r *Request) {
	if i := slices.IndexFunc(e.waiters, func(w waiting) bool { return w.r == r }); i >= 0 {
		e.waiters = slices.Delete(e.waiters, i, i+1)
	}
}

func (e *entry) describeHolders() string {
	parts := make([]string, 0, len(e.holders))
	for _, h := range e.holders {
		parts = append(parts, h.r.label()+"@"+h.mode.String())
	}
	return strings.Join(parts, ", ")
}

// OwnerLabeler is a Request's Ref that names its owner when the table
// describes the request (Snapshot, a conflict), so that a label is built
// only when someone reads it, not for every request.
type OwnerLabeler interface {
	LockOwner() string
}

// label is the owner, the Ref's label, or "guard #<id>" if neither is set.
func (r *Request) label() string {
	if r.Owner != "" {
		return r.Owner
	}
	if l, ok := r.Ref.(OwnerLabeler); ok {
		return l.LockOwner()
	}
	return fmt.Sprintf("guard #%d", r.id)
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
func (t *Table) Snapshot() []KeyState {
	out := make([]KeyState, 0, t.Len())
	for _, de := range t.doms {
		for _, e := range de.m {
			if !e.idle() {
				out = append(out, e.state())
			}
		}
	}
	slices.SortFunc(out, func(a, b KeyState) int {
		return less(Key{Domain: a.Domain, Name: a.Name}, Key{Domain: b.Domain, Name: b.Name})
	})
	for i := range out {
		slices.SortStableFunc(out[i].Holders, func(a, b Holder) int { return a.Since.Compare(b.Since) })
	}
	return out
}

// EachHolder calls fn for every request that holds a key, once per key it
// holds, in no particular order: a cheaper look than Snapshot for a caller
// that neither keeps nor sorts what it sees.
func (t *Table) EachHolder(fn func(k Key, r *Request)) {
	for _, de := range t.doms {
		for _, e := range de.m {
			for _, h := range e.holders {
				fn(Key{Domain: e.domain, Name: e.name}, h.r)
			}
		}
	}
}

// state describes e for Snapshot.
func (e *entry) state() KeyState {
	ks := KeyState{Domain: e.domain, Name: e.name}
	for _, h := range e.holders {
		ks.Holders = append(ks.Holders, Holder{Owner: h.r.label(), Mode: h.mode, Since: time.Unix(0, h.since)})
	}
	for _, w := range e.waiters {
		ks.Waiters = append(ks.Waiters, Holder{Owner: w.r.label(), Mode: w.mode, Since: time.Unix(0, w.since)})
	}
	return ks
}

// Len returns how many (domain, name) entries are held or awaited.
func (t *Table) Len() int { return t.entries - t.idle - t.parked }
