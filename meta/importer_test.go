package meta

import (
	"testing"
	"time"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/catalog/memory"
)

// TestImporterExpiresInBatches: the jobs and dropped names that outlived
// ImportJobRetention are deleted in commits within the catalog's op limit,
// so that many of them (more than one transaction holds) still go, instead
// of failing every step; the others stay.
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
	if err := cat.Commit(ctx, old, recent); err != nil {
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
	if len(names) != 1 || names[0] != recent.Key {
		t.Fatalf("dropped names %v, want only %s", names, recent.Key)
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
