package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/meta"
	"github.com/walcast/walcast/server"
)

// metaCLI runs walcast commands in process against a standalone process
// running the meta app.
type metaCLI struct {
	t       *testing.T
	addr    string
	root    string      // the import root
	lastErr error       // of the last split
	log     *syncBuffer // the metadata service's warnings and errors
}

func startMetaCLI(t *testing.T, configure ...func(*server.Config)) *metaCLI {
	t.Helper()
	log := &syncBuffer{}
	p, app, mc := startMetaStandalone(t, log, configure...)
	t.Cleanup(func() {
		_ = app.Close()
		_ = p.Close()
	})
	return &metaCLI{t: t, addr: p.APIAddr(), root: mc.ImportRoot, log: log}
}

// startMetaStandalone starts a standalone process running the metadata
// service, on a random port in a temporary directory, the service logging
// its warnings and errors to log; the caller closes the service, then the
// process.
func startMetaStandalone(t *testing.T, log io.Writer, configure ...func(*server.Config)) (*server.Process, *meta.App, meta.Config) {
	t.Helper()
	cfg := server.Default()
	cfg.DataDir = t.TempDir()
	cfg.API.Addr = "127.0.0.1:0"
	cfg.Metrics.Addr = ""
	cfg.Log.Level = "error"
	for _, fn := range configure {
		fn(&cfg)
	}
	mc := metaConfig(cfg)
	mc.ImporterInterval = 10 * time.Millisecond
	mc.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn}))
	app, err := meta.NewApp(mc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := server.StartStandalone(ctx, cfg, app)
	if err != nil {
		_ = app.Close()
		t.Fatal(err)
	}
	return p, app, mc
}

// run runs one command and returns its output, failing the test on error.
func (m *metaCLI) run(args ...string) string {
	m.t.Helper()
	out, err := m.try(args...)
	if err != nil {
		m.t.Fatalf("walcast %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (m *metaCLI) try(args ...string) (string, error) {
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"--addr", m.addr, "--timeout", "20s"}, args...))
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func wantOutput(t *testing.T, out string, patterns ...string) {
	t.Helper()
	for _, p := range patterns {
		if !regexp.MustCompile(p).MatchString(out) {
			t.Fatalf("output does not match %q:\n%s", p, out)
		}
	}
}

