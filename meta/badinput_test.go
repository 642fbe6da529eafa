package meta

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/client"
)

// TestBadInputIsTypedAndChangesNothing: malformed requests, unknown names,
// taken names and impossible changes get InvalidArgument, NotFound,
// AlreadyExists or FailedPrecondition — never a panic — and change no
// metadata and broadcast nothing.
func TestBadInputIsTypedAndChangesNothing(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	c := e.c
	must[*walcastv1.CreateDatabaseResponse](t)(c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"}))
	must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "c"}))
	must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "d"}))
	must[*walcastv1.CreateIndexResponse](t)(c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "db", Collection: "c", Name: "i", Field: "vector"}))
	must[*walcastv1.CreateUserResponse](t)(c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: "u"}))

	long := strings.Repeat("n", MaxNameLength+1)
	manyFiles := make([]string, MaxImportFiles+1)
	for i := range manyFiles {
		manyFiles[i] = fmt.Sprintf("f%d.csv", i)
	}
	const (
		invalid  = connect.CodeInvalidArgument
		notFound = connect.CodeNotFound
		exists   = connect.CodeAlreadyExists
		precond  = connect.CodeFailedPrecondition
	)
	grant := func(user, priv, db, coll string) *walcastv1.Grant {
		return &walcastv1.Grant{User: user, Privilege: priv, Database: db, Collection: coll}
	}
	cases := []struct {
		name string
		code connect.Code
		call func(context.Context) error
	}{
		{"database empty name", invalid, func(ctx context.Context) error {
			_, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{})
			return err
		}},
		{"database oversized name", invalid, func(ctx context.Context) error {
			_, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: long})
			return err
		}},
		{"database name with a colon", invalid, func(ctx context.Context) error {
			_, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "a:b"})
			return err
		}},
		{"database exists", exists, func(ctx context.Context) error {
			_, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"})
			return err
		}},
		{"drop unknown database", notFound, func(ctx context.Context) error {
			_, err := c.DropDatabase(ctx, &walcastv1.DropDatabaseRequest{Name: "nope"})
			return err
		}},
		{"drop database not empty", precond, func(ctx context.Context) error {
			_, err := c.DropDatabase(ctx, &walcastv1.DropDatabaseRequest{Name: "db"})
			return err
		}},
		{"collection in unknown database", notFound, func(ctx context.Context) error {
			_, err := c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "nope", Name: "x"})
			return err
		}},
		{"collection exists", exists, func(ctx context.Context) error {
			_, err := c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "c"})
			return err
		}},
		{"collection empty name", invalid, func(ctx context.Context) error {
			_, err := c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db"})
			return err
		}},
		{"collection oversized name", invalid, func(ctx context.Context) error {
			_, err := c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: long})
			return err
		}},
		{"negative shards", invalid, func(ctx context.Context) error {
			_, err := c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "x", Shards: -1})
			return err
		}},
		{"too many shards", invalid, func(ctx context.Context) error {
			_, err := c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "x", Shards: MaxShards + 1})
			return err
		}},
		{"unknown field type", invalid, func(ctx context.Context) error {
			_, err := c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "x",
				Fields: []*walcastv1.Field{{Name: "f", Type: "blob"}}})
			return err
		}},
		{"field named twice", invalid, func(ctx context.Context) error {
			_, err := c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "x",
				Fields: []*walcastv1.Field{{Name: "f", Type: "int64"}, {Name: "f", Type: "bool"}}})
			return err
		}},
		{"drop unknown collection", notFound, func(ctx context.Context) error {
			_, err := c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "nope"})
			return err
		}},
		{"rename unknown collection", notFound, func(ctx context.Context) error {
			_, err := c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "db", OldName: "nope", NewName: "x"})
			return err
		}},
		{"rename to the same name", invalid, func(ctx context.Context) error {
			_, err := c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "db", OldName: "c", NewName: "c"})
			return err
		}},
		{"rename onto a taken name", exists, func(ctx context.Context) error {
			_, err := c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "db", OldName: "c", NewName: "d"})
			return err
		}},
		{"index on unknown collection", notFound, func(ctx context.Context) error {
			_, err := c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "db", Collection: "nope", Name: "j", Field: "id"})
			return err
		}},
		{"index on unknown field", invalid, func(ctx context.Context) error {
			_, err := c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "db", Collection: "c", Name: "j", Field: "nope"})
			return err
		}},
		{"index exists", exists, func(ctx context.Context) error {
			_, err := c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "db", Collection: "c", Name: "i", Field: "id"})
			return err
		}},
		{"unknown index type", invalid, func(ctx context.Context) error {
			_, err := c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "db", Collection: "c", Name: "j", Field: "id", IndexType: "MAGIC"})
			return err
		}},
		{"drop unknown index", notFound, func(ctx context.Context) error {
			_, err := c.DropIndex(ctx, &walcastv1.DropIndexRequest{Database: "db", Collection: "c", Name: "nope"})
			return err
		}},
		{"user empty name", invalid, func(ctx context.Context) error {
			_, err := c.CreateUser(ctx, &walcastv1.CreateUserRequest{})
			return err
		}},
		{"user exists", exists, func(ctx context.Context) error {
			_, err := c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: "u"})
			return err
		}},
		{"grant to unknown user", notFound, func(ctx context.Context) error {
			_, err := c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: grant("nope", "Search", "db", "c")})
			return err
		}},
		{"grant unknown privilege", invalid, func(ctx context.Context) error {
			_, err := c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: grant("u", "Fly", "db", "c")})
			return err
		}},
		{"grant without database", invalid, func(ctx context.Context) error {
			_, err := c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: grant("u", "Search", "", "c")})
			return err
		}},
		{"revoke what was not granted", notFound, func(ctx context.Context) error {
			_, err := c.RevokePrivilege(ctx, &walcastv1.RevokePrivilegeRequest{Grant: grant("u", "Search", "db", "c")})
			return err
		}},
		{"import into unknown collection", notFound, func(ctx context.Context) error {
			_, err := c.Import(ctx, &walcastv1.ImportRequest{Database: "db", Collection: "nope", Files: []string{"f.csv"}})
			return err
		}},
		{"import without files", invalid, func(ctx context.Context) error {
			_, err := c.Import(ctx, &walcastv1.ImportRequest{Database: "db", Collection: "c"})
			return err
		}},
		{"import an empty file name", invalid, func(ctx context.Context) error {
			_, err := c.Import(ctx, &walcastv1.ImportRequest{Database: "db", Collection: "c", Files: []string{""}})
			return err
		}},
		{"import too many files", invalid, func(ctx context.Context) error {
			_, err := c.Import(ctx, &walcastv1.ImportRequest{Database: "db", Collection: "c", Files: manyFiles})
			return err
		}},
		{"oversized idempotency key", invalid, func(ctx context.Context) error {
			_, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "x", IdempotencyKey: strings.Repeat("k", 300)})
			return err
		}},
		{"import job id 0", invalid, func(ctx context.Context) error {
			_, err := c.GetImportJob(ctx, 0)
			return err
		}},
		{"unknown import job", notFound, func(ctx context.Context) error {
			_, err := c.GetImportJob(ctx, 1<<40)
			return err
		}},
		{"list collections of unknown database", notFound, func(ctx context.Context) error {
			_, err := c.ListCollections(ctx, "nope")
			return err
		}},
		{"describe unknown collection", notFound, func(ctx context.Context) error {
			_, err := c.DescribeCollection(ctx, "db", "nope")
			return err
		}},
		{"jobs of a collection without database", invalid, func(ctx context.Context) error {
			_, err := c.ListImportJobs(ctx, "", "c")
			return err
		}},
		{"malformed vchannel", invalid, func(ctx context.Context) error {
			_, err := c.GetVChannelView(ctx, "no-slash")
			return err
		}},
	}
	before := e.snapshot(ctx)
	broadcasts := e.b().Stats().Broadcasts
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(ctx)
			wantCode(t, err, tc.code)
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Attempts != 1 {
				t.Fatalf("retried a refused request: %#v", err)
			}
			if tc.code == exists && (!errors.Is(err, client.ErrAlreadyExists) || errors.Is(err, client.ErrKeyReused)) {
				t.Fatalf("AlreadyExists error %v does not say the name is taken", err)
			}
		})
	}
	if !before.equal(e.snapshot(ctx)) {
		t.Fatalf("bad input changed the metadata")
	}
	if n := e.b().Stats().Broadcasts; n != broadcasts {
		t.Fatalf("bad input broadcast %d times", n-broadcasts)
	}
}

