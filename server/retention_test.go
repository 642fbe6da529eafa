package server

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/node"
	"github.com/walcast/walcast/wal"
)

// endsLog is a wal.Truncater whose lanes end where the test says, and
// which records its truncations.
type endsLog struct {
	wal.Log
	ends   map[message.PChannel]uint64
	truncs map[message.PChannel]uint64
}

func (l *endsLog) End(_ context.Context, p message.PChannel) (uint64, error) { return l.ends[p], nil }
func (l *endsLog) Truncate(_ context.Context, p message.PChannel, before uint64) error {
	l.truncs[p] = before
	return nil
}

// TestR9_1_WALRetentionKeepsWhatIsNeeded: standalone's WAL retention
// truncates a lane below the entries that are older than the retention and
// that every node consuming one of its pchannels saved past, keeps the last
// entry, truncates nothing younger than the retention, and nothing at all
// while the cluster is in a replication topology.
func TestR9_1_WALRetentionKeepsWhatIsNeeded(t *testing.T) {
	pchans := []message.PChannel{"wal-0", "wal-1", "wal-2"}
	l := &endsLog{ends: map[message.PChannel]uint64{}, truncs: map[message.PChannel]uint64{}}
	w := wal.New(l, wal.WithLanes(1, pchans))
	lane := wal.LaneName(0)
	saved := map[message.PChannel]uint64{"wal-0": 50, "wal-1": 70} // wal-2 has no node here
	nodes := func() []node.Status {
		var ps []node.PChannelStatus
		for p, off := range saved {
			ps = append(ps, node.PChannelStatus{PChannel: p, SavedOffset: off})
		}
		return []node.Status{{Name: "n", PChannels: ps}}
	}
	replicated := false
	r := newWALRetention(l, w, pchans, time.Minute, nodes, func() bool { return replicated }, slog.New(slog.DiscardHandler))
	at := time.Unix(1000, 0)
	step := func(d time.Duration, end uint64) {
		t.Helper()
		at = at.Add(d)
		l.ends[lane] = end
		r.step(context.Background(), at)
	}
	step(0, 40)
	step(30*time.Second, 60)
	if len(l.truncs) != 0 {
		t.Fatalf("truncated %v before any entry was a minute old", l.truncs)
	}
	step(30*time.Second, 80) // entries below 40 are a minute old
	if got := l.truncs[lane]; got != 40 {
		t.Fatalf("truncated below %d, want 40 (older than the retention)", got)
	}
	step(60*time.Second, 200) // entries below 80 are old; wal-0's node saved up to 50
	if got := l.truncs[lane]; got != 50 {
		t.Fatalf("truncated below %d, want 50 (a node's saved position)", got)
	}
	saved["wal-0"], saved["wal-1"] = 500, 500
	step(60*time.Second, 200) // everything is old and saved: the last entry stays
	if got := l.truncs[lane]; got != 199 {
		t.Fatalf("truncated below %d, want 199 (the last entry stays)", got)
	}
	replicated = true
	step(60*time.Second, 400)
	step(60*time.Second, 400)
	if got := l.truncs[lane]; got != 199 {
		t.Fatalf("truncated below %d in a replication topology", got)
	}
}
