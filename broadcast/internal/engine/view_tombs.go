package engine

import "slices"

// EachTombstone walks the tombstones (open groups' held ones included)
// whose ids are in (after, before) — before 0: no upper bound — lowest id
// first, or highest first if desc, calling fn with each id and record until
// fn returns false or budget tombstones were looked at (0: no bound). It
// returns the last id it looked at and whether any may be left (false once
// the walk reached the end of the range). Like Originals it copies nothing
// of the set: the id map's ranges that hold a tombstone are found in one
// pass over its ranges (about 2,000 at a million consecutive ids), and only
// the ids of the ranges it passes are looked at.
func (v View) EachTombstone(after, before uint64, desc bool, budget int, fn func(id uint64, rec string) bool) (last uint64, more bool) {
	ts := &v.c.tombs
	in := func(id uint64) bool { return id > after && (before == 0 || id < before) }
	var held []uint64
	for id := range ts.held {
		if in(id) {
			held = append(held, id)
		}
	}
	refs := &ts.byID
	var rngs []uint64
	seen := func(rng uint64) bool {
		lo, hi := rng*idPageSize, rng*idPageSize+idPageSize-1
		return hi > after && (before == 0 || lo < before)
	}
	for rng := range refs.pages {
		if seen(rng) {
			rngs = append(rngs, rng)
		}
	}
	for rng := range refs.looseIn {
		if seen(rng) {
			rngs = append(rngs, rng)
		}
	}
	slices.Sort(held)
	slices.Sort(rngs)
	if desc {
		slices.Reverse(held)
		slices.Reverse(rngs)
	}
	looked := 0
	take := func(id uint64) bool {
		if budget > 0 && looked >= budget {
			more = true
			return false
		}
		looked++
		last = id
		if tb, ok := ts.get(id); ok && !fn(id, tb.raw()) {
			more = true
			return false
		}
		return true
	}
	// first reports whether held id comes before id in the walk's order.
	first := func(h, id uint64) bool { return h < id != desc }
	for _, rng := range rngs {
		p := refs.pages[rng]
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
			} else if _, ok := refs.loose[id]; !ok {
				continue
			}
			for len(held) > 0 && first(held[0], id) {
				if !take(held[0]) {
					return last, more
				}
				held = held[1:]
			}
			if !take(id) {
				return last, more
			}
		}
	}
	for _, id := range held {
		if !take(id) {
			return last, more
		}
	}
	return last, false
}
