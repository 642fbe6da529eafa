package meta

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/catalog"
)

// catalogKeys returns the keys under prefix and their values.
func catalogKeys(ctx context.Context, t *testing.T, e *env, prefix string) map[string]string {
	t.Helper()
	out := map[string]string{}
	if err := e.b().Catalog().List(ctx, prefix, func(k string, v []byte) error { out[k] = string(v); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// listNames lists the collections of db by name.
func listNames(ctx context.Context, t *testing.T, e *env, db string) []string {
	t.Helper()
	res, err := e.c.ListCollections(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range res {
		names = append(names, c.GetName())
	}
	return names
}

// TestB13_OneCatalogKeyPerCollection: a collection is one key of the
// catalog, its name holding its record, through create, rename, split and
// drop (at a million collections every etcd key costs etcd's index memory,
// compaction and restart time).
func TestB13_OneCatalogKeyPerCollection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := startEnv(t)
	db := must[*walcastv1.CreateDatabaseResponse](t)(e.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"})).Database
	var ids []uint64
	for _, n := range []string{"a", "b", "c"} {
		c := must[*walcastv1.CreateCollectionResponse](t)(e.c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: n, Shards: 1})).Collection
		ids = append(ids, c.GetId())
	}
	must[*walcastv1.RenameCollectionResponse](t)(e.c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "db", OldName: "b", NewName: "b2"}))
	must[*walcastv1.DropCollectionResponse](t)(e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c"}))

	if old := catalogKeys(ctx, t, e, prefixColl); len(old) != 0 {
		t.Errorf("keys under %s: %v, want none", prefixColl, old)
	}
	names := catalogKeys(ctx, t, e, collNamesPrefix(db.GetId()))
	want := map[string]uint64{collNameKey(db.GetId(), "a"): ids[0], collNameKey(db.GetId(), "b2"): ids[1]}
	if len(names) != len(want) {
		t.Fatalf("names %v, want the keys of %v", names, want)
	}
	r := reader{e.b().Catalog()}
	for k, id := range want {
		var c collRecord
		if err := r.collValue(ctx, k, []byte(names[k]), &c); err != nil || c.ID != id || collNameKey(c.DatabaseID, c.Name) != k {
			t.Errorf("%s holds %q (%+v, %v), want the record of collection %d", k, names[k], c, err, id)
		}
	}
	if got := listNames(ctx, t, e, "db"); !slices.Equal(got, []string{"a", "b2"}) {
		t.Errorf("ListCollections %v, want [a b2]", got)
	}
	d := must[*walcastv1.Collection](t)(e.c.DescribeCollection(ctx, "db", "b2"))
	if d.GetId() != ids[1] || len(d.GetVchannels()) != 1 {
		t.Errorf("DescribeCollection b2: %v", d)
	}
}

// TestB13_CollectionsOfTheTwoKeyLayoutAreServed: a catalog written before
// one key per collection (the name holding the id, the record under
// meta/coll/<id>) is read as it is, also by a new process; a rename or a
// split moves such a collection to the one key, a drop deletes both of its
// keys, and a collection is found by id (an import job's) whatever its
// layout or name.
func TestB13_CollectionsOfTheTwoKeyLayoutAreServed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := startEnv(t)
	db := must[*walcastv1.CreateDatabaseResponse](t)(e.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"})).Database
	dbID := db.GetId()
	for _, n := range []string{"new", "old1", "old2", "old3"} {
		must[*walcastv1.CreateCollectionResponse](t)(e.c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: n, Shards: 2}))
	}
	// old1 and old2 as the layout before wrote them.
	r := reader{e.b().Catalog()}
	olds := map[string]collRecord{}
	for _, n := range []string{"old1", "old2", "old3"} {
		c, ok, err := r.collByName(ctx, dbID, n)
		if err != nil || !ok {
			t.Fatalf("%s: %v %v", n, ok, err)
		}
		olds[n] = c
		if err := e.b().Catalog().Commit(ctx, catalog.Put(collKey(c.ID), mustJSON(c)), catalog.Put(collNameKey(dbID, n), []byte(idStr(c.ID)))); err != nil {
			t.Fatal(err)
		}
	}
	e.stop()
	e.start(e.mc) // a new process reads the catalog of two layouts
	r = reader{e.b().Catalog()}

	if got := listNames(ctx, t, e, "db"); !slices.Equal(got, []string{"new", "old1", "old2", "old3"}) {
		t.Errorf("ListCollections %v, want [new old1 old2 old3]", got)
	}
	for n, c := range olds {
		d := must[*walcastv1.Collection](t)(e.c.DescribeCollection(ctx, "db", n))
		if d.GetId() != c.ID || len(d.GetVchannels()) != 2 {
			t.Errorf("DescribeCollection %s: %v, want collection %d of 2 shards", n, d, c.ID)
		}
	}
	// By id, as an import job finds its collection: old layout, then renamed.
	if c, ok, err := r.collByID(ctx, dbID, "old1", olds["old1"].ID); err != nil || !ok || c.Name != "old1" {
		t.Errorf("collByID old1 (two keys): %+v %v %v", c, ok, err)
	}
	must[*walcastv1.RenameCollectionResponse](t)(e.c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "db", OldName: "old1", NewName: "moved"}))
	if left := catalogKeys(ctx, t, e, prefixColl); len(left) != 2 {
		t.Errorf("renamed, old1 keeps its %s key, or another went: %v", prefixColl, left)
	}
	if v := catalogKeys(ctx, t, e, collNamesPrefix(dbID))[collNameKey(dbID, "moved")]; !strings.HasPrefix(v, "{") {
		t.Errorf("renamed, its name holds %q, want its record", v)
	}
	if c, ok, err := r.collByID(ctx, dbID, "old1", olds["old1"].ID); err != nil || !ok || c.Name != "moved" {
		t.Errorf("collByID of the renamed collection by its old name: %+v %v %v", c, ok, err)
	}
	// Split, it moves to the one key too, and the split answers by id.
	old3 := olds["old3"]
	split := must[*walcastv1.SplitShardResponse](t)(e.c.SplitShard(ctx, &walcastv1.SplitShardRequest{Database: "db", Collection: "old3",
		Vchannel: string(old3.VChannels[0]), Into: 2}))
	if split.GetCollection().GetId() != old3.ID || len(split.GetCollection().GetVchannels()) != 3 {
		t.Errorf("split of old3: %v, want collection %d of 3 shards", split.GetCollection(), old3.ID)
	}
	if c, ok, err := r.collByName(ctx, dbID, "old3"); err != nil || !ok || len(c.VChannels) != 3 {
		t.Errorf("old3 after its split: %+v %v %v", c, ok, err)
	}
	if left := catalogKeys(ctx, t, e, prefixColl); len(left) != 1 || left[collKey(olds["old2"].ID)] == "" {
		t.Errorf("after the split, keys under %s: %v, want old2's only", prefixColl, left)
	}
	must[*walcastv1.DropCollectionResponse](t)(e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "old3"}))
	must[*walcastv1.DropCollectionResponse](t)(e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "old2"}))
	if left := catalogKeys(ctx, t, e, prefixColl); len(left) != 0 {
		t.Errorf("after the drop, keys under %s: %v", prefixColl, left)
	}
	if _, ok, err := r.collByID(ctx, dbID, "old2", olds["old2"].ID); err != nil || ok {
		t.Errorf("collByID of a dropped collection: %v %v, want not found", ok, err)
	}
	if got := listNames(ctx, t, e, "db"); !slices.Equal(got, []string{"moved", "new"}) {
		t.Errorf("ListCollections %v, want [moved new]", got)
	}
	for _, n := range []string{"moved", "new"} {
		must[*walcastv1.DropCollectionResponse](t)(e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: n}))
	}
	must[*walcastv1.DropDatabaseResponse](t)(e.c.DropDatabase(ctx, &walcastv1.DropDatabaseRequest{Name: "db"}))
}

