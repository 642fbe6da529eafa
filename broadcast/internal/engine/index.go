package engine

import (
	"encoding/binary"
	"time"
)

// The idempotency index maps a scope to its original broadcast, live or
// tombstoned: the first owner wins (R7.3). Entries are added when a task is
// registered (Submit, a replicated task's first ack, recovery) and retired
// only after the original's tombstone was deleted from the catalog (R6.2).

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

// indexGet returns the owner of sc. An entry whose id is neither a task
// nor a tombstone cannot be checked and is taken as sc's, as an exact key
// would be: original() then frees it.
func (c *Core) indexGet(sc Scope) (uint64, bool) {
	if id, ok := c.index.exact[sc]; ok {
		return id, true
	}
	id, ok := c.index.short[c.index.key(sc)]
	if !ok {
		return 0, false
	}
	if have, known := c.scopeOfID(id); known && have != sc {
		return 0, false
	}
	return id, true
}

// indexSet makes id the owner of sc.
func (c *Core) indexSet(sc Scope, id uint64) {
	if _, ok := c.index.exact[sc]; ok {
		c.index.exact[sc] = id
		return
	}
	k := c.index.key(sc)
	if old, ok := c.index.short[k]; ok && old != id {
		if have, known := c.scopeOfID(old); known && have != sc {
			c.index.exact[sc] = id
			return
		}
	}
	c.index.short[k] = id
}

// indexDel removes sc's entry if id owns it (an id has one scope, so the
// id alone tells the entry).
func (c *Core) indexDel(sc Scope, id uint64) {
	if sc == (Scope{}) {
		return
	}
	if have, ok := c.index.exact[sc]; ok {
		if have == id {
			delete(c.index.exact, sc)
		}
		return
	}
	if k := c.index.key(sc); c.index.short[k] == id {
		delete(c.index.short, k)
	}
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

// indexTask registers t as the owner of its scope unless the scope has one.
// A replicated task follows its primary's decisions instead: the primary
// made it an original only after the scope's previous original was
// collected there, so the newest (highest id) replicated owner wins, over
// an older one that is not collected (or not even finished) here yet: after
// a failover, a retry must get the primary's current original (R8.4).
func (c *Core) indexTask(t *task) {
	if t.replicated {
		c.indexReplicated(t.scope, t.id)
		return
	}
	c.indexScope(t.scope, t.id)
}

func (c *Core) indexReplicated(sc Scope, id uint64) {
	if sc == (Scope{}) {
		return
	}
	if old, ok := c.indexGet(sc); ok && old >= id {
		return
	}
	c.indexSet(sc, id)
}

func (c *Core) indexScope(sc Scope, id uint64) {
	if sc == (Scope{}) {
		return
	}
	if _, ok := c.indexGet(sc); !ok {
		c.indexSet(sc, id)
	}
}

// original returns the owner of sc, or nil.
func (c *Core) original(sc Scope) *Original {
	if sc == (Scope{}) {
		return nil
	}
	id, ok := c.indexGet(sc)
	if !ok {
		return nil
	}
	if t := c.tasks[id]; t != nil {
		return &Original{ID: id, Live: true, Msg: t.msg, Digest: t.digest, Request: t.request,
			Persisting: t.stage == Persisting, Window: c.window(t.class, id, t.created, time.Time{})}
	}
	if tb, ok := c.tombs.get(id); ok {
		return c.tombOriginal(tb)
	}
	// The owner vanished (aborted): the scope is free again.
	c.indexDel(sc, id)
	return nil
}

func (c *Core) tombOriginal(tb tomb) *Original {
	return &Original{ID: tb.id, Record: tb.raw(), Window: c.window(tb.class(), tb.id, time.Unix(0, tb.created()), time.Unix(0, tb.completed))}
}

// requestDigestOf returns an original's request digest (R7.6).
func (c *Core) requestDigestOf(o *Original) []byte {
	if o.Live {
		return o.Request
	}
	r, err := DecodeRecord(rawBytes(o.Record))
	if err != nil {
		return nil
	}
	return r.RequestDigest
}

// window computes the idempotency window of original id (R7.7).
func (c *Core) window(class int, id uint64, created, completed time.Time) Window {
	cl := c.tombs.classes[class]
	w := Window{FirstSeen: created, CountHeadroom: -1, Class: cl.cfg.Name, ClassEarlyEvicted: c.tombs.early[class]}
	if completed.IsZero() {
		return w
	}
	w.CompletedAt = completed
	if c.tombs.isHeld(id) {
		// An open group's member: kept until the group ends (R13.3).
		return w
	}
	w.ExpiresLatest = completed.Add(cl.cfg.MaxLifetime)
	w.CountHeadroom = c.tombs.headroom(id)
	return w
}

// Lookup returns the original of scope sc, or nil (R7.5).
func (c *Core) Lookup(sc Scope) *Original { return c.original(sc) }
