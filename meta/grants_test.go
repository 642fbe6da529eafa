package meta

import (
	"fmt"
	"slices"
	"testing"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
)

// TestR10_1_GrantsLifecycle: grants belong to the objects they name. A grant
// on a database or collection that does not exist is refused; a renamed
// collection keeps its grants, under its new name; dropping a collection or
// database removes its grants; and a recreated object of the same name
// starts with none. Granted, the check privilege enforcement builds on,
// agrees at every step, and the control channel's view keeps the same
// grants as the metadata.
func TestR10_1_GrantsLifecycle(t *testing.T) {
	e, ctx := importEnv(t) // database db, collection db.c
	c := e.c
	for _, u := range []string{"alice", "bob"} {
		must[*walcastv1.CreateUserResponse](t)(c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: u}))
	}
	grant := func(user, priv, db, coll string) error {
		_, err := c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: &walcastv1.Grant{User: user, Privilege: priv, Database: db, Collection: coll}})
		return err
	}
	granted := func(user, priv, db, coll string) bool {
		t.Helper()
		ok, err := e.svc().Granted(ctx, user, priv, db, coll)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	grantsOf := func() []string {
		t.Helper()
		var out []string
		for _, g := range must[*walcastv1.ListUsersResponse](t)(c.ListUsers(ctx)).Grants {
			out = append(out, fmt.Sprintf("%s:%s@%s.%s(%d.%d)", g.User, g.Privilege, g.Database, g.Collection, g.DatabaseId, g.CollectionId))
		}
		return out
	}
	views := func() {
		t.Helper()
		eventually(t, "the control channel's grants", func() error { return e.viewsMatch(ctx, nil) })
	}

	// Objects that do not exist cannot be granted on.
	wantCode(t, grant("alice", "Search", "nope", ""), connect.CodeNotFound)
	wantCode(t, grant("alice", "Search", "db", "nope"), connect.CodeNotFound)
	wantCode(t, grant("alice", "Search", "*", "c"), connect.CodeInvalidArgument)
	if g := grantsOf(); len(g) != 0 {
		t.Fatalf("refused grants persisted: %v", g)
	}

	coll := must[*walcastv1.Collection](t)(c.DescribeCollection(ctx, "db", "c"))
	must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "other"}))
	for _, g := range [][4]string{{"alice", "Search", "db", "c"}, {"alice", "Import", "db", "*"}, {"bob", "All", "*", "*"}, {"bob", "Query", "db", "other"}} {
		if err := grant(g[0], g[1], g[2], g[3]); err != nil {
			t.Fatalf("grant %v: %v", g, err)
		}
	}
	want := fmt.Sprintf("alice:Search@db.c(%d.%d)", coll.DatabaseId, coll.Id)
	if g := grantsOf(); len(g) != 4 || !slices.Contains(g, want) {
		t.Fatalf("grants %v, want 4 with %s", g, want)
	}
	switch {
	case !granted("alice", "Search", "db", "c"), granted("alice", "Search", "db", "other"), granted("alice", "Query", "db", "c"):
		t.Fatal("alice's collection grant")
	case !granted("alice", "Import", "db", "other"), !granted("alice", "Import", "db", ""), granted("alice", "Import", "nope", ""):
		t.Fatal("alice's database grant")
	case !granted("bob", "DropIndex", "db", "c"), granted("carol", "Search", "db", "c"):
		t.Fatal("bob's global grant, or a user without grants")
	}
	views()

	// A rename keeps the collection's grants, under its new name.
	must[*walcastv1.RenameCollectionResponse](t)(c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "db", OldName: "c", NewName: "c2"}))
	if want := fmt.Sprintf("alice:Search@db.c2(%d.%d)", coll.DatabaseId, coll.Id); !slices.Contains(grantsOf(), want) {
		t.Fatalf("grants after the rename %v, want %s", grantsOf(), want)
	}
	if !granted("alice", "Search", "db", "c2") || granted("alice", "Search", "db", "c") {
		t.Fatal("Granted after the rename")
	}
	views()
	// A new collection under the old name does not inherit them.
	must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "c"}))
	if granted("alice", "Search", "db", "c") {
		t.Fatal("a new collection under a renamed one's old name inherited its grant")
	}

	// Dropping the collection removes its grants; recreated, it has none.
	must[*walcastv1.DropCollectionResponse](t)(c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c2"}))
	for _, g := range grantsOf() {
		if g == fmt.Sprintf("alice:Search@db.c2(%d.%d)", coll.DatabaseId, coll.Id) {
			t.Fatalf("the dropped collection's grant survived: %v", grantsOf())
		}
	}
	wantCode(t, func() error {
		_, err := c.RevokePrivilege(ctx, &walcastv1.RevokePrivilegeRequest{Grant: &walcastv1.Grant{User: "alice", Privilege: "Search", Database: "db", Collection: "c2"}})
		return err
	}(), connect.CodeNotFound)
	must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "c2"}))
	if granted("alice", "Search", "db", "c2") {
		t.Fatal("a recreated collection inherited the dropped one's grant")
	}
	views()

	// Dropping the database (emptied first) removes its grants; recreated,
	// it has none. Global grants stay.
	for _, n := range []string{"c", "c2", "other"} {
		must[*walcastv1.DropCollectionResponse](t)(c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: n}))
	}
	must[*walcastv1.DropDatabaseResponse](t)(c.DropDatabase(ctx, &walcastv1.DropDatabaseRequest{Name: "db"}))
	if g := grantsOf(); len(g) != 1 || g[0] != "bob:All@*.*(0.0)" {
		t.Fatalf("grants after dropping the database %v, want bob's global one only", g)
	}
	must[*walcastv1.CreateDatabaseResponse](t)(c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"}))
	if granted("alice", "Import", "db", "") || !granted("bob", "Import", "db", "") {
		t.Fatal("Granted on the recreated database")
	}
	views()
	if err := e.noAnomalies(); err != nil {
		t.Fatal(err)
	}
}

// TestR10_1_GrantsPerObjectBounded: at most MaxGrantsPerObject grants name
// one collection, so that its drop removes them all in one transaction; the
// grant beyond is refused with FailedPrecondition, and the drop removes the
// ones given.
func TestR10_1_GrantsPerObjectBounded(t *testing.T) {
	e, ctx := importEnv(t)
	must[*walcastv1.CreateUserResponse](t)(e.c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: "u"}))
	n := 0
	for i := 0; n < MaxGrantsPerObject; i++ {
		user := fmt.Sprintf("u%d", i)
		must[*walcastv1.CreateUserResponse](t)(e.c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: user}))
		for _, p := range privileges[:min(len(privileges), MaxGrantsPerObject-n)] {
			must[*walcastv1.GrantPrivilegeResponse](t)(e.c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{
				Grant: &walcastv1.Grant{User: user, Privilege: p, Database: "db", Collection: "c"}}))
			n++
		}
	}
	_, err := e.c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: &walcastv1.Grant{User: "u", Privilege: "Search", Database: "db", Collection: "c"}})
	wantCode(t, err, connect.CodeFailedPrecondition)
	// The database itself is another object, with room of its own.
	must[*walcastv1.GrantPrivilegeResponse](t)(e.c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{
		Grant: &walcastv1.Grant{User: "u", Privilege: "Search", Database: "db"}}))
	must[*walcastv1.DropCollectionResponse](t)(e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c"}))
	if g := must[*walcastv1.ListUsersResponse](t)(e.c.ListUsers(ctx)).Grants; len(g) != 1 || g[0].Collection != wildcard {
		t.Fatalf("grants after the drop: %d, want the database's one", len(g))
	}
}
