package engine

import (
	"math/rand/v2"
	"testing"
)

// checkIDRefs compares x with the reference map and checks its invariants:
// a range's ids are all in its page or all loose, counts add up, no page
// holds fewer than idPageDemote ids.
func checkIDRefs(t *testing.T, x *idRefs, want map[uint64]uint64) {
	t.Helper()
	if x.len() != len(want) {
		t.Fatalf("len %d, want %d", x.len(), len(want))
	}
	for id, ref := range want {
		if got, ok := x.get(id); !ok || got != ref {
			t.Fatalf("get(%d) = %d, %v; want %d", id, got, ok, ref)
		}
	}
	n := len(x.loose)
	loose := map[uint64]int{}
	for id := range x.loose {
		if x.pages[id/idPageSize] != nil {
			t.Fatalf("id %d is loose but its range has a page", id)
		}
		loose[id/idPageSize]++
	}
	if len(loose) != len(x.looseIn) {
		t.Fatalf("looseIn has %d ranges, the loose ids %d", len(x.looseIn), len(loose))
	}
	for rng, c := range loose {
		if x.looseIn[rng] != c {
			t.Fatalf("looseIn[%d] = %d, %d loose ids", rng, x.looseIn[rng], c)
		}
		if c >= idPagePromote {
			t.Fatalf("range %d has %d loose ids, not promoted", rng, c)
		}
	}
	for rng, p := range x.pages {
		c := 0
		for _, r := range p.refs {
			if r != 0 {
				c++
			}
		}
		if c != p.n || c < idPageDemote {
			t.Fatalf("page %d: %d ids, n %d", rng, c, p.n)
		}
		n += c
	}
	if n != len(want) {
		t.Fatalf("%d ids held, want %d", n, len(want))
	}
}

// TestIDRefsMatchesAMap: random sets (new ids, mostly ascending like a
// counter's, some far off; and updates) and deletes (mostly the oldest,
// like GC), checked against a map after every step.
func TestIDRefsMatchesAMap(t *testing.T) {
	paged, demoted := 0, 0
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 99))
		x, want := newIDRefs(), map[uint64]uint64{}
		next := uint64(1 + r.IntN(1000))
		var order []uint64
		for step := range 6000 {
			switch k := r.IntN(10); {
			case k < 5:
				id := next
				next += uint64(1 + r.IntN(2))
				if r.IntN(20) == 0 {
					id = uint64(r.IntN(1 << 20)) // a replicated id, or a late one
				}
				ref := r.Uint64() >> 8
				x.set(id, ref)
				if _, ok := want[id]; !ok {
					order = append(order, id)
				}
				want[id] = ref
			case k < 6 && len(order) > 0:
				id := order[r.IntN(len(order))]
				ref := r.Uint64() >> 8
				x.set(id, ref)
				want[id] = ref
			case len(order) > 0:
				i := 0
				if r.IntN(4) == 0 {
					i = r.IntN(len(order))
				}
				id := order[i]
				order = append(order[:i], order[i+1:]...)
				pages := len(x.pages)
				x.delete(id)
				delete(want, id)
				if len(x.pages) < pages {
					demoted++
				}
			}
			pages := len(x.pages)
			x.delete(next + 1<<30) // an id never set: nothing happens
			paged = max(paged, pages)
			if step%97 == 0 || step == 5999 {
				checkIDRefs(t, &x, want)
			}
		}
		checkIDRefs(t, &x, want)
	}
	if paged == 0 || demoted == 0 {
		t.Fatalf("at most %d pages, %d demoted: the walk missed the pages", paged, demoted)
	}
	t.Logf("up to %d pages, %d demoted", paged, demoted)
}

// TestIDRefsDenseIDsArePaged: a million consecutive ids, as B6 recovers,
// are held in pages, 8 bytes an id; once all but a sparse few are gone,
// those few are back in the map and the pages are freed.
func TestIDRefsDenseIDsArePaged(t *testing.T) {
	x, want := newIDRefs(), map[uint64]uint64{}
	const n = 1 << 20
	for id := uint64(1); id <= n; id++ {
		x.set(id, id*3)
	}
	if len(x.loose) >= idPagePromote || len(x.pages) != n/idPageSize {
		t.Fatalf("%d ids: %d pages, %d loose", n, len(x.pages), len(x.loose))
	}
	for id := uint64(1); id <= n; id++ {
		if id%100 == 0 {
			want[id] = id * 3
			continue
		}
		x.delete(id)
	}
	if len(x.pages) != 0 {
		t.Fatalf("%d pages left for %d sparse ids", len(x.pages), len(want))
	}
	checkIDRefs(t, &x, want)
}
