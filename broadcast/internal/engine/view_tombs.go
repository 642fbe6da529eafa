package engine

import "slices"

// EachTombstone walks the tombstones (open groups' held ones included)
// whose ids are in (after, before) — before 0: no upper bound — lowest id
// first, or highest first if desc, calling fn with each id and record until
// fn returns false or budget tombstones were looked at (0: no bound). It
// returns the last id it looked at and whether any may be left (false once
// the walk reached the end of the range). Like Originals it copies nothing
// of the set (idRefs.walk).
func (v View) EachTombstone(after, before uint64, desc bool, budget int, fn func(id uint64, rec string) bool) (last uint64, more bool) {
	ts := &v.c.tombs
	var held []uint64
	for id := range ts.held {
		if id > after && (before == 0 || id < before) {
			held = append(held, id)
		}
	}
	slices.Sort(held)
	if desc {
		slices.Reverse(held)
	}
	b := walkBudget{n: budget}
	done := ts.byID.walk(after, before, desc, held, func(id uint64) bool {
		if !b.spend() {
			return false
		}
		last = id
		tb, ok := ts.get(id)
		return !ok || fn(id, tb.raw())
	})
	return last, !done
}
