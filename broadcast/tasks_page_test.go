package broadcast_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// TestR9_5_TasksWalkTombstonesAChunkAtATime: Tasks reads the tombstones a
// bounded chunk at a time from its cursor (R10.1: no page copies the whole
// set) and lists exactly what a look at all of them would: in id order
// either way, within AfterID/BeforeID, filtered by type, cut at Limit,
// paging through every one once.
func TestR9_5_TasksWalkTombstonesAChunkAtATime(t *testing.T) {
	broadcast.SetTasksChunk(t, 3)
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 20*time.Second)
	targets := []message.VChannel{vch(1, "a")}
	var all, creates []uint64
	for i := range 40 {
		typ := typDrop
		if i%3 == 0 {
			typ = typCreate
		}
		r, err := do(ctx, b, msgOf(t, typ, fmt.Sprint("p", i), targets), resource.ExclusiveDatabase("db"))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, r.BroadcastID)
		if typ == typCreate {
			creates = append(creates, r.BroadcastID)
		}
	}
	waitIdle(t, b)
	ids := func(f broadcast.Filter) []uint64 {
		t.Helper()
		ts, err := b.Tasks(f)
		if err != nil {
			t.Fatal(err)
		}
		var out []uint64
		for _, ti := range ts {
			out = append(out, ti.ID)
		}
		return out
	}
	tomb := []broadcast.State{broadcast.Tombstone}
	desc := slices.Clone(all)
	slices.Reverse(desc)
	cases := map[string]struct {
		f    broadcast.Filter
		want []uint64
	}{
		"every one, oldest first": {broadcast.Filter{States: tomb}, all},
		"every one, newest first": {broadcast.Filter{States: tomb, Newest: true}, desc},
		"a page, oldest first":    {broadcast.Filter{States: tomb, AfterID: all[4], Limit: 7}, all[5:12]},
		"a page, newest first":    {broadcast.Filter{States: tomb, BeforeID: all[30], Newest: true, Limit: 7}, desc[10:17]},
		"between two ids":         {broadcast.Filter{States: tomb, AfterID: all[10], BeforeID: all[14]}, all[11:14]},
		"by type, in chunks":      {broadcast.Filter{States: tomb, Type: typCreate, AfterID: creates[1], Limit: 5}, creates[2:7]},
	}
	for name, c := range cases {
		if got := ids(c.f); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: %v, want %v", name, got, c.want)
		}
	}
	// Paging newest first by BeforeID lists every tombstone once.
	var paged []uint64
	f := broadcast.Filter{States: tomb, Newest: true, Limit: 6}
	for range 20 {
		page := ids(f)
		if len(page) == 0 {
			break
		}
		paged = append(paged, page...)
		f.BeforeID = page[len(page)-1]
	}
	if fmt.Sprint(paged) != fmt.Sprint(desc) {
		t.Fatalf("paged newest first: %v, want %v", paged, desc)
	}
}