// TestB13_NameValuesDecodeBothLayouts: a name's value is an id in decimal
// or a record with an id; anything else is corrupt metadata, not a panic.
func TestB13_NameValuesDecodeBothLayouts(t *testing.T) {
	for raw, want := range map[string]uint64{"42": 42, `{"id":7,"name":"x"}`: 7, `{"name":"x","id":9}`: 9, `{"id":5}`: 5} {
		if id, err := nameValueID("k", []byte(raw)); err != nil || id != want {
			t.Errorf("nameValueID(%q) = %d, %v; want %d", raw, id, err, want)
		}
	}
	for _, raw := range []string{"", "0", "x", "{", `{"id":0}`, `{"id":0,"name":"x"}`, `{"id":x,"n":1}`, `{"name":"x"}`, "-1"} {
		if _, err := nameValueID("k", []byte(raw)); !errors.Is(err, ErrCorruptMetadata) {
			t.Errorf("nameValueID(%q): %v, want ErrCorruptMetadata", raw, err)
		}
	}
}

// namesLister is a catalog that counts the listings under a prefix.
type namesLister struct {
	catalog.Catalog
	prefix string
	n      int
}

func (l *namesLister) List(ctx context.Context, prefix string, fn func(string, []byte) error) error {
	if strings.HasPrefix(prefix, l.prefix) {
		l.n++
	}
	return l.Catalog.List(ctx, prefix, fn)
}

