package node

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// countingLog is an in-memory log that records where cursors open and
// counts the entries they return.
type countingLog struct {
	*wmem.Log
	mu    sync.Mutex
	opens map[message.PChannel][]uint64 // the offsets cursors opened at
	read  map[message.PChannel]int      // entries returned
}

func (l *countingLog) Read(ctx context.Context, p message.PChannel, from uint64) (wal.Cursor, error) {
	c, err := l.Log.Read(ctx, p, from)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.opens[p] = append(l.opens[p], from)
	l.mu.Unlock()
	return &countingCursor{Cursor: c, l: l, p: p}, nil
}

// reset forgets what was read so far.
func (l *countingLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.opens, l.read = map[message.PChannel][]uint64{}, map[message.PChannel]int{}
}

func (l *countingLog) counts(p message.PChannel) (opens []uint64, read int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]uint64(nil), l.opens[p]...), l.read[p]
}

type countingCursor struct {
	wal.Cursor
	l *countingLog
	p message.PChannel
}

func (c *countingCursor) Next(ctx context.Context) (uint64, []byte, error) {
	off, data, err := c.Cursor.Next(ctx)
	if err == nil {
		c.l.mu.Lock()
		c.l.read[c.p]++
		c.l.mu.Unlock()
	}
	return off, data, err
}

// vcountApplier counts Apply calls per vchannel and broadcast id, as
// vcApplier does, with a map per vchannel, so that snapshotting or
// restoring one costs its own entries, not every vchannel's.
type vcountApplier struct {
	mu    sync.Mutex
	state map[message.VChannel]map[uint64]int
	calls int
}

func newVCountApplier() *vcountApplier {
	return &vcountApplier{state: map[message.VChannel]map[uint64]int{}}
}

func (a *vcountApplier) Apply(_ context.Context, c wal.Copy) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state[c.VChannel] == nil {
		a.state[c.VChannel] = map[uint64]int{}
	}
	a.state[c.VChannel][c.Message.Broadcast.ID]++
	a.calls++
	return nil
}

// Snapshot and Restore are not called: the node uses the vchannel ones.
func (a *vcountApplier) Snapshot(message.PChannel) ([]byte, error) { return nil, nil }
func (a *vcountApplier) Restore(message.PChannel, []byte) error    { return nil }
func (a *vcountApplier) SnapshotVChannel(v message.VChannel) ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.state[v]) == 0 {
		return nil, nil
	}
	return json.Marshal(a.state[v])
}

func (a *vcountApplier) RestoreVChannel(v message.VChannel, data []byte) error {
	var in map[uint64]int
	if err := json.Unmarshal(data, &in); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.state[v] = in
	return nil
}

func (a *vcountApplier) stats() (calls, vchannels int, twice bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, ids := range a.state {
		for _, n := range ids {
			twice = twice || n > 1
		}
	}
	return a.calls, len(a.state), twice
}

