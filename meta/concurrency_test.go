package meta

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/resource"
)

// TestR10_2_DDLOnDifferentCollectionsInParallel checks the lock structure,
// not timings: while a CreateIndex on collection "blocked" is held inside
// its ack callback (so its task holds Collection(db:blocked) exclusively
// and Database(db) shared), a CreateCollection of another collection in the
// same database completes, and a DropCollection of "blocked" waits for the
// collection's key until the callback is released; then it completes after
// the index.
func TestR10_2_DDLOnDifferentCollectionsInParallel(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	c := e.c
	must[*walcastv1.CreateDatabaseResponse](t)(c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"}))
	blocked := must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "blocked"})).Collection
	imp := &walcastv1.ImportRequest{Database: "db", Collection: "blocked", Files: []string{e.writeImport("f.jsonl", jsonlRows(1))}}
	job := must[*walcastv1.ImportResponse](t)(c.Import(ctx, imp)).Job

	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func(ctx context.Context, ev *broadcast.Event) error {
		if ev.Message.Type != TypeCreateIndex {
			return nil
		}
		once.Do(func() { close(entered) })
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	e.app.hook.Store(&hook)
	defer e.app.hook.Store(nil)

	type done struct {
		id  uint64
		err error
	}
	indexDone := make(chan done, 1)
	go func() {
		r, err := c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "db", Collection: "blocked", Name: "i", Field: "vector"})
		indexDone <- done{r.GetResult().GetBroadcastId(), err}
	}()
	<-entered // the index's callback runs, holding the collection's key

	dropDone := make(chan done, 1)
	go func() {
		r, err := c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "blocked"})
		dropDone <- done{r.GetResult().GetBroadcastId(), err}
	}()
	// The drop queues for Collection(db:blocked).
	eventually(t, "the drop waits for the collection's key", func() error {
		for _, ks := range e.b().Locks() {
			if ks.Domain == resource.Collection && ks.Name == "db:blocked" && len(ks.Waiters) > 0 {
				return nil
			}
		}
		return fmt.Errorf("no waiter on Collection:db:blocked in %v", e.b().Locks())
	})

	// Another collection of the same database is created meanwhile.
	other := must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "other"}))
	if other.Collection.Id == 0 {
		t.Fatal(other)
	}
	// A retry of an accepted import is answered although the collection's
	// keys are busy (R7.5).
	again := must[*walcastv1.ImportResponse](t)(c.Import(ctx, imp))
	if !again.Result.Duplicated || again.Job.Id != job.Id {
		t.Fatalf("import retry while the collection is locked: %v", again)
	}
	select {
	case d := <-indexDone:
		t.Fatalf("the blocked CreateIndex returned: %+v", d)
	case d := <-dropDone:
		t.Fatalf("the DropCollection of the blocked collection returned: %+v", d)
	default:
	}

	close(release)
	idx, drop := <-indexDone, <-dropDone
	if idx.err != nil || drop.err != nil {
		t.Fatalf("index %v, drop %v", idx.err, drop.err)
	}
	// The drop took the key after the index's task released it.
	if drop.id <= idx.id {
		t.Fatalf("drop broadcast %d not after index broadcast %d", drop.id, idx.id)
	}
	colls := must[[]*walcastv1.Collection](t)(c.ListCollections(ctx, "db"))
	if len(colls) != 1 || colls[0].Name != "other" {
		t.Fatalf("collections %v (blocked was %d)", colls, blocked.Id)
	}
	eventually(t, "views", func() error { return e.viewsMatch(ctx, []*walcastv1.Collection{blocked}) })
}

// BenchmarkCreateCollections creates 16 collections of one database per
// iteration, one after the other or all at once: DDL on different
// collections holds non-conflicting keys, so the concurrent run overlaps
// their WAL appends, catalog commits and callbacks (compare ns/op).
func BenchmarkCreateCollections(b *testing.B) {
	const n = 16
	e := startEnv(b)
	ctx := context.Background()
	must[*walcastv1.CreateDatabaseResponse](b)(e.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "bench"}))
	seq := 0
	create := func() error {
		seq++
		_, err := e.c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "bench", Name: fmt.Sprintf("c%d", seq)})
		return err
	}
	names := func(k int) []string {
		out := make([]string, k)
		for i := range out {
			seq++
			out[i] = fmt.Sprintf("c%d", seq)
		}
		return out
	}
	b.Run("sequential", func(b *testing.B) {
		for b.Loop() {
			for range n {
				if err := create(); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/collection")
	})
	b.Run("concurrent", func(b *testing.B) {
		for b.Loop() {
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for _, name := range names(n) {
				wg.Go(func() {
					_, err := e.c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "bench", Name: name})
					errs <- err
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/collection")
	})
}
