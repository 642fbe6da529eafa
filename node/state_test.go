package node

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestIDSetMatchesAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		var s idSet
		ref := map[uint64]bool{}
		span := uint64(1 + round*4)
		for range 200 {
			id := 1 + rng.Uint64N(span)
			if got, want := s.add(id), !ref[id]; got != want {
				t.Fatalf("add(%d) = %v, want %v", id, got, want)
			}
			ref[id] = true
			if !s.valid() {
				t.Fatalf("ranges malformed: %v", s.r)
			}
		}
		for id := uint64(0); id <= span+1; id++ {
			if s.has(id) != ref[id] {
				t.Fatalf("has(%d) = %v, want %v (ranges %v)", id, s.has(id), ref[id], s.r)
			}
		}
	}
}

func TestIDSetDenseIsCompact(t *testing.T) {
	var s idSet
	for id := uint64(1000); id >= 1; id-- {
		s.add(id)
	}
	for id := uint64(2000); id > 1001; id-- {
		s.add(id)
	}
	if len(s.r) != 2 || s.r[0] != [2]uint64{1, 1000} || s.r[1] != [2]uint64{1002, 2000} {
		t.Fatalf("ranges %v", s.r)
	}
	s.add(1001)
	if len(s.r) != 1 || s.r[0] != [2]uint64{1, 2000} {
		t.Fatalf("ranges %v", s.r)
	}
	s.add(math.MaxUint64)
	s.add(math.MaxUint64 - 1)
	if !s.valid() || !s.has(math.MaxUint64) || len(s.r) != 2 {
		t.Fatalf("ranges %v", s.r)
	}
	if (&idSet{r: [][2]uint64{{0, 1}}}).valid() || (&idSet{r: [][2]uint64{{1, 2}, {3, 4}}}).valid() || (&idSet{r: [][2]uint64{{5, 4}}}).valid() {
		t.Fatal("malformed ranges accepted")
	}
}

func TestStateRoundTrip(t *testing.T) {
	st := newPState()
	st.resume, st.handled, st.last = 7, 99, 12
	st.vchans["wal-0/a"] = &vstate{applied: 3, last: 12}
	for _, id := range []uint64{3, 4, 12} {
		st.vchans["wal-0/a"].ids.add(id)
	}
	data, err := encodeState("n", "wal-0", st, []byte("snap"))
	if err != nil {
		t.Fatal(err)
	}
	got, snap, err := decodeState("wal-0", data)
	if err != nil {
		t.Fatal(err)
	}
	if string(snap) != "snap" || got.resume != 7 || got.handled != 99 || got.last != 12 ||
		!got.applied("wal-0/a", 4) || got.applied("wal-0/a", 5) || got.vchans["wal-0/a"].applied != 3 {
		t.Fatalf("round trip: %+v", got)
	}
	if _, _, err := decodeState("wal-1", data); err == nil {
		t.Fatal("decoded another pchannel's state")
	}
	st.vchans["wal-1/x"] = &vstate{}
	data, _ = encodeState("n", "wal-0", st, nil)
	if _, _, err := decodeState("wal-0", data); err == nil {
		t.Fatal("accepted a vchannel of another pchannel")
	}
}
