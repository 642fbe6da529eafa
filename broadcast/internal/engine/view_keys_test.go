package engine

import (
	"fmt"
	"slices"
	"testing"
)

// TestR7_5_KeysWalkFindsTombstoneRangesInOrder: the walk of the keys
// (View.Originals) finds the ranges of ids holding tombstones in order from
// any range on, paged ranges and loose ids alike, across id spaces, a few
// at a time.
func TestR7_5_KeysWalkFindsTombstoneRangesInOrder(t *testing.T) {
	x := newIDRefs()
	ids := []uint64{3, 700, 5000, FirstID(1), FirstID(1) + 3*idPageSize}
	for _, id := range ids {
		x.set(id, id)
	}
	for id := uint64(2 * idPageSize); id < 3*idPageSize; id++ {
		x.set(id, id) // a paged range
	}
	if len(x.pages) != 1 {
		t.Fatalf("%d pages, want 1", len(x.pages))
	}
	var walked []uint64
	for from := uint64(0); ; {
		rngs := x.ranges(from, false, 2)
		if len(rngs) == 0 {
			break
		}
		walked = append(walked, rngs...)
		from = rngs[len(rngs)-1] + 1
	}
	want := []uint64{0, 1, 2, 5000 / idPageSize, FirstID(1) / idPageSize, FirstID(1)/idPageSize + 3}
	if fmt.Sprint(walked) != fmt.Sprint(want) {
		t.Fatalf("ranges %v, want %v", walked, want)
	}
	if got := x.ranges(3, false, 1); len(got) != 1 || got[0] != 5000/idPageSize {
		t.Fatalf("first range from 3: %v", got)
	}
}

// TestR9_5_TombstoneWalkBothWaysMergesTheLooseIDs: the id map's walk
// (View.Originals, View.EachTombstone) lists its ids within (after,
// before) in either order, paged ranges and loose ids alike, merged with
// ids kept outside the map, and stops where its caller says.
func TestR9_5_TombstoneWalkBothWaysMergesTheLooseIDs(t *testing.T) {
	x := newIDRefs()
	ids := []uint64{3, 700, 5000, FirstID(1), FirstID(1) + 3*idPageSize}
	for id := uint64(2 * idPageSize); id < 3*idPageSize; id += 2 {
		ids = append(ids, id) // enough in one range for a page
	}
	for _, id := range ids {
		x.set(id, id)
	}
	if len(x.pages) != 1 {
		t.Fatalf("%d pages, want 1", len(x.pages))
	}
	extra := []uint64{4, 1500, 6000}
	all := slices.Sorted(slices.Values(append(slices.Clone(ids), extra...)))
	walk := func(after, before uint64, desc bool, stopAt int) ([]uint64, bool) {
		var ex []uint64
		for _, e := range extra {
			if e > after && (before == 0 || e < before) {
				ex = append(ex, e)
			}
		}
		if desc {
			slices.Reverse(ex)
		}
		var got []uint64
		done := x.walk(after, before, desc, ex, func(id uint64) bool {
			if stopAt > 0 && len(got) == stopAt {
				return false
			}
			got = append(got, id)
			return true
		})
		return got, done
	}
	in := func(after, before uint64, desc bool) []uint64 {
		var out []uint64
		for _, id := range all {
			if id > after && (before == 0 || id < before) {
				out = append(out, id)
			}
		}
		if desc {
			slices.Reverse(out)
		}
		return out
	}
	for _, c := range []struct {
		after, before uint64
		desc          bool
	}{{0, 0, false}, {0, 0, true}, {4, 5000, false}, {4, 5000, true}, {2*idPageSize + 10, 0, true}, {700, FirstID(1) + 1, false}} {
		got, done := walk(c.after, c.before, c.desc, 0)
		if want := in(c.after, c.before, c.desc); fmt.Sprint(got) != fmt.Sprint(want) || !done {
			t.Errorf("walk (%d, %d) desc %v: %v (done %v), want %v", c.after, c.before, c.desc, got, done, want)
		}
	}
	if got, done := walk(0, 0, true, 3); done || fmt.Sprint(got) != fmt.Sprint(in(0, 0, true)[:3]) {
		t.Errorf("a walk stopped after 3: %v (done %v)", got, done)
	}
}
