package meta

import (
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/catalog/memory"
)

// TestImporterSplitsCommitsByBytes: a step's writes are split by the
// catalog's byte limit as well as by its op limit, so that many unfinished
// jobs with long file lists (which together exceed one transaction's bytes
// though not its ops) still advance, instead of failing every step.
func TestImporterSplitsCommitsByBytes(t *testing.T) {
	ctx := ctxT(t)
	store := memory.NewStore()
	cat := store.Open()
	files := make([]string, MaxImportFiles)
	for i := range files {
		files[i] = strings.Repeat("f", MaxFileLength-8) + ".parquet"
	}
	coll := collRecord{ID: 1, DatabaseID: 2, Database: "db", Name: "c"}
	if err := cat.Commit(ctx, catalog.Put(collKey(coll.ID), mustJSON(coll))); err != nil {
		t.Fatal(err)
	}
	const jobs = 20
	var one int
	for i := range uint64(jobs) {
		j := jobRecord{ID: 100 + i, DatabaseID: 2, CollectionID: coll.ID, Collection: "c", Files: files, State: jobPending}
		op := catalog.Put(jobKey(j.ID), mustJSON(j))
		one = catalog.Size([]catalog.Op{op})
		if err := cat.Commit(ctx, op); err != nil {
			t.Fatal(err)
		}
	}
	// Room for a few jobs per transaction, and for all of them by ops.
	store.SetLimits(catalog.Limits{MaxOps: 128, MaxBytes: 3*one + one/2})

	s := &Service{cfg: Config{ImportJobRetention: time.Hour, Clock: time.Now}, log: quiet}
	for _, want := range []jobState{jobRunning, jobCompleted} {
		if err := s.importStep(ctx, cat); err != nil {
			t.Fatalf("import step towards state %d: %v", want, err)
		}
		got, err := list[jobRecord](ctx, reader{cat}, prefixImportJob)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != jobs {
			t.Fatalf("%d jobs, want %d", len(got), jobs)
		}
		for _, j := range got {
			if j.State != want {
				t.Fatalf("job %d in state %d after the step, want %d", j.ID, j.State, want)
			}
		}
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
