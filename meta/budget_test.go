package meta

import (
	"context"
	"fmt"
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
// Started again under a smaller limit, a collection holding more grants
// than its drop can carry is not dropped, with FailedPrecondition naming
// the limit, and nothing changes; with enough grants revoked it is.
func TestR10_1_DropThatCannotFitIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := startEnv(t, func(c *server.Config, _ *Config) { c.Standalone.EtcdMaxTxnOps = 128 })
	if got := e.b().Catalog().Limits().MaxOps; got != 127 {
		t.Fatalf("the catalog takes %d ops, want 127 (128 less the fence's)", got)
	}
	must[*walcastv1.CreateDatabaseResponse](t)(e.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"}))
	fields := []*walcastv1.Field{}
	for i := range MaxIndexes {
		fields = append(fields, &walcastv1.Field{Name: fmt.Sprintf("f%d", i), Type: "int64"})
	}
	for _, c := range []string{"c", "d"} {
		must[*walcastv1.CreateCollectionResponse](t)(e.c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: c, Fields: fields}))
	}
	for i := range MaxIndexes {
		must[*walcastv1.CreateIndexResponse](t)(e.c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "db", Collection: "c",
			Name: fmt.Sprintf("i%d", i), Field: fmt.Sprintf("f%d", i)}))
	}
	// grantAll grants privileges on coll to users u0, u1, ... until one
	// is refused, and returns how many were given.
	grantAll := func(coll string) (n int) {
		for u := 0; ; u++ {
			user := fmt.Sprintf("u%d", u)
			if _, err := e.c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: user}); err != nil && connect.CodeOf(err) != connect.CodeAlreadyExists {
				t.Fatal(err)
			}
			for _, p := range privileges {
				_, err := e.c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: &walcastv1.Grant{User: user, Privilege: p, Database: "db", Collection: coll}})
				if err != nil {
					wantCode(t, err, connect.CodeFailedPrecondition)
					return n
				}
				n++
			}
		}
	}
	if n := grantAll("c"); n != 45 {
		t.Fatalf("%d grants on db.c, want 45", n)
	}
	must[*walcastv1.DropCollectionResponse](t)(e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c"}))
	if n := grantAll("d"); n != 45 {
		t.Fatalf("%d grants on db.d, want 45", n)
	}

	// Under 64 ops (63 with the fence), d's drop would write 2+3+90.
	e.stop()
	e.cfg.Standalone.EtcdMaxTxnOps = 64
	e.start(e.mc)
	before := catalogKeys(ctx, t, e, "meta/")
	_, err := e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "d"})
	wantCode(t, err, connect.CodeFailedPrecondition)
	if !strings.Contains(err.Error(), "catalog.max_txn_ops") || !strings.Contains(err.Error(), "45 grants") {
		t.Errorf("refusal %q: want it to name the grants and the limit", err)
	}
	if after := catalogKeys(ctx, t, e, "meta/"); len(after) != len(before) {
		t.Errorf("the refused drop changed the catalog: %d keys, were %d", len(after), len(before))
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