// TestMetaCLI drives every meta command, human and --json, against a
// standalone process.
func TestMetaCLI(t *testing.T) {
	m := startMetaCLI(t)
	wantOutput(t, m.run("db", "create", "shop"), `^database shop created, id \d+ \(broadcast \d+\)`)
	m.run("db", "create", "tmp")
	wantOutput(t, m.run("db", "list"), `(?m)^ID\s+NAME\s+CREATED$`, `(?m)^\d+\s+shop\s+`, `(?m)^\d+\s+tmp\s+`)
	// A page at a time: the first page names the token of the rest.
	out := m.run("db", "list", "--limit", "1")
	wantOutput(t, out, `(?m)^\d+\s+shop\s+`, `(?m)^\(more: --page-token \S+\)$`)
	if strings.Contains(out, "tmp") {
		t.Fatalf("db list --limit 1 listed both databases:\n%s", out)
	}
	token := regexp.MustCompile(`--page-token (\S+)\)`).FindStringSubmatch(out)[1]
	out = m.run("db", "list", "--page-token", token)
	wantOutput(t, out, `(?m)^\d+\s+tmp\s+`)
	if strings.Contains(out, "shop") || strings.Contains(out, "more:") {
		t.Fatalf("db list --page-token: the rest is tmp alone:\n%s", out)
	}
	wantOutput(t, m.run("db", "list", "--limit", "1", "--json"), `"next_page_token":\s*"`+token+`"`)
	m.run("db", "drop", "tmp")

	out = m.run("collection", "create", "orders", "--db", "shop", "--shards", "3", "--field", "id:int64", "--field", "emb:float_vector", "--json")
	var created struct {
		Collection struct {
			ID        uint64   `json:"id"`
			Vchannels []string `json:"vchannels"`
		} `json:"collection"`
	}
	if err := json.Unmarshal([]byte(out), &created); err != nil || len(created.Collection.Vchannels) != 3 {
		t.Fatalf("collection create --json: %v\n%s", err, out)
	}
	wantOutput(t, m.run("index", "create", "orders", "by_emb", "--db", "shop", "--field", "emb", "--type", "HNSW"),
		`index by_emb \(HNSW on emb\) created on shop.orders`)
	wantOutput(t, m.run("collection", "list", "--db", "shop"), `(?m)^ID\s+NAME\s+SHARDS\s+INDEXES\s+CREATED$`, `orders\s+3\s+by_emb\(emb HNSW\)`)

	// Real files in the server's import root.
	writeFile(t, filepath.Join(m.root, "a.jsonl"), `{"id": 1, "emb": [1, 2]}`+"\n"+`{"id": 2, "emb": [3, 4]}`+"\n")
	writeFile(t, filepath.Join(m.root, "b.csv"), "id,emb\n3,\"[5, 6]\"\n")
	out = m.run("import", "start", "orders", "a.jsonl", "b.csv", "--db", "shop", "--key", "k1")
	wantOutput(t, out, `import job (\d+) into shop.orders: (pending|running|completed)`, `key: k1`)
	job := regexp.MustCompile(`import job (\d+)`).FindStringSubmatch(out)[1]
	wantOutput(t, m.run("import", "start", "orders", "a.jsonl", "b.csv", "--db", "shop", "--key", "k1"),
		`import job `+job+` .*retry answered by the original`)
	waitFor(t, "the import to complete", func() bool {
		out = m.run("import", "show", job)
		return strings.Contains(out, "completed")
	})
	wantOutput(t, out, `(?m)^state\s+completed$`, `(?m)^progress\s+2 of 2 files, 3 rows$`, `(?m)^database\s+shop \(id \d+\)$`)
	wantOutput(t, m.run("import", "show", job, "--json"), `"id":\s*`+job+`,`, `"files"`, `"rows":\s*3,`, `"state":\s*"completed"`)
	out, err := m.try("import", "start", "orders", "../escape.csv", "--db", "shop")
	if err == nil || !strings.Contains(err.Error(), "not a path inside the import root") {
		t.Fatalf("an import path outside the root: %v\n%s", err, out)
	}

	m.run("user", "create", "alice")
	wantOutput(t, m.run("grant", "alice", "Search", "--db", "shop"), `granted Search on shop.\* to alice`)
	wantOutput(t, m.run("user", "list"), `(?m)^alice\s+.*Search on shop\.\*`)
	m.run("user", "create", "bob")
	out = m.run("user", "list", "--limit", "1")
	wantOutput(t, out, `(?m)^alice\s+.*Search on shop\.\*`, `(?m)^\(more: --page-token \S+\)$`)
	if strings.Contains(out, "bob") {
		t.Fatalf("user list --limit 1 listed both users:\n%s", out)
	}
	token = regexp.MustCompile(`--page-token (\S+)\)`).FindStringSubmatch(out)[1]
	out = m.run("user", "list", "--page-token", token, "--json")
	wantOutput(t, out, `"name":\s*"bob"`, `"next_page_token":\s*""`)
	if strings.Contains(out, "alice") {
		t.Fatalf("user list --page-token: the rest is bob alone:\n%s", out)
	}
	// A streamed JSON list is one document, the token of the rest at its end.
	var jl struct {
		Databases []struct{ Name string } `json:"databases"`
		Next      string                  `json:"next_page_token"`
	}
	if err := json.Unmarshal([]byte(m.run("db", "list", "-o", "json")), &jl); err != nil || len(jl.Databases) != 1 || jl.Next != "" {
		t.Fatalf("db list -o json: %+v, %v", jl, err)
	}
	// user list -o json streams its users, each with its grants.
	var ul struct {
		Users []struct {
			Name   string
			Grants []struct{ Privilege, Database string }
		} `json:"users"`
		Next string `json:"next_page_token"`
	}
	if err := json.Unmarshal([]byte(m.run("user", "list", "-o", "json", "--limit", "1")), &ul); err != nil || len(ul.Users) != 1 ||
		ul.Users[0].Name != "alice" || len(ul.Users[0].Grants) != 1 || !strings.EqualFold(ul.Users[0].Grants[0].Privilege, "Search") ||
		ul.Users[0].Grants[0].Database != "shop" || ul.Next == "" {
		t.Fatalf("user list -o json --limit 1: %+v, %v", ul, err)
	}
	wantOutput(t, m.run("revoke", "alice", "Search", "--db", "shop"), `revoked Search on shop.\* from alice`)

	wantOutput(t, m.run("collection", "rename", "orders", "purchases", "--db", "shop"), `renamed to purchases, id `+fmt.Sprint(created.Collection.ID))
	// The job shows the collection's current name, and its id.
	wantOutput(t, m.run("import", "list", "--db", "shop", "--collection", "purchases"),
		`(?m)^`+job+`\s+shop.purchases \(`+fmt.Sprint(created.Collection.ID)+`\)\s+completed\s+2/2\s+3\s+`)
	wantOutput(t, m.run("import", "show", job), `(?m)^collection\s+purchases \(id `+fmt.Sprint(created.Collection.ID)+`\)$`)
	wantOutput(t, m.run("collection", "describe", "purchases", "--db", "shop"), `(?m)^vchannels\s+`+regexp.QuoteMeta(strings.Join(created.Collection.Vchannels, " ")))

	// The nodes' view of a shard catches up with the rename.
	// (Until the node has applied the create, it has no view of the shard:
	// the create returned once its copies were appended, FastAck, R4.4.)
	var view string
	waitUntil(t, "the shard's view to show the rename", func() bool {
		var err error
		view, err = m.try("view", "--vchannel", created.Collection.Vchannels[0])
		return err == nil && strings.Contains(view, "purchases")
	})
	wantOutput(t, view, `(?m)^collection\s+purchases \(id `+fmt.Sprint(created.Collection.ID)+`\)$`, `(?m)^indexes\s+by_emb`, `(?m)^import jobs\s+`+job+`$`)
	users := regexp.MustCompile(`"users":\s*\[\s*"alice",\s*"bob"\s*\]`)
	waitUntil(t, "alice in the control channel's view", func() bool {
		out, err := m.try("view", "--vchannel", "wal-0/_control", "--json")
		return err == nil && users.MatchString(out)
	})

	m.run("index", "drop", "purchases", "by_emb", "--db", "shop")
	m.run("collection", "drop", "purchases", "--db", "shop")
	m.run("db", "drop", "shop")

	// Errors are the server's, typed.
	if out, err := m.try("collection", "create", "x", "--db", "nope"); err == nil || !strings.Contains(err.Error(), "database not found") {
		t.Fatalf("unknown database: %v\n%s", err, out)
	}
	if _, err := m.try("collection", "create", "x"); err == nil || !strings.Contains(err.Error(), `"db" not set`) {
		t.Fatalf("missing --db: %v", err)
	}
	if _, err := m.try("collection", "create", "x", "--db", "shop", "--field", "nocolon"); err == nil {
		t.Fatal("malformed --field accepted")
	}
}
