package meta

import (
	"slices"
	"testing"
	"time"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/catalog/memory"
)

// TestImporterExpiresInBatches: the jobs and dropped names that outlived
// ImportJobRetention are deleted in commits within the catalog's op limit,
// so that many of them (more than one transaction holds) still go, instead
// of failing every step; the others stay, and so does a dropped name
// whose collection still has jobs. A dropped collection's pointer from its
// id (left by a rename) goes with its entry.
func TestImporterExpiresInBatches(t *testing.T) {
	ctx := ctxT(t)
	store := memory.NewStore()
	cat := store.Open()
	now := time.Now()
	const jobs = 150 // two ops each: beyond one transaction of 128
	for i := range uint64(jobs) {
		j := jobRecord{ID: 100 + i, DatabaseID: 2, CollectionID: 1, Collection: "c", Files: []string{"f.csv"}, State: jobCompleted,
			UpdatedAt: now.Add(-2 * time.Hour).UnixNano()}
		if i%10 == 0 {
			j.State, j.UpdatedAt = jobPending, now.Add(-3*time.Hour).UnixNano() // unfinished: kept, however old
		}
		if i%10 == 1 {
			j.UpdatedAt = now.UnixNano() // finished just now: kept
		}
		if err := cat.Commit(ctx, catalog.Put(jobKey(j.ID), mustJSON(j))); err != nil {
			t.Fatal(err)
		}
	}
	old := catalog.Put(droppedKey(2, "gone", 7), mustJSON(droppedRecord{DroppedAt: now.Add(-2 * time.Hour).UnixNano()}))
	recent := catalog.Put(droppedKey(2, "gone", 8), mustJSON(droppedRecord{DroppedAt: now.UnixNano()}))
	// Collection 1 was dropped long ago, but some of its jobs stay: so does
	// its entry, which tells their look-ups it was dropped.
	withJobs := catalog.Put(droppedKey(2, "c", 1), mustJSON(droppedRecord{DroppedAt: now.Add(-3 * time.Hour).UnixNano()}))
	// The pointers renamed collections left go with their entries.
	moved := func(id uint64) catalog.Op { return catalog.Put(collMovedKey(id), mustJSON(movedRecord{Name: "gone"})) }
	if err := cat.Commit(ctx, old, recent, withJobs, moved(1), moved(7), moved(8), moved(9)); err != nil {
		t.Fatal(err)
	}
	s := &Service{cfg: Config{ImportJobRetention: time.Hour, Clock: time.Now}, log: quiet}
	if err := s.expire(ctx, cat); err != nil {
		t.Fatal(err)
	}
	got, err := list[jobRecord](ctx, reader{cat}, prefixImportJob)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2*jobs/10 {
		t.Fatalf("%d jobs left, want %d", len(got), 2*jobs/10)
	}
	for _, j := range got {
		if (j.ID-100)%10 > 1 {
			t.Fatalf("expired job %d kept", j.ID)
		}
	}
	var names []string
	if err := cat.List(ctx, prefixDropped, func(k string, _ []byte) error { names = append(names, k); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(names) != 2 || names[0] != withJobs.Key || names[1] != recent.Key {
		t.Fatalf("dropped names %v, want only %s and %s", names, withJobs.Key, recent.Key)
	}
	var pointers []string
	if err := cat.List(ctx, prefixCollMoved, func(k string, _ []byte) error { pointers = append(pointers, k); return nil }); err != nil {
		t.Fatal(err)
	}
	// 9: a live collection's.
	if want := []string{collMovedKey(1), collMovedKey(8), collMovedKey(9)}; !slices.Equal(pointers, want) {
		t.Fatalf("pointers of renamed collections %v, want %v", pointers, want)
	}
}

// TestFittingSplitsByOpsAndBytes: fitting takes the longest prefix within
// both bounds, and at least one op.
func TestFittingSplitsByOpsAndBytes(t *testing.T) {
	op := func(n int) catalog.Op { return catalog.Put("k", make([]byte, n-1)) } // n bytes with its key
	for _, tc := range []struct {
		lim  catalog.Limits
		ops  []catalog.Op
		want int
	}{
		{catalog.Limits{MaxOps: 2, MaxBytes: 100}, []catalog.Op{op(1), op(1), op(1)}, 2},
		{catalog.Limits{MaxOps: 10, MaxBytes: 100}, []catalog.Op{op(40), op(60), op(1)}, 2},
		{catalog.Limits{MaxOps: 10, MaxBytes: 100}, []catalog.Op{op(40), op(61)}, 1},
		{catalog.Limits{MaxOps: 10, MaxBytes: 100}, []catalog.Op{op(200), op(1)}, 1},
		{catalog.Limits{MaxOps: 10, MaxBytes: 100}, []catalog.Op{op(1), op(1)}, 2},
		{catalog.Limits{}, []catalog.Op{op(1), op(1)}, 1},
	} {
		if got := fitting(tc.lim, tc.ops); got != tc.want {
			t.Errorf("fitting(%+v, %d ops) = %d, want %d", tc.lim, len(tc.ops), got, tc.want)
		}
	}
}
