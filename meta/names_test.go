package meta

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/broadcast"
)

// TestR10_2_NamesResolvedAfterRestart checks that the names view a
// restarted process builds from the catalog gives the answers the catalog
// gives: an existing collection or database is refused as existing, a
// dropped collection's name is free (and leaves no entry in the view), an
// unknown database is not found; and that the view is the leader's after a
// CreateCollection.
func TestR10_2_NamesResolvedAfterRestart(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	c := e.c
	db := must[*walcastv1.CreateDatabaseResponse](t)(c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"})).Database
	for _, n := range []string{"kept", "dropped"} {
		must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: n}))
	}
	must[*walcastv1.DropCollectionResponse](t)(c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "dropped"}))
	// A name freed by a drop that succeeded leaves no entry behind.
	e.app.names.mu.Lock()
	_, kept := e.app.names.m[collNameKey(db.Id, "dropped")]
	_, keptID := e.app.names.id(collNameKey(db.Id, "dropped"))
	kept = kept || keptID
	size := len(e.app.names.m) + e.app.names.ids.Len()
	if len(e.app.names.m) != 0 {
		t.Errorf("settled names kept as entries: %d, want each as an id only", len(e.app.names.m))
	}
	e.app.names.mu.Unlock()
	if kept || size != 2 {
		t.Fatalf("after the drop the view holds %d names, the dropped one: %t; want the database and kept", size, kept)
	}

	e.stop()
	e.start(e.mc) // same data directory: a new process, a new view
	if got := e.app.names.term.Load(); got != nil {
		t.Fatalf("the view of a new process is of broadcaster %p before any request", got)
	}
	c = e.c
	_, err := c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "kept"})
	wantCode(t, err, connect.CodeAlreadyExists)
	// The first request started the view's rebuild (it read the catalog
	// meanwhile); the view becomes the leader's.
	eventually(t, "the view to be the leader's", func() error {
		if got := e.app.names.term.Load(); got != e.b() {
			return fmt.Errorf("the view is of %p, the leader's broadcaster is %p", got, e.b())
		}
		return nil
	})
	again := must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "dropped"}))
	if again.Collection.DatabaseId != db.Id {
		t.Fatalf("recreated in database %d, want %d", again.Collection.DatabaseId, db.Id)
	}
	_, err = c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "nodb", Name: "x"})
	wantCode(t, err, connect.CodeNotFound)
	_, err = c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"})
	wantCode(t, err, connect.CodeAlreadyExists)
	// Both agree with the catalog.
	colls := must[[]*walcastv1.Collection](t)(c.ListCollections(ctx, "db"))
	if len(colls) != 2 || colls[0].Name != "dropped" || colls[1].Name != "kept" {
		t.Fatalf("collections %v", colls)
	}
}

// TestR10_2_NamesRebuildKeepsChangesOfLiveTasks checks how the view is
// rebuilt for a new broadcaster: a change staged by a task still live there
// (its callback ran, its TOMBSTONE is not durable) stands over the
// catalog; one staged by a task that is a tombstone, or that the
// broadcaster does not know, gives way to the catalog; and a change staged
// by a broadcast that did not succeed (force-completed, its effects not
// written) is read from the catalog.
func TestR10_2_NamesRebuildKeepsChangesOfLiveTasks(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	c := e.c
	db := must[*walcastv1.CreateDatabaseResponse](t)(c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"}))
	coll := must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "coll"}))

	// A live task: a CreateIndex held in its callback.
	entered, release := make(chan uint64, 1), make(chan struct{})
	var once sync.Once
	hook := func(ctx context.Context, ev *broadcast.Event) error {
		if ev.Message.Type != TypeCreateIndex {
			return nil
		}
		once.Do(func() { entered <- ev.Message.Broadcast.ID })
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	e.app.hook.Store(&hook)
	defer e.app.hook.Store(nil)
	indexDone := make(chan error, 1)
	go func() {
		_, err := c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "db", Collection: "coll", Name: "i", Field: "vector"})
		indexDone <- err
	}()
	live := <-entered

	dbID := db.Database.Id
	n, b, r := e.app.names, e.b(), reader{e.b().Catalog()}
	liveKey, tombKey, unknownKey, forcedKey := collNameKey(dbID, "live"), collNameKey(dbID, "tomb"), collNameKey(dbID, "unknown"), collNameKey(dbID, "coll")
	n.stage(live, nameChange{liveKey, 900001})
	n.stage(coll.Result.BroadcastId, nameChange{tombKey, 900002}) // a tombstone's
	n.stage(1<<60, nameChange{unknownKey, 900003})                // no such task
	n.term.Store(nil)                                             // as after a leader change
	if err := n.rebuild(ctx, b, r); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key    string
		id     uint64
		exists bool
	}{{liveKey, 900001, true}, {tombKey, 0, false}, {unknownKey, 0, false}, {dbNameKey("db"), dbID, true}, {forcedKey, coll.Collection.Id, true}} {
		id, ok, err := n.lookup(ctx, b, r, tc.key)
		if err != nil || ok != tc.exists || id != tc.id {
			t.Errorf("%s: %d, %t, %v; want %d, %t", tc.key, id, ok, err, tc.id, tc.exists)
		}
	}

	// A drop of coll staged by a broadcast that ended force-completed:
	// the catalog still names coll.
	n.stage(live, nameChange{forcedKey, 0})
	n.settle(live, broadcast.Outcome{Status: broadcast.ForceCompleted}, forcedKey)
	if id, ok, err := n.lookup(ctx, b, r, forcedKey); err != nil || !ok || id != coll.Collection.Id {
		t.Errorf("force-completed drop: %d, %t, %v; want %d from the catalog", id, ok, err, coll.Collection.Id)
	}

	close(release)
	if err := <-indexDone; err != nil {
		t.Fatal(err)
	}
	_, err := c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "coll"})
	wantCode(t, err, connect.CodeAlreadyExists)
}

// TestR10_2_NamesViewRefusalsAreTheCatalogs checks that the names view
// only lets requests go on: a view that wrongly says a name is taken, or a
// database is missing (as a deposed leader's could), refuses nothing the
// catalog accepts, since a refusal is read from the catalog.
func TestR10_2_NamesViewRefusalsAreTheCatalogs(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	c := e.c
	db := must[*walcastv1.CreateDatabaseResponse](t)(c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"}))
	n, by := e.app.names, db.Result.BroadcastId // a tombstone that succeeded: its changes are trusted
	n.stage(by, nameChange{collNameKey(db.Database.Id, "taken"), 900001})
	got := must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "taken"}))
	if got.Collection.Id == 900001 || got.Result.Duplicated {
		t.Fatalf("created %v", got)
	}
	_, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	// A database the view wrongly says is missing.
	n.stage(by, nameChange{dbNameKey("other"), 0})
	must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "other", Name: "c"}))
	// Real refusals stay refusals.
	_, err = c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "taken"})
	wantCode(t, err, connect.CodeAlreadyExists)
	_, err = c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "nodb", Name: "c"})
	wantCode(t, err, connect.CodeNotFound)
}
