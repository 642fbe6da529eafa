package meta

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/resource"
)

// TestR10_2_PrivilegeChangesOnDifferentUsersInParallel: user and grant
// changes hold the privilege gate shared and their user's and object's
// keys exclusively, not one exclusive Privilege key: while a grant to alice
// on db.c is held in its callback, a grant to bob on another object, and
// the creation of another user, go through; a second grant to alice (on db)
// and a grant to bob on db.c (the same object) wait for it; and once it ends,
// they complete. With SerialPrivileges (the reference system's one key) the
// grant to bob on the other object waits too.
func TestR10_2_PrivilegeChangesOnDifferentUsersInParallel(t *testing.T) {
	for _, serial := range []bool{false, true} {
		t.Run(map[bool]string{false: "fine keys", true: "one key"}[serial], func(t *testing.T) {
			e, ctx := importEnv(t, func(c *Config) { c.SerialPrivileges = serial }) // database db, collection db.c
			c := e.c
			e.createColl(ctx, "d")
			for _, u := range []string{"alice", "bob"} {
				must[*walcastv1.CreateUserResponse](t)(c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: u}))
			}
			// coll "*": a grant on the database.
			grant := func(user, priv, coll string) error {
				_, err := c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: &walcastv1.Grant{User: user, Privilege: priv, Database: "db", Collection: coll}})
				return err
			}
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			hook := func(ctx context.Context, ev *broadcast.Event) error {
				if ev.Message.Type != TypeGrantPrivilege {
					return nil
				}
				first := false
				once.Do(func() { first = true; close(entered) })
				if !first {
					return nil
				}
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			e.app.hook.Store(&hook)
			defer e.app.hook.Store(nil)
			held := make(chan error, 1)
			go func() { held <- grant("alice", "Search", "c") }()
			<-entered

			waiting := make(map[string]chan error)
			wait := func(name string, call func() error) {
				ch := make(chan error, 1)
				waiting[name] = ch
				go func() { ch <- call() }()
			}
			// (A waiter holds the keys it got before the one it waits for,
			// as every request does: alice's second grant is on the
			// database, whose object key no other request here takes.)
			wait("alice again", func() error { return grant("alice", "Query", "*") })
			wait("bob on db.c", func() error { return grant("bob", "Query", "c") })
			if serial {
				wait("bob on db.d", func() error { return grant("bob", "Search", "d") })
			} else {
				// Other users and objects go through meanwhile.
				if err := grant("bob", "Search", "d"); err != nil {
					t.Fatal(err)
				}
				must[*walcastv1.CreateUserResponse](t)(c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: "carol"}))
			}
			eventually(t, "the waiting changes to queue for the held keys", func() error {
				n := 0
				for _, ks := range e.b().Locks() {
					if ks.Domain == resource.Privilege {
						n += len(ks.Waiters)
					}
				}
				if n < len(waiting) {
					return fmt.Errorf("%d waiters on privilege keys, want %d: %v", n, len(waiting), e.b().Locks())
				}
				return nil
			})
			for name, ch := range waiting {
				select {
				case err := <-ch:
					t.Fatalf("%s returned while the grant to alice on db.c is held: %v", name, err)
				default:
				}
			}
			close(release)
			if err := <-held; err != nil {
				t.Fatal(err)
			}
			for name, ch := range waiting {
				if err := <-ch; err != nil {
					t.Fatalf("%s: %v", name, err)
				}
			}
			var got []string
			for _, g := range must[*walcastv1.ListUsersResponse](t)(c.ListUsers(ctx)).Grants {
				got = append(got, g.User+":"+g.Privilege+"@"+g.Collection)
			}
			slices.Sort(got)
			if want := []string{"alice:Query@*", "alice:Search@c", "bob:Query@c", "bob:Search@d"}; !slices.Equal(got, want) {
				t.Fatalf("grants %v, want %v", got, want)
			}
		})
	}
}

// TestR10_1_GrantIndexBuiltForAnOlderCatalog: a catalog whose grants have
// no index by object (written by a walcast before it) is indexed by its
// leader in the background; meanwhile and after,
// a drop removes its object's grants and a grant counts the grants on its
// object, as with the index from the start.
func TestR10_1_GrantIndexBuiltForAnOlderCatalog(t *testing.T) {
	e, ctx := importEnv(t)
	c := e.c
	e.createColl(ctx, "d")
	must[*walcastv1.CreateUserResponse](t)(c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: "alice"}))
	for _, p := range []string{"Search", "Query"} {
		for _, coll := range []string{"c", "d"} {
			must[*walcastv1.GrantPrivilegeResponse](t)(c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{
				Grant: &walcastv1.Grant{User: "alice", Privilege: p, Database: "db", Collection: coll}}))
		}
	}
	// As an older walcast left it: no index entries, no mark.
	cat := e.b().Catalog()
	var ops []catalog.Op
	err := cat.List(ctx, prefixGrantObj, func(k string, _ []byte) error { ops = append(ops, catalog.Delete(k)); return nil })
	if err != nil || len(ops) != 4 {
		t.Fatalf("%d index entries, %v; want 4", len(ops), err)
	}
	ops = append(ops, catalog.Delete(keyGrantIndex))
	if err := cat.Commit(ctx, ops...); err != nil {
		t.Fatal(err)
	}
	e.stop()
	e.start(e.mc) // a new leader of the older catalog
	c = e.c
	cat = e.b().Catalog()

	// The drop finds c's grants (the index may still be under way).
	must[*walcastv1.DropCollectionResponse](t)(c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c"}))
	eventually(t, "the index to be built", func() error {
		if _, err := cat.Get(ctx, keyGrantIndex); err != nil {
			return err
		}
		return nil
	})
	var entries []string
	if err := cat.List(ctx, prefixGrantObj, func(k string, _ []byte) error { entries = append(entries, k); return nil }); err != nil {
		t.Fatal(err)
	}
	d := must[*walcastv1.Collection](t)(c.DescribeCollection(ctx, "db", "d"))
	for _, k := range entries {
		if want := grantObjPrefix(d.DatabaseId, d.Id); len(k) < len(want) || k[:len(want)] != want {
			t.Errorf("index entry %s is not of db.d's grants (a grant of the dropped db.c left one?)", k)
		}
	}
	if len(entries) != 2 {
		t.Errorf("index entries %v, want db.d's two grants", entries)
	}
	for _, g := range must[*walcastv1.ListUsersResponse](t)(c.ListUsers(ctx)).Grants {
		if g.Collection != "d" {
			t.Errorf("grant %v outlived its collection's drop", g)
		}
	}
	// The index counts: a second grant of Search on db.d is refused as
	// existing, and a drop of d removes both grants and entries.
	_, err = c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: &walcastv1.Grant{User: "alice", Privilege: "Search", Database: "db", Collection: "d"}})
	wantCode(t, err, connect.CodeAlreadyExists)
	must[*walcastv1.DropCollectionResponse](t)(c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "d"}))
	entries = nil
	if err := cat.List(ctx, prefixGrantObj, func(k string, _ []byte) error { entries = append(entries, k); return nil }); err != nil || len(entries) != 0 {
		t.Fatalf("index entries after the drops: %v, %v", entries, err)
	}
}
