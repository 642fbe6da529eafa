package engine

import (
	"testing"
	"time"
)

// TestR9_9_TimelinesKeepTheLastFinished: the timelines of finished tasks
// are kept for the last MaxTimelines to finish, the oldest forgotten first.
func TestR9_9_TimelinesKeepTheLastFinished(t *testing.T) {
	var ts timelines
	for id := uint64(1); id <= MaxTimelines+10; id++ {
		ts.keep(id, Timeline{Tombstoned: time.Unix(int64(id), 0)})
	}
	if len(ts.byID) != MaxTimelines {
		t.Fatalf("%d timelines kept, want %d", len(ts.byID), MaxTimelines)
	}
	for id := uint64(1); id <= MaxTimelines+10; id++ {
		i, ok := ts.byID[id]
		if want := id > 10; ok != want {
			t.Fatalf("timeline %d kept %v, want %v", id, ok, want)
		}
		if ok && (ts.ring[i].id != id || ts.ring[i].tl.Tombstoned.Unix() != int64(id)) {
			t.Fatalf("timeline %d is another's: %d, %v", id, ts.ring[i].id, ts.ring[i].tl.Tombstoned)
		}
	}
}
