package replicate_test

import (
	"log/slog"
	"testing"

	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/replicate"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// TestR8_2_ResumeTrustsOnlyItsOwnReplicas: the secondary's log already
// holds another secondary's replicas of a primary of the same name (two
// clusters left on one stream prefix, as a fresh catalog prefix on a shared
// NATS leaves them). A replicator with no checkpoint copies every entry of
// its primary anyway: the other cluster's replicas are not taken for its own
// progress (they were, and the primary's first entries were never copied).
func TestR8_2_ResumeTrustsOnlyItsOwnReplicas(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	shared := wmem.New(pchans...)
	// The other secondary, "north", replicated an older "east" into the
	// shared log.
	oldLog := wmem.New(pchans...)
	appendSource(t, wal.New(oldLog), 0, 10)
	stop := run(t, replicate.Config{SourceCluster: "east", Source: wal.New(oldLog), Dest: wal.New(shared, wal.WithCluster("north")),
		PChannels: pchans, Types: types(), Catalog: cmem.New(), Logger: quiet})
	waitFor(t, "north's replicas", func() bool {
		rs := replicas(t, shared)
		return len(rs["wal-0"])+len(rs["wal-1"]) == 16 // 8 replicable x 2 copies
	})
	stop()
	north := len(shared.Entries("wal-0")) + len(shared.Entries("wal-1"))

	srcLog := wmem.New(pchans...)
	appendSource(t, wal.New(srcLog, wal.WithCluster("east")), 0, 5)
	west := wal.New(shared, wal.WithCluster("west"))
	stop = run(t, replicate.Config{SourceCluster: "east", Source: wal.New(srcLog, wal.WithCluster("east")), Dest: west,
		PChannels: pchans, Types: types(), Catalog: cmem.New(), Logger: quiet})
	defer stop()
	count := func() (n int) {
		for _, p := range pchans {
			if err := west.ReadToEnd(t.Context(), p, 0, func(wal.Copy) error { n++; return nil }); err != nil {
				t.Fatal(err)
			}
		}
		return n
	}
	waitFor(t, "west's replicas of all of east's entries", func() bool { return count() == 8 }) // 4 replicable x 2 copies
	for _, p := range pchans {
		if err := west.ReadToEnd(t.Context(), p, 0, func(c wal.Copy) error {
			if c.Entry != (wal.Header{Cluster: "west", ReplicatedFrom: "east"}) {
				t.Errorf("%s@%d: west read an entry of %+v", p, c.Offset, c.Entry)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(shared.Entries("wal-0")) + len(shared.Entries("wal-1")); n <= north {
		t.Fatalf("west appended nothing: %d entries, north's %d", n, north)
	}
}
