package meta

import (
	"context"
	"testing"

	"github.com/walcast/walcast/api/walcastv1"
)

// TestR7_EveryDDLRetryIsAnsweredByItsOriginal: each DDL/DCL sent twice with
// one key is done once; the second call is answered by the original
// (duplicated, same broadcast and ids), also when the original changed the
// names the retry resolves (a dropped collection, a renamed one, a dropped
// database, a revoked grant).
func TestR7_EveryDDLRetryIsAnsweredByItsOriginal(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	c := e.c
	type outcome struct {
		res *walcastv1.DDLResult
		id  uint64
	}
	twice := func(name string, call func(context.Context) (outcome, error)) outcome {
		t.Helper()
		first, err := call(ctx)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		before := e.b().Stats().Broadcasts
		again, err := call(ctx)
		if err != nil {
			t.Fatalf("%s retry: %v", name, err)
		}
		if first.res.Duplicated || !again.res.Duplicated || again.res.BroadcastId != first.res.BroadcastId ||
			again.id != first.id || again.res.KeyFingerprint != first.res.KeyFingerprint || first.res.KeyFingerprint == "" {
			t.Fatalf("%s: first %v / %d, retry %v / %d", name, first.res, first.id, again.res, again.id)
		}
		if n := e.b().Stats().Broadcasts; n != before {
			t.Fatalf("%s: the retry broadcast", name)
		}
		return first
	}
	k := func() string { return key() }

	kdb := k()
	db := twice("CreateDatabase", func(ctx context.Context) (outcome, error) {
		r, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db", IdempotencyKey: kdb})
		return outcome{r.GetResult(), r.GetDatabase().GetId()}, err
	})
	kcoll := k()
	coll := twice("CreateCollection", func(ctx context.Context) (outcome, error) {
		r, err := c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "c", IdempotencyKey: kcoll})
		return outcome{r.GetResult(), r.GetCollection().GetId()}, err
	})
	kidx := k()
	twice("CreateIndex", func(ctx context.Context) (outcome, error) {
		r, err := c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "db", Collection: "c", Name: "i", Field: "id", IdempotencyKey: kidx})
		return outcome{r.GetResult(), r.GetIndex().GetId()}, err
	})
	kdropIdx := k()
	twice("DropIndex", func(ctx context.Context) (outcome, error) {
		r, err := c.DropIndex(ctx, &walcastv1.DropIndexRequest{Database: "db", Collection: "c", Name: "i", IdempotencyKey: kdropIdx})
		return outcome{r.GetResult(), r.GetCollectionId()}, err
	})
	kren := k()
	twice("RenameCollection", func(ctx context.Context) (outcome, error) {
		r, err := c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "db", OldName: "c", NewName: "c2", IdempotencyKey: kren})
		return outcome{r.GetResult(), r.GetCollection().GetId()}, err
	})
	// A collection reusing the old name does not capture the rename's retry.
	must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "c"}))
	again, err := c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "db", OldName: "c", NewName: "c2", IdempotencyKey: kren})
	if err != nil || !again.Result.Duplicated || again.Collection.Id != coll.id {
		t.Fatalf("rename retry after the old name was reused: %v, %v", again, err)
	}
	kdrop := k()
	dropped := twice("DropCollection", func(ctx context.Context) (outcome, error) {
		r, err := c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c2", IdempotencyKey: kdrop})
		return outcome{r.GetResult(), r.GetCollectionId()}, err
	})
	if dropped.id != coll.id {
		t.Fatalf("dropped %d, want %d", dropped.id, coll.id)
	}
	// Recreated under the dropped name, the new collection is not dropped
	// by the drop's retry, which is answered by the original.
	re := must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "c2"}))
	d2, err := c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c2", IdempotencyKey: kdrop})
	if err != nil || !d2.Result.Duplicated || d2.CollectionId != coll.id {
		t.Fatalf("drop retry after recreate: %v, %v", d2, err)
	}
	if got := must[*walcastv1.Collection](t)(c.DescribeCollection(ctx, "db", "c2")); got.Id != re.Collection.Id {
		t.Fatalf("recreated collection %v", got)
	}
	// CreateCollection is scoped to the database: the key that created c
	// still answers with c's original id.
	again2, err := c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "c", IdempotencyKey: kcoll})
	if err != nil || !again2.Result.Duplicated || again2.Collection.Id != coll.id {
		t.Fatalf("create retry: %v, %v", again2, err)
	}

	kuser := k()
	twice("CreateUser", func(ctx context.Context) (outcome, error) {
		r, err := c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: "u", IdempotencyKey: kuser})
		return outcome{r.GetResult(), 0}, err
	})
	g := &walcastv1.Grant{User: "u", Privilege: "Query", Database: "db", Collection: "*"}
	kgrant := k()
	twice("GrantPrivilege", func(ctx context.Context) (outcome, error) {
		r, err := c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: g, IdempotencyKey: kgrant})
		return outcome{r.GetResult(), 0}, err
	})
	krevoke := k()
	twice("RevokePrivilege", func(ctx context.Context) (outcome, error) {
		r, err := c.RevokePrivilege(ctx, &walcastv1.RevokePrivilegeRequest{Grant: g, IdempotencyKey: krevoke})
		return outcome{r.GetResult(), 0}, err
	})
	must[*walcastv1.DropCollectionResponse](t)(c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c"}))
	must[*walcastv1.DropCollectionResponse](t)(c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c2"}))
	kdropDB := k()
	ddb := twice("DropDatabase", func(ctx context.Context) (outcome, error) {
		r, err := c.DropDatabase(ctx, &walcastv1.DropDatabaseRequest{Name: "db", IdempotencyKey: kdropDB})
		return outcome{r.GetResult(), r.GetDatabaseId()}, err
	})
	if ddb.id != db.id {
		t.Fatalf("dropped database %d, want %d", ddb.id, db.id)
	}
	if err := e.noAnomalies(); err != nil {
		t.Fatal(err)
	}
}
