package engine

import (
	"fmt"
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
		rngs := x.rangesFrom(from, 2)
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
	if got := x.rangesFrom(3, 1); len(got) != 1 || got[0] != 5000/idPageSize {
		t.Fatalf("first range from 3: %v", got)
	}
}
