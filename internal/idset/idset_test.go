package idset

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestAddHasAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var s Set
	m := map[uint64]bool{}
	for range 5000 {
		id := 1 + rng.Uint64N(300)
		if got, want := s.Add(id), !m[id]; got != want {
			t.Fatalf("Add(%d) = %v, want %v", id, got, want)
		}
		m[id] = true
		if !s.Valid() {
			t.Fatalf("invalid after Add(%d): %v", id, s.r)
		}
	}
	for id := uint64(0); id <= 301; id++ {
		if s.Has(id) != m[id] {
			t.Fatalf("Has(%d) = %v", id, s.Has(id))
		}
	}
	d, err := Decode(s.Encode())
	if err != nil || len(d.r) != len(s.r) {
		t.Fatalf("round trip: %v, %v vs %v", err, d.r, s.r)
	}
	for i := range d.r {
		if d.r[i] != s.r[i] {
			t.Fatalf("round trip range %d: %v vs %v", i, d.r[i], s.r[i])
		}
	}
}

func TestDecodeRefusesGarbage(t *testing.T) {
	for _, b := range [][]byte{{0x80}, {0, 0}, {5, 0, 0, 0}, {1, 0x80}, {1, 2, 1, 0}} {
		if _, err := Decode(b); err == nil {
			t.Errorf("Decode(%x) accepted", b)
		}
		if Check(b) == nil {
			t.Errorf("Check(%x) accepted", b)
		}
	}
}

func FuzzDecode(f *testing.F) {
	var s Set
	s.Add(3)
	s.Add(4)
	s.Add(10)
	f.Add(s.Encode())
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Decode(b)
		if err == nil && !s.Valid() {
			t.Fatalf("Decode(%x) gave an invalid set", b)
		}
		if (Check(b) == nil) != (err == nil) {
			t.Fatalf("Check(%x) = %v, Decode: %v", b, Check(b), err)
		}
	})
}

// TestSetMatchesAMap came with node's copy of the set (now this one).
func TestSetMatchesAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		var s Set
		ref := map[uint64]bool{}
		span := uint64(1 + round*4)
		for range 200 {
			id := 1 + rng.Uint64N(span)
			if got, want := s.Add(id), !ref[id]; got != want {
				t.Fatalf("add(%d) = %v, want %v", id, got, want)
			}
			ref[id] = true
			if !s.Valid() {
				t.Fatalf("ranges malformed: %v", s.r)
			}
		}
		for id := uint64(0); id <= span+1; id++ {
			if s.Has(id) != ref[id] {
				t.Fatalf("has(%d) = %v, want %v (ranges %v)", id, s.Has(id), ref[id], s.r)
			}
		}
	}
}

func TestSetDenseIsCompact(t *testing.T) {
	var s Set
	for id := uint64(1000); id >= 1; id-- {
		s.Add(id)
	}
	for id := uint64(2000); id > 1001; id-- {
		s.Add(id)
	}
	if len(s.r) != 2 || s.r[0] != [2]uint64{1, 1000} || s.r[1] != [2]uint64{1002, 2000} {
		t.Fatalf("ranges %v", s.r)
	}
	s.Add(1001)
	if len(s.r) != 1 || s.r[0] != [2]uint64{1, 2000} {
		t.Fatalf("ranges %v", s.r)
	}
	s.Add(math.MaxUint64)
	s.Add(math.MaxUint64 - 1)
	if !s.Valid() || !s.Has(math.MaxUint64) || len(s.r) != 2 {
		t.Fatalf("ranges %v", s.r)
	}
	if (&Set{r: [][2]uint64{{0, 1}}}).Valid() || (&Set{r: [][2]uint64{{1, 2}, {3, 4}}}).Valid() || (&Set{r: [][2]uint64{{5, 4}}}).Valid() {
		t.Fatal("malformed ranges accepted")
	}
}
