package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// TestR9_9_NodeAcksTableIsBounded: the leader's table of its nodes' acks
// keeps one row per node and pchannel (the last ack's position, time and a
// count), holds at most maxNodeAcks rows by dropping the one acked least
// recently, and is emptied for a new term.
func TestR9_9_NodeAcksTableIsBounded(t *testing.T) {
	n := newNodeAcks()
	now := time.Unix(1000, 0)
	n.now = func() time.Time { now = now.Add(time.Second); return now }
	ack := func(v string, pos uint64) broadcast.Ack {
		return broadcast.Ack{BroadcastID: pos, VChannel: message.VChannel(v), Checkpoint: wal.Checkpoint{MessageID: pos}}
	}
	n.record("n1", ack("wal-0/a", 5), ack("wal-0/b", 6), ack("wal-1/a", 7))
	n.record("n2", ack("wal-0/a", 8))
	got := n.snapshot()
	if len(got) != 3 || got[0].Node != "n1" || got[0].PChannel != "wal-0" || got[0].Position != 6 || got[0].Acks != 2 ||
		got[1].PChannel != "wal-1" || got[2].Node != "n2" {
		t.Fatalf("rows %+v", got)
	}
	for i := range maxNodeAcks {
		n.record(fmt.Sprint("m", i), ack("wal-0/a", 1))
	}
	got = n.snapshot()
	if len(got) != maxNodeAcks {
		t.Fatalf("%d rows, want the bound %d", len(got), maxNodeAcks)
	}
	for _, r := range got {
		if r.Node == "n1" || r.Node == "n2" {
			t.Fatalf("%s's row was acked least recently and is still there", r.Node)
		}
	}
	n.reset()
	if got := n.snapshot(); len(got) != 0 {
		t.Fatalf("%d rows after a new term", len(got))
	}
}