// TestR9_3_RestartReadsOnlyWhatFollowsItsSave: a streaming node restarted
// on a pchannel of many vchannels (a collection's shard each, as the
// metadata service has at scale) reads its saved state and the log from
// the saved position on: after a clean stop, only the entries appended
// since; after a crash, only the entries after its last save — never the
// history before it, however many vchannels that history made (issue 36's
// "catches up without reading more than it must").
func TestR9_3_RestartReadsOnlyWhatFollowsItsSave(t *testing.T) {
	const (
		vchannels = 10_000 // one entry each, all on wal-1
		later     = 50     // entries appended while the node is stopped
	)
	log := &countingLog{Log: wmem.New(pchans...)}
	log.reset()
	w := wal.New(log)
	dir := t.TempDir()
	cfg := func(app Applier, mod func(*Config)) Config {
		c := Config{Name: "n1", WAL: w, PChannels: pchans, Applier: app, Acker: &recAcker{}, StateDir: dir,
			Backoff: fastBackoff, Logger: quiet}
		if mod != nil {
			mod(&c)
		}
		return c
	}
	vc := func(i int) message.VChannel { return message.VChannel(fmt.Sprintf("wal-1/c%d", i)) }
	id := uint64(0)
	appendN := func(n int) {
		for range n {
			id++
			v := vc(int(id) % vchannels)
			appendMsg(t, w, "wal-1", stamped(t, typCreate, id, v), v)
		}
	}
	run := func(app *vcountApplier, mod func(*Config)) *Node {
		t.Helper()
		n, err := New(cfg(app, mod))
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		return n
	}
	end := func() uint64 {
		e, err := w.End(context.Background(), "wal-1")
		if err != nil {
			t.Fatal(err)
		}
		return e
	}

	// The history: every vchannel applied once, saved by a clean stop.
	appendN(vchannels)
	app1 := newVCountApplier()
	n1 := run(app1, nil)
	waitFor(t, "the history applied", func() bool { c, _, _ := app1.stats(); return c == vchannels })
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	resume1 := end()

	// A clean restart reads the entries appended since, and no other.
	appendN(later)
	log.reset()
	app2 := newVCountApplier()
	// Saves every 20 entries, none on a timer: the crash below loses some.
	n2 := run(app2, func(c *Config) { c.SnapshotEvery, c.SnapshotInterval = 20, time.Hour })
	if _, got, _ := app2.stats(); got != vchannels {
		t.Fatalf("restored %d vchannels' states, want %d", got, vchannels)
	}
	waitFor(t, "the entries appended while stopped", func() bool { c, _, _ := app2.stats(); return c == later })
	opens, read := log.counts("wal-1")
	if len(opens) != 1 || opens[0] != resume1 {
		t.Errorf("clean restart opened wal-1 at %v, want once at the saved position %d", opens, resume1)
	}
	if read != later {
		t.Errorf("clean restart read %d entries of wal-1, want the %d appended since the stop (history: %d)", read, later, vchannels)
	}

	// A crash: what the node applied after its last save is read again,
	// nothing before it.
	waitFor(t, "a save after the restart", func() bool {
		p, _ := n2.PChannel("wal-1")
		return p.SavedOffset > resume1
	})
	n2.mu.Lock()
	n2.crashOnClose = true
	n2.mu.Unlock()
	appendN(later / 2)
	waitFor(t, "the last entries applied", func() bool { c, _, _ := app2.stats(); return c == later+later/2 })
	if err := n2.Close(); err != nil {
		t.Fatal(err)
	}
	saved, ok, err := loadState(dir, "wal-1")
	if err != nil || !ok {
		t.Fatalf("saved state: %v %v", ok, err)
	}
	// Count the entries at or after the saved position.
	after := 0
	if e := end(); saved.st.resume < e {
		c, err := log.Log.Read(context.Background(), "wal-1", saved.st.resume)
		if err != nil {
			t.Fatal(err)
		}
		for {
			off, _, err := c.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if after++; off+1 >= e {
				break
			}
		}
		_ = c.Close()
	}
	log.reset()
	app3 := newVCountApplier()
	n3 := run(app3, nil)
	defer func() { _ = n3.Close() }()
	waitFor(t, "caught up after the crash", func() bool {
		p, _ := n3.PChannel("wal-1")
		return p.NextOffset == end()
	})
	opens, read = log.counts("wal-1")
	if len(opens) != 1 || opens[0] != saved.st.resume {
		t.Errorf("restart after a crash opened wal-1 at %v, want once at the saved position %d", opens, saved.st.resume)
	}
	if read != after {
		t.Errorf("restart after a crash read %d entries of wal-1, want the %d at or after the saved position", read, after)
	}
	if calls, _, twice := app3.stats(); calls != after || twice {
		t.Errorf("restart after a crash applied %d copies (one twice: %v), want the %d entries read, each once", calls, twice, after)
	}
	t.Logf("history %d entries; clean restart read %d; crash restart read %d (saved at %d of %d)", vchannels, later, read, saved.st.resume, end())
}
