package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// stateChannel is a channel of a node that saves into dir, with the
// Applier's snapshots of its vchannels kept in apps (a VChannelApplier), for
// tests of the state files alone.
func stateChannel(t testing.TB, dir string, apps map[message.VChannel][]byte) *channel {
	t.Helper()
	n := &Node{cfg: Config{Name: "n", StateDir: dir, Applier: mapApplier(apps), Logger: quiet}}
	c := newChannel(n, "wal-0", newPState(), false)
	t.Cleanup(func() { _ = c.closeJournal() })
	return c
}

// mapApplier is a VChannelApplier whose state is its map of snapshots.
type mapApplier map[message.VChannel][]byte

func (mapApplier) Apply(context.Context, wal.Copy) error { return nil }
func (a mapApplier) Snapshot(message.PChannel) ([]byte, error) {
	return json.Marshal(map[message.VChannel][]byte(a))
}
func (a mapApplier) Restore(_ message.PChannel, data []byte) error {
	return json.Unmarshal(data, (*map[message.VChannel][]byte)(&a))
}
func (a mapApplier) SnapshotVChannel(v message.VChannel) ([]byte, error) { return a[v], nil }
func (a mapApplier) RestoreVChannel(v message.VChannel, data []byte) error {
	a[v] = bytes.Clone(data)
	return nil
}

// change applies broadcast id to vchannel v, as the worker records it.
func change(c *channel, v message.VChannel, id uint64, apps map[message.VChannel][]byte) {
	vs := c.st.touch(v)
	vs.ids.Add(id)
	vs.applied++
	vs.last = id
	c.st.last, c.st.handled, c.st.resume = id, id, id+1
	apps[v] = fmt.Appendf(nil, "view of %s at %d", v, id)
	c.dirty = true
}

// appsOf returns the applier snapshots s loaded, by vchannel.
func appsOf(s *saved) map[message.VChannel][]byte {
	m := map[message.VChannel][]byte{}
	for v, app := range s.apps.All() {
		m[message.VChannel(v)] = app
	}
	return m
}

// sameState reports how the loaded state differs from c's (and the
// applier's snapshots from apps), "" if not at all.
func sameState(c *channel, s *saved, apps map[message.VChannel][]byte) string {
	st := c.st
	if s.st.resume != st.resume || s.st.handled != st.handled || s.st.last != st.last {
		return fmt.Sprintf("head %d/%d/%d, want %d/%d/%d", s.st.resume, s.st.handled, s.st.last, st.resume, st.handled, st.last)
	}
	if s.st.vchannels() != st.vchannels() {
		return fmt.Sprintf("%d vchannels, want %d", s.st.vchannels(), st.vchannels())
	}
	for v := range st.each {
		vs, got := st.get(v), s.st.get(v)
		if got == nil || got.applied != vs.applied || got.last != vs.last || fmt.Sprint(got.ids.Ranges()) != fmt.Sprint(vs.ids.Ranges()) {
			return fmt.Sprintf("%s: %+v, want %+v", v, got, vs)
		}
	}
	if !maps.EqualFunc(appsOf(s), apps, bytes.Equal) {
		return fmt.Sprintf("applier snapshots %q, want %q", appsOf(s), apps)
	}
	return ""
}

// TestStateSavesWhatChanged: through random applies and saves, what is
// loaded back is always the state of the last save, and a save appends
// about what changed since the one before, not every vchannel: the journal
// grows by the changed vchannels, and a base is written only once the
// journal outgrew the last one.
func TestStateSavesWhatChanged(t *testing.T) {
	defer func(m int64) { compactMin = m }(compactMin)
	compactMin = 4 << 10
	dir := t.TempDir()
	apps := map[message.VChannel][]byte{}
	c := stateChannel(t, dir, apps)
	rng := rand.New(rand.NewPCG(1, 2))
	id := uint64(0)
	bases := 0
	for step := range 300 {
		// Many vchannels, few changed per save.
		for range 1 + rng.IntN(4) {
			id++
			change(c, message.VChannel(fmt.Sprintf("wal-0/c%dv0", rng.IntN(2000))), id, apps)
		}
		gen := c.gen
		var before int64
		if c.j != nil {
			before = c.j.size
		}
		if err := c.save(); err != nil {
			t.Fatal(err)
		}
		if c.gen != gen {
			bases++
		} else if grew := c.j.size - before; grew > 1024 {
			t.Fatalf("step %d: a save of a few vchannels appended %d bytes", step, grew)
		}
		if step%25 != 0 {
			continue
		}
		s, ok, err := loadState(dir, "wal-0")
		if err != nil || !ok {
			t.Fatalf("step %d: load: ok=%v %v", step, ok, err)
		}
		if d := sameState(c, s, apps); d != "" {
			t.Fatalf("step %d: loaded %s", step, d)
		}
	}
	if bases < 2 || bases > 20 {
		t.Errorf("%d bases written in 300 saves, want a few (the journal compacted when it outgrew the base)", bases)
	}
}

