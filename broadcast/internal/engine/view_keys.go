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
	b := walkBudget{n: budget}
	done := c.tombs.byID.walk(after, 0, false, loose, func(id uint64) bool {
		if !b.spend() {
			return false
		}
		sc, ok := c.scopeOfID(id)
		if ok && sc != (Scope{}) {
			if owner, found := c.idem.get(sc); found && owner == id {
				if o := c.original(sc); o != nil && o.ID == id && !fn(*o) {
					return false // not taken: the walk stops before it
				}
			}
		}
		resume = id
		return true
	})
	return resume, !done
}

// walkBudget bounds how many ids a walk looks at (n; 0: no bound).
type walkBudget struct{ n, looked int }

// spend counts one more id, false once the bound is reached.
func (b *walkBudget) spend() bool {
	if b.n > 0 && b.looked >= b.n {
		return false
	}
	b.looked++
	return true
}

// walk calls fn with every id of x in (after, before) — before 0: no
// upper bound — lowest first, or highest first if desc, merged with extra
// (ids outside x in that range, sorted in the walk's order), until fn
// returns false; it reports whether it went through to the end. It copies
// nothing of x: the ranges holding ids are found 256 at a time, each a
// pass over x's ranges.
func (x *idRefs) walk(after, before uint64, desc bool, extra []uint64, fn func(id uint64) bool) bool {
	in := func(id uint64) bool { return id > after && (before == 0 || id < before) }
	// ahead reports whether extra id e comes before id in the walk.
	ahead := func(e, id uint64) bool { return e < id != desc }
	from := after / idPageSize
	if desc {
		from = ^uint64(0)
		if before > 0 {
			from = (before - 1) / idPageSize
		}
	}
	for {
		rngs := x.ranges(from, desc, 256)
		if len(rngs) == 0 {
			break
		}
		for _, rng := range rngs {
			p := x.pages[rng]
			for j := range uint64(idPageSize) {
				i := j
				if desc {
					i = idPageSize - 1 - j
				}
				id := rng*idPageSize + i
				if !in(id) {
					continue
				}
				if p != nil {
					if p.refs[i] == 0 {
						continue
					}
				} else if _, ok := x.loose[id]; !ok {
					continue
				}
				for len(extra) > 0 && ahead(extra[0], id) {
					if !fn(extra[0]) {
						return false
					}
					extra = extra[1:]
				}
				if !fn(id) {
					return false
				}
			}
		}
		last := rngs[len(rngs)-1]
		if desc {
			if last == 0 {
				break
			}
			from = last - 1
		} else {
			if last == ^uint64(0)/idPageSize {
				break // the last range of the id space
			}
			from = last + 1
		}
	}
	for _, id := range extra {
		if !fn(id) {
			return false
		}
	}
	return true
}

// ranges returns, in order, the first n ranges of ids from range from on
// (down, if desc) that hold an id: a pass over the id map's ranges (one
// per idPageSize ids kept), keeping n of them.
func (x *idRefs) ranges(from uint64, desc bool, n int) []uint64 {
	out := make([]uint64, 0, n+1)
	// before orders ranges in the walk's direction.
	before := func(a, b uint64) bool { return a < b != desc && a != b }
	add := func(rng uint64) {
		if before(rng, from) || len(out) == n && !before(rng, out[n-1]) {
			return
		}
		i, found := slices.BinarySearchFunc(out, rng, func(e, t uint64) int {
			switch {
			case e == t:
				return 0
			case before(e, t):
				return -1
			}
			return 1
		})
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
