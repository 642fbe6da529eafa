package meta

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/server"
)

// TestR10_1_GrantsPerObjectFitTheDropsTransaction: under any catalog
// transaction limit the drop of a collection with the most indexes and the
// most grants it may have, with the tombstone's own ops, is one
// transaction; etcd's default (128, less the fence's op) allows 45 grants,
// embedded etcd's (1024) MaxGrantsPerObject.
func TestR10_1_GrantsPerObjectFitTheDropsTransaction(t *testing.T) {
	for ops := tombstoneOps + dropCollOps + MaxIndexes; ops <= 2048; ops++ {
		g := grantsPerObject(catalog.Limits{MaxOps: ops})
		if n := tombstoneOps + dropCollOps + MaxIndexes + 2*g; n > ops || g < 0 || g > MaxGrantsPerObject {
			t.Fatalf("limit %d: %d grants per object, a drop of %d ops", ops, g, n)
		}
	}
	for ops, want := range map[int]int{127: 45, 1023: MaxGrantsPerObject, 30: 0} {
		if g := grantsPerObject(catalog.Limits{MaxOps: ops}); g != want {
			t.Errorf("limit %d: %d grants per object, want %d", ops, g, want)
		}
	}
}

// TestR10_1_DropThatCannotFitIsRefused runs a standalone whose etcd takes
// 128 ops per transaction, as a cluster's does by default. A collection
// holds at most the grants whose drop fits, and is dropped with them and
// MaxIndexes indexes (its drop used to fail its callback at every attempt).
// Under a smaller limit (64), a collection, a rename and a database whose
// grants were given under a larger one are refused with FailedPrecondition
// naming the limit, and nothing changes; with enough grants revoked the
// collection is dropped.
func TestR10_1_DropThatCannotFitIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := startEnv(t, func(c *server.Config, _ *Config) { c.Standalone.EtcdMaxTxnOps = 128 })
	restart := func(ops int) {
		e.stop()
		e.cfg.Standalone.EtcdMaxTxnOps = ops
		e.start(e.mc)
		if got := e.b().Catalog().Limits().MaxOps; got != ops-1 {
			t.Fatalf("the catalog takes %d ops, want %d (less the fence's)", got, ops-1)
		}
	}
	if got := e.b().Catalog().Limits().MaxOps; got != 127 {
		t.Fatalf("the catalog takes %d ops, want 127 (128 less the fence's)", got)
	}
	for _, db := range []string{"db", "db2"} {
		must[*walcastv1.CreateDatabaseResponse](t)(e.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: db}))
	}
	fields := []*walcastv1.Field{}
	for i := range MaxIndexes {
		fields = append(fields, &walcastv1.Field{Name: fmt.Sprintf("f%d", i), Type: "int64"})
	}
	for _, c := range []string{"c", "d", "r"} {
		must[*walcastv1.CreateCollectionResponse](t)(e.c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: c, Fields: fields}))
	}
	for i := range MaxIndexes {
		must[*walcastv1.CreateIndexResponse](t)(e.c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "db", Collection: "c",
			Name: fmt.Sprintf("i%d", i), Field: fmt.Sprintf("f%d", i)}))
	}
	// grantAll grants privileges on db.coll (coll "": on the database) to
	// users u0, u1, ... until one is refused, and returns how many were
	// given.
	grantAll := func(db, coll string) (n int) {
		for u := 0; ; u++ {
			user := fmt.Sprintf("u%d", u)
			if _, err := e.c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: user}); err != nil && connect.CodeOf(err) != connect.CodeAlreadyExists {
				t.Fatal(err)
			}
			for _, p := range privileges {
				_, err := e.c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: &walcastv1.Grant{User: user, Privilege: p, Database: db, Collection: coll}})
				if err != nil {
					wantCode(t, err, connect.CodeFailedPrecondition)
					return n
				}
				n++
			}
		}
	}
	if n := grantAll("db", "c"); n != 45 {
		t.Fatalf("%d grants on db.c, want 45", n)
	}
	must[*walcastv1.DropCollectionResponse](t)(e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c"}))
	if n := grantAll("db", "d"); n != 45 {
		t.Fatalf("%d grants on db.d, want 45", n)
	}
	// Under embedded etcd's limit, as many as MaxGrantsPerObject.
	restart(1024)
	for _, obj := range [][2]string{{"db", "r"}, {"db2", ""}} {
		if n := grantAll(obj[0], obj[1]); n != MaxGrantsPerObject {
			t.Fatalf("%d grants on %v, want %d", n, obj, MaxGrantsPerObject)
		}
	}

	// Under 64 ops (63 with the fence): d's drop would write 2+3+90, r's
	// rename 2+4+64, db2's drop 2+2+128.
	restart(64)
	before := catalogKeys(ctx, t, e, "meta/")
	refused := func(what string, err error, grants int) {
		t.Helper()
		wantCode(t, err, connect.CodeFailedPrecondition)
		if !strings.Contains(err.Error(), "catalog.max_txn_ops") || !strings.Contains(err.Error(), fmt.Sprintf("%d grants", grants)) {
			t.Errorf("%s refused with %q: want it to name its grants and the limit", what, err)
		}
	}
	_, err := e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "d"})
	refused("the drop of db.d", err, 45)
	_, err = e.c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "db", OldName: "r", NewName: "r2"})
	refused("the rename of db.r", err, MaxGrantsPerObject)
	_, err = e.c.DropDatabase(ctx, &walcastv1.DropDatabaseRequest{Name: "db2"})
	refused("the drop of db2", err, MaxGrantsPerObject)
	if after := catalogKeys(ctx, t, e, "meta/"); !maps.Equal(after, before) {
		t.Errorf("the refused changes changed the catalog: %d keys, were %d", len(after), len(before))
	}
	d := must[*walcastv1.Collection](t)(e.c.DescribeCollection(ctx, "db", "d"))
	// 29 grants fit: revoke 16 (those of the last users given).
	revoked := 0
	for u := 10; revoked < 16; u-- {
		for i := len(privileges) - 1; i >= 0 && revoked < 16; i-- {
			_, err := e.c.RevokePrivilege(ctx, &walcastv1.RevokePrivilegeRequest{Grant: &walcastv1.Grant{User: fmt.Sprintf("u%d", u), Privilege: privileges[i], Database: "db", Collection: "d"}})
			if err == nil {
				revoked++
			} else if connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatal(err)
			}
		}
	}
	res := must[*walcastv1.DropCollectionResponse](t)(e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "d"}))
	if res.GetCollectionId() != d.GetId() {
		t.Errorf("dropped collection %d, want %d", res.GetCollectionId(), d.GetId())
	}
}
