package idset

import (
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
	for _, b := range [][]byte{{0x80}, {0, 0}, {5, 0, 0, 0}, {1, 0x80}} {
		if _, err := Decode(b); err == nil {
			t.Errorf("Decode(%x) accepted", b)
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
	})
}
