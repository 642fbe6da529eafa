package meta

import (
	"bytes"
	"context"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
)

// catalogDump is every key and value of the process's catalog.
func (e *env) catalogDump(ctx context.Context) map[string]string {
	e.t.Helper()
	out := map[string]string{}
	err := e.b().Catalog().List(ctx, "", func(k string, v []byte) error {
		out[k] = string(v)
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// TestR10_1_NamesAndPathsValidatedThroughTheAPI: database, collection,
// field, index and user names follow the one naming rule (1 to 128 bytes
// of ASCII letters, digits and '_', not starting with a digit: no control
// characters, spaces, '.', ':', '/', '@', non-ASCII), import paths are
// local to the import root, free of control characters and of a supported
// format, and grants name objects that exist. Each violation is refused
// with InvalidArgument (or NotFound for a missing object), and the catalog
// is exactly as it was: nothing persisted, no id taken, nothing broadcast.
func TestR10_1_NamesAndPathsValidatedThroughTheAPI(t *testing.T) {
	e, ctx := importEnv(t)
	must[*walcastv1.CreateUserResponse](t)(e.c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: "u"}))
	e.writeImport("ok.csv", csvRows(1))
	e.pauseImporter() // the importer writes nothing meanwhile
	const invalid, notFound = connect.CodeInvalidArgument, connect.CodeNotFound
	type call func(ctx context.Context) error
	createDB := func(name string) call {
		return func(ctx context.Context) error {
			_, err := e.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: name})
			return err
		}
	}
	createColl := func(name string, fields ...*walcastv1.Field) call {
		return func(ctx context.Context) error {
			_, err := e.c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: name, Fields: fields})
			return err
		}
	}
	imp := func(files ...string) call {
		return func(ctx context.Context) error {
			_, err := e.c.Import(ctx, &walcastv1.ImportRequest{Database: "db", Collection: "c", Files: files})
			return err
		}
	}
	grant := func(g *walcastv1.Grant) call {
		return func(ctx context.Context) error {
			_, err := e.c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: g})
			return err
		}
	}
	cases := []struct {
		name string
		code connect.Code
		call call
	}{
		{"database name with a NUL", invalid, createDB("a\x00b")},
		{"database name with a newline", invalid, createDB("a\nb")},
		{"database name with DEL", invalid, createDB("a\x7f")},
		{"database name with a C1 control", invalid, createDB("a\u0085")},
		{"database name with a space", invalid, createDB("a b")},
		{"database name with a dot", invalid, createDB("a.b")},
		{"database name with a slash", invalid, createDB("a/b")},
		{"database name with an at sign", invalid, createDB("a@R")},
		{"database name not ASCII", invalid, createDB("données")},
		{"database name starting with a digit", invalid, createDB("1db")},
		{"database name of 129 bytes", invalid, createDB(strings.Repeat("d", MaxNameLength+1))},
		{"collection name with a tab", invalid, createColl("c\t1")},
		{"collection name with a colon", invalid, createColl("db:c")},
		{"field name with a control character", invalid, createColl("x", &walcastv1.Field{Name: "f\x1b", Type: "int64"})},
		{"index name with a control character", invalid, func(ctx context.Context) error {
			_, err := e.c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "db", Collection: "c", Name: "i\r", Field: "id"})
			return err
		}},
		{"user name with a control character", invalid, func(ctx context.Context) error {
			_, err := e.c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: "bob\x00"})
			return err
		}},
		{"import path with a NUL", invalid, imp("a\x00.csv")},
		{"import path with a newline", invalid, imp("a\n.csv")},
		{"import path with an escape", invalid, imp("\x1b[2Ja.csv")},
		{"import path above the root", invalid, imp("../x.csv")},
		{"import path climbing out", invalid, imp("sub/../../x.csv")},
		{"absolute import path", invalid, imp("/etc/passwd.csv")},
		{"import of an unsupported format", invalid, imp("data.parquet")},
		{"import of a file twice", invalid, imp("ok.csv", "./ok.csv")},
		{"grant on a missing database", notFound, grant(&walcastv1.Grant{User: "u", Privilege: "Search", Database: "nope"})},
		{"grant on a missing collection", notFound, grant(&walcastv1.Grant{User: "u", Privilege: "Search", Database: "db", Collection: "nope"})},
		{"grant on a collection of every database", invalid, grant(&walcastv1.Grant{User: "u", Privilege: "Search", Database: "*", Collection: "c"})},
		{"grant with a control character", invalid, grant(&walcastv1.Grant{User: "u", Privilege: "Search", Database: "db\x00"})},
		{"revoke on a missing collection", notFound, func(ctx context.Context) error {
			_, err := e.c.RevokePrivilege(ctx, &walcastv1.RevokePrivilegeRequest{Grant: &walcastv1.Grant{User: "u", Privilege: "Search", Database: "db", Collection: "nope"}})
			return err
		}},
	}
	before := e.catalogDump(ctx)
	broadcasts := e.b().Stats().Broadcasts
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantCode(t, tc.call(ctx), tc.code)
		})
	}
	if after := e.catalogDump(ctx); !maps.Equal(before, after) {
		t.Fatalf("refused requests changed the catalog:\nbefore %v\nafter  %v", before, after)
	}
	if n := e.b().Stats().Broadcasts; n != broadcasts {
		t.Fatalf("refused requests broadcast %d times", n-broadcasts)
	}
}

// TestR9_4_MetaUnknownJSONFieldRefused: a MetaService JSON request with a
// field its message does not have — a misspelt idempotency_key — is
// refused with InvalidArgument (HTTP 400), and nothing is persisted; the
// same request spelt right is idempotent.
func TestR9_4_MetaUnknownJSONFieldRefused(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	post := func(body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost,
			"http://"+e.p.APIAddr()+"/walcast.api.v1.MetaService/CreateDatabase", bytes.NewReader([]byte(body)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	before := e.catalogDump(ctx)
	for _, body := range []string{
		`{"name": "shop", "idempotency_kye": "k1"}`,
		`{"name": "shop", "idempotencyKye": "k1"}`,
		`{"name": "shop", "shards": 2}`,
	} {
		status, out := post(body)
		if status != http.StatusBadRequest || !strings.Contains(out, `"invalid_argument"`) {
			t.Fatalf("%s: %d %s, want 400 invalid_argument", body, status, out)
		}
	}
	if after := e.catalogDump(ctx); !maps.Equal(before, after) {
		t.Fatalf("refused requests changed the catalog")
	}
	for i := range 2 {
		status, out := post(`{"name": "shop", "idempotency_key": "k1"}`)
		if status != http.StatusOK || strings.Contains(out, `"duplicated":true`) != (i == 1) {
			t.Fatalf("attempt %d: %d %s", i, status, out)
		}
	}
}