// TestB13_JobsFindTheirCollectionWithoutAScan: an import job knows its
// collection by its database, its id and the name it had. Looking it up
// reads a few keys, never the database's collections, whether the
// collection kept its name, was renamed (once or twice), was dropped
// (renamed first or not), or was dropped and its name given to another.
// Only a renamed collection without the pointer from its id (a catalog
// written before renames left one) is looked for among the collections,
// and still found.
func TestB13_JobsFindTheirCollectionWithoutAScan(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := startEnv(t)
	dbID := must[*walcastv1.CreateDatabaseResponse](t)(e.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"})).Database.GetId()
	create := func(n string) uint64 {
		return must[*walcastv1.CreateCollectionResponse](t)(e.c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: n, Shards: 1})).Collection.GetId()
	}
	rename := func(from, to string) {
		must[*walcastv1.RenameCollectionResponse](t)(e.c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "db", OldName: from, NewName: to}))
	}
	drop := func(n string) {
		must[*walcastv1.DropCollectionResponse](t)(e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: n}))
	}
	kept := create("kept")
	twice := create("a")
	rename("a", "b")
	rename("b", "c")
	renamedDropped := create("r")
	rename("r", "r2")
	drop("r2")
	dropped := create("x")
	drop("x")
	reused := create("y")
	drop("y")
	fresh := create("y")
	for i := range 20 { // collections the look-ups must not read
		create(fmt.Sprintf("other_%d", i))
	}

	l := &namesLister{Catalog: e.b().Catalog(), prefix: collNamesPrefix(dbID)}
	r := reader{l}
	for _, tc := range []struct {
		name string
		id   uint64
		want string // "": dropped
	}{
		{"kept", kept, "kept"}, {"a", twice, "c"}, {"b", twice, "c"}, {"c", twice, "c"}, {"", twice, "c"},
		{"r", renamedDropped, ""}, {"r2", renamedDropped, ""}, {"x", dropped, ""}, {"y", reused, ""}, {"y", fresh, "y"},
	} {
		c, ok, err := r.collByID(ctx, dbID, tc.name, tc.id)
		if err != nil || ok != (tc.want != "") || ok && (c.Name != tc.want || c.ID != tc.id) {
			t.Errorf("collByID(%q, %d) = %+v, %v, %v; want %q", tc.name, tc.id, c, ok, err, tc.want)
		}
	}
	if l.n != 0 {
		t.Errorf("the look-ups listed the database's collections %d times", l.n)
	}

	// A rename that left no pointer: found among the collections.
	if err := e.b().Catalog().Commit(ctx, catalog.Delete(collMovedKey(twice))); err != nil {
		t.Fatal(err)
	}
	if c, ok, err := r.collByID(ctx, dbID, "a", twice); err != nil || !ok || c.Name != "c" || l.n != 1 {
		t.Errorf("collByID of a collection renamed without a pointer: %+v, %v, %v after %d listings; want c after 1", c, ok, err, l.n)
	}
}
