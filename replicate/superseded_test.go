package replicate_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/replicate"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// runReplicator runs a replicator of cfg until the test ends; it returns
// it for its status.
func runReplicator(t *testing.T, cfg replicate.Config) *replicate.Replicator {
	t.Helper()
	r, stop := start(t, cfg)
	t.Cleanup(stop)
	return r
}

// stoppedWith reports whether every pchannel of r stopped with an error
// matching want.
func stoppedWith(r *replicate.Replicator, want string) bool {
	for _, s := range r.Status() {
		if !strings.Contains(s.LastError, want) {
			return false
		}
	}
	return true
}

// TestR8_5_FollowerRefusesEntriesOfASupersededPrimary: a secondary (north)
// still following a primary (east) that another secondary (west) was
// promoted over copies east's history up to the positions west had
// replicated, as the mark west left in east's WAL says, and none of what
// east wrote after them (the entries lost with the promote); and a
// follower never copies an entry of a lower generation than one it copied
// (a superseded primary writing into a log its successor writes too).
func TestR8_5_FollowerRefusesEntriesOfASupersededPrimary(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	src := wmem.New(pchans...)
	east := wal.New(src, wal.WithCluster("east"))
	appendSource(t, east, 0, 10)
	mark := &replicate.Promotion{Cluster: "west", Replaced: "east", Generation: 1, PromotedAt: time.Now(), Positions: map[message.PChannel]uint64{}}
	for _, p := range pchans {
		end, err := east.End(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		mark.Positions[p] = end
	}
	appendSource(t, east, 10, 10) // never replicated to west
	dst := wmem.New(pchans...)
	r := runReplicator(t, replicate.Config{SourceCluster: "east", Source: east, Dest: wal.New(dst, wal.WithCluster("north")),
		PChannels: pchans, Types: types(), Catalog: cmem.New(), Logger: quiet,
		Superseded: func(context.Context) (*replicate.Promotion, error) { return mark, nil }})
	waitFor(t, "north to stop at the positions of west's promote", func() bool { return stoppedWith(r, "superseded by west's promote") })
	copied := 0
	for p, cs := range replicas(t, dst) {
		for _, c := range cs {
			if off := wal.EntryOffset(c.Message.Replicate.SourceMessageID); off >= mark.Positions[p] {
				t.Fatalf("north copied %s's entry at %d, past west's position %d", p, off, mark.Positions[p])
			}
			copied++
		}
	}
	if copied != 16 { // 8 replicable broadcasts of the first 10, 2 copies each
		t.Fatalf("north copied %d copies of east's history before the promote, want 16", copied)
	}

	// Generations only grow in a log a follower reads.
	src2 := wmem.New(pchans...)
	appendSource(t, wal.New(src2, wal.WithCluster("east"), wal.WithGeneration(func() uint64 { return 2 })), 0, 4)
	appendSource(t, wal.New(src2, wal.WithCluster("east")), 4, 4)
	dst2 := wmem.New(pchans...)
	r2 := runReplicator(t, replicate.Config{SourceCluster: "east", Source: wal.New(src2, wal.WithCluster("east")), Dest: wal.New(dst2, wal.WithCluster("north")),
		PChannels: pchans, Types: types(), Catalog: cmem.New(), Logger: quiet})
	waitFor(t, "north to stop at the first entry of generation 0", func() bool {
		for _, s := range r2.Status() {
			if !strings.Contains(s.LastError, "of generation 0, after entries of generation 2") {
				return false
			}
		}
		return true
	})
	for _, cs := range replicas(t, dst2) {
		for _, c := range cs {
			if c.Message.Broadcast.ID > 4 {
				t.Fatalf("north copied broadcast %d, written at generation 0 after generation 2", c.Message.Broadcast.ID)
			}
		}
	}
}
