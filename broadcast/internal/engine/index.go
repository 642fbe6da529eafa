package engine

import (
	"encoding/binary"
	"slices"
	"time"
)

// idemIndex is the idempotency index and its admission slots. The index
// maps a scope to its original broadcast, live or tombstoned: the first
// owner wins (R7.3), but among replicated owners the newest (R8.4).
// Entries are added when a task is registered (Submit, a replicated task's
// first ack, recovery) and retired only after the original's tombstone was
// deleted from the catalog (R6.2).
//
// An admission slot reserves a scope that has no original while its first
// request takes its locks: a concurrent request with the same key waits for
// the slot instead of taking locks of its own, and resolves again once the
// slot is released (R7.3, R7.5).
//
// The index does not know tasks or tombstones: scopeOf tells the scope of
// an owner's id (the core's tasks, tombstones and the records recovery
// gathered), which a hit on the shortened key checks.
type idemIndex struct {
	scopes  scopeIndex
	admits  map[Scope]*admission
	scopeOf func(id uint64) (Scope, bool)
}

func newIdemIndex(bits int, scopeOf func(uint64) (Scope, bool)) idemIndex {
	return idemIndex{scopes: newScopeIndex(bits, 0), admits: make(map[Scope]*admission), scopeOf: scopeOf}
}

// reserve sizes an empty index for n entries (recovery knows how many).
func (x *idemIndex) reserve(n int) {
	if x.scopes.len() == 0 && n > 0 {
		x.scopes = newScopeIndex(x.scopes.bits, n)
	}
}

// get returns the owner of sc. An entry whose id is neither a task nor a
// tombstone cannot be checked and is taken as sc's, as an exact key would
// be: the core's original() then frees it.
func (x *idemIndex) get(sc Scope) (uint64, bool) {
	if id, ok := x.scopes.exact[sc]; ok {
		return id, true
	}
	id, ok := x.scopes.short[x.scopes.key(sc)]
	if !ok {
		return 0, false
	}
	if have, known := x.scopeOf(id); known && have != sc {
		return 0, false
	}
	return id, true
}

// set makes id the owner of sc.
func (x *idemIndex) set(sc Scope, id uint64) {
	if _, ok := x.scopes.exact[sc]; ok {
		x.scopes.exact[sc] = id
		return
	}
	k := x.scopes.key(sc)
	if old, ok := x.scopes.short[k]; ok && old != id {
		if have, known := x.scopeOf(old); known && have != sc {
			x.scopes.exact[sc] = id
			return
		}
	}
	x.scopes.short[k] = id
}

// del removes sc's entry if id owns it (an id has one scope, so the id
// alone tells the entry).
func (x *idemIndex) del(sc Scope, id uint64) {
	if sc == (Scope{}) {
		return
	}
	if have, ok := x.scopes.exact[sc]; ok {
		if have == id {
			delete(x.scopes.exact, sc)
		}
		return
	}
	if k := x.scopes.key(sc); x.scopes.short[k] == id {
		delete(x.scopes.short, k)
	}
}

// register makes id the owner of sc unless sc has one: the first owner
// wins (R7.3). A replicated owner follows its primary's decisions instead:
// the primary made it an original only after the scope's previous original
// was collected there, so the newest (highest id) replicated owner wins,
// over an older one that is not collected (or not even finished) here yet:
// after a failover, a retry must get the primary's current original (R8.4).
func (x *idemIndex) register(sc Scope, id uint64, replicated bool) {
	if sc == (Scope{}) {
		return
	}
	old, ok := x.get(sc)
	if !ok || (replicated && old < id) {
		x.set(sc, id)
	}
}

// admission returns sc's admission slot, nil if none.
func (x *idemIndex) admission(sc Scope) *admission { return x.admits[sc] }

// admit reserves sc for handle h, which must have found no original.
func (x *idemIndex) admit(sc Scope, h HandleID) *admission {
	a := &admission{owner: h}
	x.admits[sc] = a
	return a
}

// queue makes r wait for sc's slot if another handle holds it; false if
// none does (r may take the slot).
func (x *idemIndex) queue(sc Scope, r Resolve) bool {
	a := x.admits[sc]
	if a == nil || a.owner == r.Handle {
		return false
	}
	a.waiters = append(a.waiters, r)
	return true
}

