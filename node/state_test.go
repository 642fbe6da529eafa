package node

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"github.com/walcast/walcast/message"
)

func TestStateRoundTrip(t *testing.T) {
	st := newPState()
	st.resume, st.handled, st.last = 7, 99, 12
	st.add("wal-0/a", &vstate{applied: 3, last: 12})
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
	st.add("wal-1/x", &vstate{})
	data, _ = encodeState("n", "wal-0", st, nil)
	if _, _, err := decodeState("wal-0", data); err == nil {
		t.Fatal("accepted a vchannel of another pchannel")
	}
}

// referenceState is the state file as encodeState wrote it before it kept
// the vchannels' encodings: json.Marshal of the whole fileState.
func referenceState(t testing.TB, node string, p message.PChannel, st *pstate, snap []byte) []byte {
	t.Helper()
	f := fileState{fileHead: fileHead{Version: stateVersion, Node: node, PChannel: p, Resume: st.resume, Handled: st.handled,
		Last: st.last}, VChannels: make(map[string]fileVState, len(st.vchans)), Applier: snap}
	for v, vs := range st.vchans {
		f.VChannels[string(v)] = fileVState{Applied: vs.applied, Last: vs.last, IDs: vs.ids.Ranges()}
	}
	body, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return append(fmt.Appendf(nil, "%s %08x\n", stateMagic, crc32.Checksum(body, castagnoli)), body...)
}

// TestStateFileIsTheStatesJSON: through random applies to new and known
// vchannels and saves in between, every encoding is the bytes of json.Marshal
// of the whole state, so a vchannel changed since the last save is never
// written with its old encoding; it decodes back to the state.
func TestStateFileIsTheStatesJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	st := newPState()
	names := []message.VChannel{"wal-0/a", "wal-0/b_1", "wal-0/a-2", "wal-0/c", "wal-0/z"}
	for step := range 400 {
		v := names[rng.IntN(len(names))]
		vs := st.vchans[v]
		if vs == nil {
			vs = &vstate{}
			st.add(v, vs)
		}
		id := uint64(rng.IntN(200) + 1)
		vs.ids.Add(id)
		vs.applied++
		vs.last = id
		vs.changed()
		st.last, st.handled, st.resume = id, uint64(step), uint64(step+1)
		if rng.IntN(4) > 0 {
			continue // several applies between two saves
		}
		var snap []byte
		if step%3 == 0 {
			snap = []byte(fmt.Sprint("snapshot ", step))
		}
		got, err := encodeState("n", "wal-0", st, snap)
		if err != nil {
			t.Fatal(err)
		}
		if want := referenceState(t, "n", "wal-0", st, snap); !bytes.Equal(got, want) {
			t.Fatalf("step %d: encoded\n%s\nwant\n%s", step, got, want)
		}
		back, bsnap, err := decodeState("wal-0", got)
		if err != nil || !bytes.Equal(bsnap, snap) || len(back.vchans) != len(st.vchans) || back.last != st.last {
			t.Fatalf("step %d: decodes to %+v, %q, %v", step, back, bsnap, err)
		}
	}
}

// BenchmarkEncodeState saves a pchannel of 2,048 vchannels of which 16
// changed since the last save (a busy metadata pchannel), and as the file
// was written before the vchannels kept their encodings (reference).
func BenchmarkEncodeState(b *testing.B) {
	st := newPState()
	for i := range 2048 {
		vs := &vstate{applied: 3, last: uint64(i + 10)}
		vs.ids.Add(uint64(i + 10))
		st.add(message.VChannel(fmt.Sprintf("wal-0/c%d_s0", i)), vs)
	}
	snap := make([]byte, 64<<10)
	touch := func(i int) {
		for j := range 16 {
			vs := st.vchans[message.VChannel(fmt.Sprintf("wal-0/c%d_s0", (i*16+j)%2048))]
			vs.ids.Add(vs.last + 5000)
			vs.applied++
			vs.changed()
		}
	}
	b.Run("kept", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			b.StopTimer()
			touch(i)
			b.StartTimer()
			if _, err := encodeState("n", "wal-0", st, snap); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reference", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			b.StopTimer()
			touch(i)
			b.StartTimer()
			referenceState(b, "n", "wal-0", st, snap)
		}
	})
}
