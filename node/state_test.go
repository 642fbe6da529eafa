package node

import (
	"testing"
)

func TestStateRoundTrip(t *testing.T) {
	st := newPState()
	st.resume, st.handled, st.last = 7, 99, 12
	st.vchans["wal-0/a"] = &vstate{applied: 3, last: 12}
	for _, id := range []uint64{3, 4, 12} {
		st.vchans["wal-0/a"].ids.Add(id)
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