// TestStateTornSaveIsNotApplied: a save cut short at the end of the journal
// (a crash while appending) loads as the save before it, and the node cuts
// it off before appending; damage before the last save is ErrCorruptState,
// and a journal of an older base is ignored.
func TestStateTornSaveIsNotApplied(t *testing.T) {
	dir := t.TempDir()
	apps := map[message.VChannel][]byte{}
	c := stateChannel(t, dir, apps)
	change(c, "wal-0/a", 1, apps)
	if err := c.save(); err != nil { // the base
		t.Fatal(err)
	}
	change(c, "wal-0/b", 2, apps)
	if err := c.save(); err != nil { // a batch
		t.Fatal(err)
	}
	want := map[message.VChannel][]byte{"wal-0/a": apps["wal-0/a"], "wal-0/b": apps["wal-0/b"]}
	good, err := os.ReadFile(journalPath(dir, "wal-0"))
	if err != nil {
		t.Fatal(err)
	}
	change(c, "wal-0/c", 3, apps)
	if err := c.save(); err != nil {
		t.Fatal(err)
	}
	full, err := os.ReadFile(journalPath(dir, "wal-0"))
	if err != nil {
		t.Fatal(err)
	}
	for cut := len(good) + 1; cut < len(full); cut++ {
		if err := os.WriteFile(journalPath(dir, "wal-0"), full[:cut], 0o644); err != nil {
			t.Fatal(err)
		}
		s, ok, err := loadState(dir, "wal-0")
		if err != nil || !ok || !maps.EqualFunc(appsOf(s), want, bytes.Equal) || s.st.resume != 3 || !s.torn || s.journalSize != int64(len(good)) {
			t.Fatalf("cut at %d of %d: ok=%v err=%v, %+v", cut, len(full), ok, err, s)
		}
	}
	if err := s0cut(dir); err != nil {
		t.Fatal(err)
	}
	// A flipped byte in the first batch, followed by the second: damage.
	damaged := bytes.Clone(full)
	damaged[len(good)-3] ^= 1
	if err := os.WriteFile(journalPath(dir, "wal-0"), damaged, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadState(dir, "wal-0"); !errors.Is(err, ErrCorruptState) {
		t.Errorf("damage before the last batch: %v, want ErrCorruptState", err)
	}
	// A journal of another generation is not applied.
	hdr := appendFrame(nil, fileHeader('J', c.gen+7, "n", "wal-0"))
	_, rest, err := readHeader(full, 'J', "wal-0")
	if err != nil {
		t.Fatal(err)
	}
	stale := append(hdr, rest...)
	if err := os.WriteFile(journalPath(dir, "wal-0"), stale, 0o644); err != nil {
		t.Fatal(err)
	}
	s, ok, err := loadState(dir, "wal-0")
	if err != nil || !ok || s.apps.Len() != 1 || s.journalSize != 0 {
		t.Errorf("stale journal: ok=%v err=%v apps %q size %d; want the base alone", ok, err, appsOf(s), s.journalSize)
	}
}

// s0cut checks that a node restoring from a torn journal cuts the torn
// save off before appending (the file then ends where the good saves end).
func s0cut(dir string) error {
	s, ok, err := loadState(dir, "wal-0")
	if err != nil || !ok {
		return fmt.Errorf("load: ok=%v %v", ok, err)
	}
	if err := s.cutTorn(dir, "wal-0"); err != nil {
		return err
	}
	fi, err := os.Stat(journalPath(dir, "wal-0"))
	if err != nil {
		return err
	}
	if fi.Size() != s.journalSize {
		return fmt.Errorf("journal is %d bytes after the cut, want %d", fi.Size(), s.journalSize)
	}
	again, _, err := loadState(dir, "wal-0")
	if err != nil || again.torn {
		return fmt.Errorf("after the cut: torn=%v %v", again.torn, err)
	}
	return nil
}

// TestStateBaseChecked: a base that is cut short, damaged, of another
// pchannel or of another kind is ErrCorruptState.
func TestStateBaseChecked(t *testing.T) {
	dir := t.TempDir()
	apps := map[message.VChannel][]byte{}
	c := stateChannel(t, dir, apps)
	change(c, "wal-0/a", 1, apps)
	change(c, "wal-0/b", 2, apps)
	if err := c.save(); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(basePath(dir, "wal-0"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := encodeBase("n", "wal-1", 1, newPState(), func(message.VChannel) ([]byte, error) { return nil, nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 1
	for name, data := range map[string][]byte{
		"empty": {}, "garbage": []byte("hello"), "cut": good[:len(good)-5], "flipped": flipped, "other pchannel": other,
		"journal as base": appendFrame(nil, fileHeader('J', 1, "n", "wal-0")),
	} {
		if err := os.WriteFile(basePath(dir, "wal-0"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, _, err := loadState(dir, "wal-0"); !errors.Is(err, ErrCorruptState) {
			t.Errorf("%s: %v, want ErrCorruptState", name, err)
		}
	}
}

// TestStateVersion1Migrates: a state file of format version 1 loads, and
// the next save writes version 2 (a base) with the same state.
func TestStateVersion1Migrates(t *testing.T) {
	dir := t.TempDir()
	v1 := fileStateV1{Version: 1, PChannel: "wal-0", Resume: 7, Handled: 99, Last: 12,
		VChannels: map[string]fileVStateV1{"wal-0/a": {Applied: 3, Last: 12, IDs: [][2]uint64{{3, 4}, {12, 12}}}},
		Applier:   []byte(`{"wal-0/a":"dmlldw=="}`)}
	body, err := json.Marshal(v1)
	if err != nil {
		t.Fatal(err)
	}
	file := append(fmt.Appendf(nil, "%s %08x\n", stateMagicV1, crc32.Checksum(body, castagnoli)), body...)
	if err := os.WriteFile(basePath(dir, "wal-0"), file, 0o644); err != nil {
		t.Fatal(err)
	}
	s, ok, err := loadState(dir, "wal-0")
	if err != nil || !ok || !s.legacy || s.st.resume != 7 || s.st.handled != 99 || !s.st.applied("wal-0/a", 4) ||
		s.st.applied("wal-0/a", 5) || string(s.whole) != string(v1.Applier) {
		t.Fatalf("version 1: ok=%v err=%v %+v", ok, err, s)
	}
	apps := map[message.VChannel][]byte{}
	n := &Node{cfg: Config{Name: "n", StateDir: dir, Applier: mapApplier(apps), PChannels: []message.PChannel{"wal-0"}, Logger: quiet}}
	c, err := n.restore("wal-0")
	if err != nil || string(apps["wal-0/a"]) != "view" {
		t.Fatalf("restore: %v, applier %q", err, apps)
	}
	defer c.closeJournal()
	c.dirty = true
	if err := c.save(); err != nil {
		t.Fatal(err)
	}
	s, ok, err = loadState(dir, "wal-0")
	if err != nil || !ok || s.legacy || s.st.resume != 7 || !s.st.applied("wal-0/a", 12) || string(appsOf(s)["wal-0/a"]) != "view" {
		t.Fatalf("after the save: ok=%v err=%v %+v", ok, err, s)
	}
	if _, err := os.Stat(journalPath(dir, "wal-0")); err != nil {
		t.Fatalf("no journal after the save: %v", err)
	}
	if _, err := Resync(dir, "n", "wal-0"); err != nil {
		t.Fatal(err)
	}
	s, _, err = loadState(dir, "wal-0")
	if err != nil || s.st.resume != 0 || s.st.handled != 0 || !s.st.applied("wal-0/a", 12) || string(appsOf(s)["wal-0/a"]) != "view" {
		t.Fatalf("after Resync: %v %+v", err, s)
	}
}

// BenchmarkSaveState saves a pchannel of 100,000 vchannels of which 16
// changed since the last save (a busy metadata pchannel): the cost of one
// save, compactions included, amortised.
func BenchmarkSaveState(b *testing.B) {
	dir := b.TempDir()
	apps := map[message.VChannel][]byte{}
	c := stateChannel(b, dir, apps)
	id := uint64(0)
	for i := range 100_000 {
		id++
		change(c, message.VChannel(fmt.Sprintf("wal-0/c%dv0", i)), id, apps)
	}
	if err := c.save(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		for j := range 16 {
			id++
			change(c, message.VChannel(fmt.Sprintf("wal-0/c%dv0", (i*16+j)%100_000)), id, apps)
		}
		b.StartTimer()
		if err := c.save(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestStateChangedAgainReadsBack: vchannels changed again and again,
// saved between (their old encodings left dead in the cold map's arena,
// rewritten as it goes), read back as they were last set.
func TestStateChangedAgainReadsBack(t *testing.T) {
	st := newPState()
	st.cold.Slack = 1 << 10
	want := map[message.VChannel]uint64{}
	for round := range 400 {
		for i := range 100 {
			v := message.VChannel(fmt.Sprintf("wal-0/c%dv0", i))
			vs := st.touch(v)
			id := uint64(round + 1)
			vs.ids.Add(id)
			vs.applied++
			vs.last = id
			want[v] = id
		}
		st.settle()
	}
	if st.vchannels() != len(want) || len(st.hot) != 0 {
		t.Fatalf("%d vchannels (%d hot), want %d cold", st.vchannels(), len(st.hot), len(want))
	}
	for v, id := range want {
		if vs := st.get(v); vs == nil || vs.last != id || vs.applied != 400 || !vs.ids.Has(id) {
			t.Fatalf("%s: %+v, want last %d of 400", v, vs, id)
		}
	}
}
