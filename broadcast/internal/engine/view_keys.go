package engine

import (
	"slices"
)

// Originals walks the idempotency index in the order of its owners' ids
// (R7.5): it calls fn with the original of every scope whose owner's id is
// above after, lowest id first, live or tombstoned, until fn returns false
// (that original is not taken: the walk stops before it) or budget tasks
// and tombstones were looked at (0: no bound). It returns resume, the id
// up to which it walked: every original with an id in (after, resume] was
// taken, so a next walk continues after resume. more is false once nothing
// is left above resume.
//
// An original keeps its id while it goes from live to tombstoned, so a walk
// resumed across pages sees each original that exists throughout exactly
// once. A walk never copies the index: the tombstones are visited through
// their id map a range of ids at a time, the next 256 ranges holding any
// found by a pass over the map's ranges (about 2,000 for a million
// consecutive ids; one per id at worst, for ids far apart); the live tasks
// and the open groups' tombstones above after are sorted per call (they
// are as many as the broadcasts in flight).
func (v View) Originals(after uint64, budget int, fn func(Original) bool) (resume uint64, more bool) {
	c := v.c
	resume = after
	// The live tasks and held tombstones above after, in id order: merged
	// with the tombstones of the id map as the walk passes their ids.
	var loose []uint64
	for id, t := range c.tasks {
		if id > after && t.scope != (Scope{}) {
			loose = append(loose, id)
		}
	}
	for id := range c.tombs.held {
		if id > after {
			loose = append(loose, id)
		}
	}
	slices.Sort(loose)
	looked := 0
	// take offers id to fn if it owns its scope; false stops the walk.
	take := func(id uint64) bool {
		if budget > 0 && looked >= budget {
			more = true
			return false
		}
		looked++
		sc, ok := c.scopeOfID(id)
		if ok && sc != (Scope{}) {
			if owner, found := c.idem.get(sc); found && owner == id {
				if o := c.original(sc); o != nil && o.ID == id && !fn(*o) {
					more = true
					return false
				}
			}
		}
		resume = id
		return true
	}
	// upTo takes the loose ids below id (the tombstone at id next).
	upTo := func(id uint64) bool {
		for len(loose) > 0 && loose[0] < id {
			if !take(loose[0]) {
				return false
			}
			loose = loose[1:]
		}
		return true
	}
	refs := &c.tombs.byID
	from := after / idPageSize
	for {
		rngs := refs.rangesFrom(from, 256)
		if len(rngs) == 0 {
			break
		}
		for _, rng := range rngs {
			p := refs.pages[rng]
			for i := range uint64(idPageSize) {
				id := rng*idPageSize + i
				if id <= after {
					continue
				}
				if p != nil {
					if p.refs[i] == 0 {
						continue
					}
				} else if _, ok := refs.loose[id]; !ok {
					continue
				}
				if !upTo(id) || !take(id) {
					return resume, more
				}
			}
		}
		from = rngs[len(rngs)-1] + 1
		if from == 0 {
			break // the last range of the id space
		}
	}
	for _, id := range loose {
		if !take(id) {
			return resume, more
		}
	}
	return resume, false
}

// rangesFrom returns, in order, the first n ranges of ids from range from
// on that hold a tombstone: a pass over the id map's ranges (one per
// idPageSize ids kept), keeping n of them.
func (x *idRefs) rangesFrom(from uint64, n int) []uint64 {
	out := make([]uint64, 0, n+1)
	add := func(rng uint64) {
		if rng < from || len(out) == n && rng >= out[n-1] {
			return
		}
		i, found := slices.BinarySearch(out, rng)
		if found {
			return
		}
		out = slices.Insert(out, i, rng)
		if len(out) > n {
			out = out[:n]
		}
	}
	for rng := range x.pages {
		add(rng)
	}
	for rng := range x.looseIn {
		add(rng)
	}
	return out
}
