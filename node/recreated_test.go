package node

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	walkafka "github.com/walcast/walcast/wal/kafka"
	wmem "github.com/walcast/walcast/wal/memory"
	walnats "github.com/walcast/walcast/wal/nats"
	"github.com/walcast/walcast/wal/waltest"
)

// realLog is a real WAL backend whose log can be deleted and created again
// (a recreated stream or topic, a broker that lost its data).
type realLog struct {
	open     func(t *testing.T) wal.Log
	recreate func(t *testing.T)
}

var recreatedP = message.PChannel("wal-0")

func natsLog(t *testing.T) realLog {
	srv, err := embednats.Start(ctxT(t, 20*time.Second), embednats.Config{Dir: t.TempDir(), SyncAlways: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return realLog{
		open: func(t *testing.T) wal.Log {
			l, err := walnats.New(ctxT(t, 10*time.Second), walnats.Config{URL: srv.ClientURL(), PChannels: []message.PChannel{recreatedP}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			return l
		},
		recreate: func(t *testing.T) {
			waltest.DeleteStream(t, srv.ClientURL(), walnats.DefaultStreamPrefix+"_"+string(recreatedP))
		},
	}
}

func kafkaLog(t *testing.T) realLog {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	return realLog{
		open: func(t *testing.T) wal.Log {
			l, err := walkafka.New(ctxT(t, 10*time.Second), walkafka.Config{Brokers: kc.ListenAddrs(), PChannels: []message.PChannel{recreatedP}, ReplicationFactor: 1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			return l
		},
		recreate: func(t *testing.T) {
			waltest.DeleteTopic(t, kc.ListenAddrs(), walkafka.DefaultTopicPrefix+string(recreatedP))
		},
	}
}

// startOn starts node n1 consuming recreatedP of w, with its state in dir;
// closed when the test ends.
func startOn(t *testing.T, w *wal.WAL, dir string, app Applier, acks Acker) *Node {
	t.Helper()
	n, err := New(Config{Name: "n1", WAL: w, PChannels: []message.PChannel{recreatedP}, Applier: app, Acker: acks, StateDir: dir,
		Backoff: fastBackoff, LogCheckInterval: 50 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// fiveThenRecreated appends broadcasts 1 to 5 to rl's log, has a node
// (start) apply them and stop, then deletes the log and opens it again,
// empty, as its coordinator would create it.
func fiveThenRecreated(t *testing.T, rl realLog, app *countApplier, start func(*wal.WAL) *Node) *wal.WAL {
	t.Helper()
	w := wal.New(rl.open(t))
	appendIDs(t, w, 1, 2, 3, 4, 5)
	n := start(w)
	waitFor(t, "five copies applied", func() bool { return app.count(vA, 5) == 1 })
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	rl.recreate(t)
	return wal.New(rl.open(t))
}

// appendIDs appends one entry per id, a copy to wal-0/a each.
func appendIDs(t *testing.T, w *wal.WAL, ids ...uint64) {
	t.Helper()
	for _, id := range ids {
		raw, err := message.Marshal(&message.Message{Type: typCreate, Broadcast: message.BroadcastHeader{ID: id, VChannels: []message.VChannel{vA}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Append(ctxT(t, 10*time.Second), recreatedP, []wal.Item{{Message: raw, VChannels: []message.VChannel{vA}}}); err != nil {
			t.Fatal(err)
		}
	}
}

// anonymous hides a log's identity (wal.Identified): a backend that cannot
// tell one incarnation of its log from another.
type anonymous struct{ wal.Log }

// TestR9_3_RecreatedLogHaltsTheNode: on a backend that cannot tell its
// log's identity, a node whose saved position is past the end of its log
// (the stream or topic was deleted and created again with fewer entries)
// does not wait there while the new log's entries go unapplied and their
// tasks wait for acks: the pchannel halts, saying why and how to re-sync,
// both at start and when it happens under a running node; after Resync the
// node reads the new log from its start, applies its copies and keeps what
// it had applied. On NATS and on Kafka.
func TestR9_3_RecreatedLogHaltsTheNode(t *testing.T) {
	for name, mk := range map[string]func(*testing.T) realLog{"nats": natsLog, "kafka": kafkaLog} {
		t.Run(name, func(t *testing.T) {
			real := mk(t)
			rl := realLog{open: func(t *testing.T) wal.Log { return anonymous{real.open(t)} }, recreate: real.recreate}
			dir := t.TempDir()
			app, acks := newCountApplier(), &recAcker{}
			startNode := func(w *wal.WAL) *Node { return startOn(t, w, dir, app, acks) }
			w := fiveThenRecreated(t, rl, app, startNode)
			appendIDs(t, w, 6, 7)
			n := startNode(w)
			st, _ := n.PChannel(recreatedP)
			if st.Stage != StageHalted || !strings.Contains(st.Halted, "past the end of the log") || !strings.Contains(st.Halted, "walcast node resync") {
				t.Fatalf("node on the recreated log: stage %s, halted %q", st.Stage, st.Halted)
			}
			if app.count(vA, 6) != 0 {
				t.Fatal("a halted pchannel applied an entry")
			}
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
			if had, err := Resync(dir, "n1", recreatedP); err != nil || !had {
				t.Fatalf("resync: %v, %v", had, err)
			}
			n = startNode(w)
			waitFor(t, "the new log's copies applied", func() bool { return app.count(vA, 7) == 1 })
			for id := uint64(1); id <= 7; id++ {
				if got := app.count(vA, id); got != 1 {
					t.Errorf("broadcast %d applied %d times, want once", id, got)
				}
			}

			// Under the running node (at offset 2 of the new log), the log
			// is recreated again with one entry.
			rl.recreate(t)
			w2 := wal.New(rl.open(t))
			appendIDs(t, w2, 8)
			waitFor(t, "the running node to halt", func() bool {
				st, _ := n.PChannel(recreatedP)
				return st.Stage == StageHalted
			})
			if app.count(vA, 8) != 0 {
				t.Fatal("the halted pchannel applied an entry of the recreated log")
			}
		})
	}
}

// TestR9_14_RecreatedLogHaltsTheNode: a node knows which log it read (its
// identity: the NATS stream's creation, the Kafka topic's id). A log
// deleted and created again that has grown past the node's saved position
// halts the pchannel, saying why and how to re-sync, before anything of it
// is applied, whether the node was down when the log changed or running;
// after Resync the node reads the new log from its start and applies every
// copy once. On NATS and on Kafka.
func TestR9_14_RecreatedLogHaltsTheNode(t *testing.T) {
	for name, mk := range map[string]func(*testing.T) realLog{"nats": natsLog, "kafka": kafkaLog} {
		t.Run(name, func(t *testing.T) {
			rl := mk(t)
			dir := t.TempDir()
			app, acks := newCountApplier(), &recAcker{}
			startNode := func(w *wal.WAL) *Node { return startOn(t, w, dir, app, acks) }
			halted := func(n *Node) bool {
				st, _ := n.PChannel(recreatedP)
				return st.Stage == StageHalted && strings.Contains(st.Halted, "is not the one its position") &&
					strings.Contains(st.Halted, "walcast node resync --name n1 --pchannel "+string(recreatedP))
			}
			ids := func(from, to uint64) []uint64 {
				var out []uint64
				for id := from; id <= to; id++ {
					out = append(out, id)
				}
				return out
			}
			// Down: the new log grows past the saved position (5).
			w := fiveThenRecreated(t, rl, app, startNode)
			appendIDs(t, w, ids(6, 13)...)
			n := startNode(w)
			if !halted(n) {
				st, _ := n.PChannel(recreatedP)
				t.Fatalf("node started on a recreated log longer than its position: stage %s, halted %q", st.Stage, st.Halted)
			}
			for id := uint64(6); id <= 13; id++ {
				if app.count(vA, id) != 0 {
					t.Fatalf("the halted pchannel applied broadcast %d of the new log", id)
				}
			}
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
			if had, err := Resync(dir, "n1", recreatedP); err != nil || !had {
				t.Fatalf("resync: %v, %v", had, err)
			}
			n = startNode(w)
			waitFor(t, "the new log's copies applied", func() bool { return app.count(vA, 13) == 1 })

			// Running: the log is recreated under the node (at offset 8
			// of the second log) and grows past it.
			rl.recreate(t)
			w2 := wal.New(rl.open(t))
			appendIDs(t, w2, ids(14, 25)...)
			waitFor(t, "the running node to halt", func() bool { return halted(n) })
			for id := uint64(1); id <= 13; id++ {
				if got := app.count(vA, id); got != 1 {
					t.Errorf("broadcast %d applied %d times, want once", id, got)
				}
			}
			for id := uint64(14); id <= 25; id++ {
				if app.count(vA, id) != 0 {
					t.Fatalf("the running node applied broadcast %d of the recreated log", id)
				}
			}
		})
	}
}

// dippingLog reports an end below the truth for its first dips End calls,
// as a new Kafka partition leader may for a moment.
type dippingLog struct {
	wal.Log
	mu   sync.Mutex
	dips int
}

func (l *dippingLog) End(ctx context.Context, p message.PChannel) (uint64, error) {
	l.mu.Lock()
	dip := l.dips > 0
	l.dips--
	l.mu.Unlock()
	if dip {
		return 0, nil
	}
	return l.Log.End(ctx, p)
}

// TestR9_3_MomentarilyLowerEndDoesNotHalt: one read of the log's end below
// the node's position (a leader change) does not halt the pchannel; only an
// end that stays below it does.
func TestR9_3_MomentarilyLowerEndDoesNotHalt(t *testing.T) {
	mem := wmem.New(recreatedP)
	dl := &dippingLog{Log: mem}
	w := wal.New(dl)
	appendIDs(t, w, 1, 2, 3)
	app := newCountApplier()
	cfg := Config{Name: "n1", WAL: w, PChannels: []message.PChannel{recreatedP}, Applier: app, Acker: &recAcker{}, StateDir: t.TempDir(),
		Backoff: fastBackoff, LogCheckInterval: 20 * time.Millisecond, Logger: quiet}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "three copies applied", func() bool { return app.count(vA, 3) == 1 })
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	dl.mu.Lock()
	dl.dips = 2 // the check at Start and the first of its confirmations
	dl.mu.Unlock()
	n, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	appendIDs(t, w, 4)
	waitFor(t, "the fourth copy applied", func() bool { return app.count(vA, 4) == 1 })
	if st, _ := n.PChannel(recreatedP); st.Halted != "" {
		t.Fatalf("halted on one low read of the end: %s", st.Halted)
	}
}