// TestOverlongKeyConsumesNothing: a new request whose idempotency key is
// longer than the broadcaster's limit is refused with InvalidArgument
// before anything is done under its keys: no id is allocated (the next
// create gets the next id), no metadata is written and nothing is
// broadcast.
func TestOverlongKeyConsumesNothing(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	long := strings.Repeat("k", e.cfg.Broadcast.MaxKeyLength+1)
	metadata := func() map[string]string {
		t.Helper()
		out := map[string]string{}
		err := e.b().Catalog().List(ctx, "meta/", func(k string, v []byte) error {
			out[k] = string(v)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	refused := func(what string, call func() error) {
		t.Helper()
		before, broadcasts := metadata(), e.b().Stats().Broadcasts
		wantCode(t, call(), connect.CodeInvalidArgument)
		if after := metadata(); !maps.Equal(before, after) {
			t.Fatalf("%s with an over-long key changed the metadata:\n%v\n%v", what, before, after)
		}
		if n := e.b().Stats().Broadcasts; n != broadcasts {
			t.Fatalf("%s with an over-long key broadcast", what)
		}
	}

	db := must[*walcastv1.CreateDatabaseResponse](t)(e.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"})).Database
	refused("CreateDatabase", func() error {
		_, err := e.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "x", IdempotencyKey: long})
		return err
	})
	coll := e.createColl(ctx, "c")
	if coll.Id != db.Id+1 {
		t.Fatalf("collection id %d after database id %d: the refused request took an id", coll.Id, db.Id)
	}
	refused("Import", func() error {
		_, err := e.importInto(ctx, "c", long)
		return err
	})
	db2 := must[*walcastv1.CreateDatabaseResponse](t)(e.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db2"})).Database
	if db2.Id != coll.Id+1 {
		t.Fatalf("database id %d after collection id %d: the refused import took an id", db2.Id, coll.Id)
	}
}