// release frees slot a of sc and returns the requests that waited for it,
// to resolve again.
func (x *idemIndex) release(sc Scope, a *admission) []Resolve {
	if a == nil {
		return nil
	}
	if x.admits[sc] == a {
		delete(x.admits, sc)
	}
	return a.waiters
}

// withdraw removes the first waiting request match says (at most one
// matches: a request waits in one place); false if none.
func (x *idemIndex) withdraw(match func(Resolve) bool) bool {
	for _, a := range x.admits {
		if i := slices.IndexFunc(a.waiters, match); i >= 0 {
			a.waiters = slices.Delete(a.waiters, i, i+1)
			return true
		}
	}
	return false
}

// forget removes handle h's Resolves waiting for a slot (its handle was
// closed).
func (x *idemIndex) forget(h HandleID) {
	for _, a := range x.admits {
		if i := slices.IndexFunc(a.waiters, func(r Resolve) bool { return r.Handle == h }); i >= 0 {
			a.waiters = slices.Delete(a.waiters, i, i+1)
		}
	}
}

// waiting counts the requests waiting for a slot.
func (x *idemIndex) waiting() int {
	n := 0
	for _, a := range x.admits {
		n += len(a.waiters)
	}
	return n
}

// scopeIndex is the idempotency index's storage. Its main map is keyed by
// 64 bits of a scope, so a million tombstones' entries take 16-byte slots
// instead of 24-byte ones (SPEC B6: 18 bytes less per tombstone at 1M).
// An entry's id tells its whole scope (its task's, or its tombstone
// record's), which a hit checks (Core.scopeOfID). A scope whose 64 bits an
// entry of another scope holds goes to the exact map, read first. Two
// scopes share 64 bits by chance about once in 2^64 pairs, or when a
// client searches for such keys on purpose: either way they cost a look in
// the exact map, never a wrong answer.
type scopeIndex struct {
	short map[uint64]uint64
	exact map[Scope]uint64
	// bits, if not 0, keeps only that many bits of a scope in the main
	// map's key (Config.IndexScopeBits).
	bits int
}

func newScopeIndex(bits, size int) scopeIndex {
	return scopeIndex{short: make(map[uint64]uint64, size), exact: map[Scope]uint64{}, bits: bits}
}

func (x *scopeIndex) len() int { return len(x.short) + len(x.exact) }

func (x *scopeIndex) key(sc Scope) uint64 {
	k := binary.LittleEndian.Uint64(sc[:8])
	if x.bits > 0 && x.bits < 64 {
		k >>= 64 - x.bits
	}
	return k
}

// scopeOfID returns the scope of task or tombstone id; false if id is
// neither (or its record is unreadable). During recovery the tombstones
// not loaded yet are looked up among those gathered.
func (c *Core) scopeOfID(id uint64) (Scope, bool) {
	if t := c.tasks[id]; t != nil {
		return t.scope, true
	}
	if tb, ok := c.tombs.get(id); ok {
		ident, err := recordIdentity(rawBytes(tb.raw()))
		if err != nil {
			return Scope{}, false
		}
		return ScopeOf(ident.Type, ident.IdempotencyKey), true
	}
	if rs := c.recovering; rs != nil {
		if r := rs.gathered(id); r != nil {
			return ScopeOf(r.rec.Msg.Type, r.rec.Msg.IdempotencyKey), true
		}
	}
	return Scope{}, false
}

// original returns the owner of sc, or nil.
func (c *Core) original(sc Scope) *Original {
	if sc == (Scope{}) {
		return nil
	}
	id, ok := c.idem.get(sc)
	if !ok {
		return nil
	}
	if t := c.tasks[id]; t != nil {
		return &Original{ID: id, Live: true, Msg: t.msg, Digest: t.digest, Request: t.request,
			Persisting: t.stage == Persisting, Window: c.tombs.window(t.class, id, t.created, time.Time{})}
	}
	if tb, ok := c.tombs.get(id); ok {
		return c.tombs.original(tb)
	}
	// The owner vanished (aborted): the scope is free again.
	c.idem.del(sc, id)
	return nil
}
