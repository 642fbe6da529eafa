package engine

import (
	"time"
)

// The idempotency index maps a scope to its original broadcast, live or
// tombstoned: the first owner wins (R7.3). Entries are added when a task is
// registered (Submit, a replicated task's first ack, recovery) and retired
// only after the original's tombstone was deleted from the catalog (R6.2).

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
	if old, ok := c.index[sc]; ok && old >= id {
		return
	}
	c.index[sc] = id
}

func (c *Core) indexScope(sc Scope, id uint64) {
	if sc == (Scope{}) {
		return
	}
	if _, ok := c.index[sc]; !ok {
		c.index[sc] = id
	}
}

// original returns the owner of sc, or nil.
func (c *Core) original(sc Scope) *Original {
	if sc == (Scope{}) {
		return nil
	}
	id, ok := c.index[sc]
	if !ok {
		return nil
	}
	if t := c.tasks[id]; t != nil {
		return &Original{ID: id, Live: true, Msg: t.msg, Digest: t.digest, Request: t.request,
			Window: c.window(t.class, id, t.created, time.Time{})}
	}
	if tb, ok := c.tombs.get(id); ok {
		return c.tombOriginal(tb)
	}
	// The owner vanished (aborted): the scope is free again.
	delete(c.index, sc)
	return nil
}

func (c *Core) tombOriginal(tb tomb) *Original {
	return &Original{ID: tb.id, Record: tb.raw, Window: c.window(tb.class(), tb.id, time.Unix(0, tb.created), time.Unix(0, tb.completed))}
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
