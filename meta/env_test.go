package meta

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/server"
)

// TestMain checks that no test leaks a goroutine: processes, apps and
// clients all stop with their test.
func TestMain(m *testing.M) {
	code := m.Run()
	removeBinary()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// env is a standalone process (embedded etcd and NATS in a temp dir) running
// the meta app, and a client of its API.
type env struct {
	t   testing.TB
	app *App
	p   *server.Process
	c   *client.Client
	cfg server.Config
	mc  Config
}

// quiet is the logger of test processes.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// processConfig is the service's configuration in a process configured by
// cfg, as the walcast command builds it (cmd/walcast/app.go): its pchannels
// and import root; the meta.* settings of test processes are the defaults.
func processConfig(cfg server.Config) Config {
	return Config{PChannels: cfg.PChannelNames(), ImportRoot: cfg.ImportRoot(), Logger: quiet}
}

// startEnv starts a standalone process; mod adjusts its configurations.
func startEnv(t testing.TB, mod ...func(*server.Config, *Config)) *env {
	t.Helper()
	cfg := server.Default()
	cfg.DataDir = t.TempDir()
	cfg.API.Addr = "127.0.0.1:0"
	cfg.Metrics.Addr = ""
	cfg.Log.Level = "error"
	cfg.Broadcast.Backoff.Max = server.Duration(100 * time.Millisecond)
	mc := processConfig(cfg)
	mc.ImporterInterval = 10 * time.Millisecond
	mc.Logger = quiet
	for _, m := range mod {
		m(&cfg, &mc)
	}
	e := &env{t: t, cfg: cfg}
	e.start(mc)
	return e
}

func (e *env) start(mc Config) {
	e.t.Helper()
	e.mc = mc
	app, err := NewApp(mc)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := server.StartStandalone(ctx, e.cfg, app)
	if err != nil {
		_ = app.Close()
		e.t.Fatal(err)
	}
	c, err := client.New([]string{"http://" + p.APIAddr()}, client.WithBackoff(5*time.Millisecond, 50*time.Millisecond),
		client.WithAttemptTimeout(20*time.Second))
	if err != nil {
		e.t.Fatal(err)
	}
	e.app, e.p, e.c = app, p, c
	e.t.Cleanup(e.stop)
}

// stop closes the client, the process and the app; it is idempotent.
func (e *env) stop() {
	if e.p == nil {
		return
	}
	e.c.Close()
	_ = e.app.Close() // first: the importer stops at once while its process leads
	if err := e.p.Close(); err != nil {
		e.t.Errorf("close process: %v", err)
	}
	e.p = nil
}

// svc is the process's meta service.
func (e *env) svc() *Service { return e.app.Services()[0] }

// b is the leader's broadcaster.
func (e *env) b() *broadcast.Broadcaster {
	b, err := e.p.Coord.Current()
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func must[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// wantCode checks that err is a client error with code.
func wantCode(t testing.TB, err error, code connect.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %v", code)
	}
	if got := connect.CodeOf(err); got != code {
		t.Fatalf("error %v: code %v, want %v", err, got, code)
	}
}

// eventually waits for an event: see wait.ForNil.
var eventually = wait.ForNil

// snapshot is the whole metadata as the API shows it.
type snapshot struct {
	Databases   []*walcastv1.Database
	Collections map[string][]*walcastv1.Collection // by database name
	Users       *walcastv1.ListUsersResponse
	Jobs        []*walcastv1.ImportJob
}

func (e *env) snapshot(ctx context.Context) *snapshot {
	e.t.Helper()
	s, err := snapshotOf(ctx, e.c)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

func snapshotOf(ctx context.Context, c *client.Client) (*snapshot, error) {
	s := &snapshot{Collections: map[string][]*walcastv1.Collection{}}
	var err error
	if s.Databases, err = c.ListDatabases(ctx); err != nil {
		return nil, err
	}
	for _, d := range s.Databases {
		if s.Collections[d.Name], err = c.ListCollections(ctx, d.Name); err != nil {
			return nil, err
		}
	}
	if s.Users, err = c.ListUsers(ctx); err != nil {
		return nil, err
	}
	if s.Jobs, err = c.ListImportJobs(ctx, "", ""); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *snapshot) equal(o *snapshot) bool {
	eq := func(a, b []proto.Message) bool {
		return slices.EqualFunc(a, b, func(x, y proto.Message) bool { return proto.Equal(x, y) })
	}
	conv := func(xs any) []proto.Message {
		var out []proto.Message
		switch v := xs.(type) {
		case []*walcastv1.Database:
			for _, x := range v {
				out = append(out, x)
			}
		case []*walcastv1.Collection:
			for _, x := range v {
				out = append(out, x)
			}
		case []*walcastv1.ImportJob:
			for _, x := range v {
				out = append(out, x)
			}
		}
		return out
	}
	if !eq(conv(s.Databases), conv(o.Databases)) || !proto.Equal(s.Users, o.Users) || !eq(conv(s.Jobs), conv(o.Jobs)) {
		return false
	}
	if !slices.Equal(slices.Sorted(maps.Keys(s.Collections)), slices.Sorted(maps.Keys(o.Collections))) {
		return false
	}
	for k := range s.Collections {
		if !eq(conv(s.Collections[k]), conv(o.Collections[k])) {
			return false
		}
	}
	return true
}

// viewsMatch checks every vchannel view of the metadata: each live
// collection's shards know its id, name, database, shard, indexes and
// import jobs, each dropped one's shards are marked dropped, the control
// channel knows the databases, users and grants, and no view saw an
// anomaly. dropped are the collections dropped so far.
func (e *env) viewsMatch(ctx context.Context, dropped []*walcastv1.Collection) error {
	return viewsMatch(ctx, e.c, string(e.cfg.ControlChannel()), dropped)
}

func viewsMatch(ctx context.Context, c *client.Client, control string, dropped []*walcastv1.Collection) error {
	return viewsMatchOf(ctx, c, c.GetVChannelView, control, dropped)
}

// viewFunc returns the view of a vchannel.
type viewFunc func(ctx context.Context, vchannel string) (*walcastv1.VChannelView, error)

// viewsMatchOf is viewsMatch with the views read by view (the nodes of a
// cluster run in their own processes) and the metadata by c.
func viewsMatchOf(ctx context.Context, c *client.Client, view viewFunc, control string, dropped []*walcastv1.Collection) error {
	s, err := snapshotOf(ctx, c)
	if err != nil {
		return err
	}
	jobsOf, finishedOf, rolledBackOf, rowsOf := map[uint64][]uint64{}, map[uint64][]uint64{}, map[uint64][]uint64{}, map[uint64]uint64{}
	for _, j := range s.Jobs {
		jobsOf[j.CollectionId] = append(jobsOf[j.CollectionId], j.Id)
		switch j.State {
		case walcastv1.ImportJobState_IMPORT_JOB_STATE_COMPLETED:
			rowsOf[j.CollectionId] += j.Rows
			fallthrough
		case walcastv1.ImportJobState_IMPORT_JOB_STATE_FAILED:
			finishedOf[j.CollectionId] = append(finishedOf[j.CollectionId], j.Id)
		case walcastv1.ImportJobState_IMPORT_JOB_STATE_ROLLED_BACK:
			rolledBackOf[j.CollectionId] = append(rolledBackOf[j.CollectionId], j.Id)
		}
	}
	for _, colls := range s.Collections {
		for _, coll := range colls {
			splitFrom := map[string]string{}
			for _, f := range coll.FencedShards {
				for _, to := range f.SplitInto {
					splitFrom[to] = f.Vchannel
				}
			}
			for i, vc := range coll.Vchannels {
				if len(coll.FencedShards) > 0 {
					// After a split a shard's number is its name's
					// (c<id>v<n>), no longer its place in the list.
					i, _ = strconv.Atoi(vc[strings.LastIndex(vc, "v")+1:])
				}
				v, err := view(ctx, vc)
				if err != nil {
					return fmt.Errorf("view of %s: %w", vc, err)
				}
				want := &walcastv1.VChannelView{Vchannel: vc, Node: v.Node, CollectionId: coll.Id, Collection: coll.Name,
					DatabaseId: coll.DatabaseId, Database: coll.Database, Shard: int32(i), Indexes: coll.Indexes,
					ImportJobs: jobsOf[coll.Id], FinishedImportJobs: finishedOf[coll.Id], RolledBackImportJobs: rolledBackOf[coll.Id],
					ImportedRows: rowsOf[coll.Id], SplitFrom: splitFrom[vc], Applied: v.Applied, LastBroadcastId: v.LastBroadcastId}
				got := proto.Clone(v).(*walcastv1.VChannelView)
				slices.Sort(got.ImportJobs)
				slices.Sort(got.FinishedImportJobs)
				slices.Sort(got.RolledBackImportJobs)
				if !proto.Equal(got, want) {
					return fmt.Errorf("view of %s:\n got %v\nwant %v", vc, got, want)
				}
			}
		}
	}
	for _, coll := range dropped {
		for _, vc := range coll.Vchannels {
			v, err := view(ctx, vc)
			if err != nil {
				return fmt.Errorf("view of %s: %w", vc, err)
			}
			if !v.Dropped || v.CollectionId != coll.Id || len(v.Anomalies) > 0 {
				return fmt.Errorf("view of dropped %s: %v", vc, v)
			}
		}
	}
	v, err := view(ctx, control)
	if err != nil {
		return fmt.Errorf("view of %s: %w", control, err)
	}
	want := &walcastv1.VChannelView{Vchannel: control, Node: v.Node, Databases: s.Databases, Grants: s.Users.Grants,
		Applied: v.Applied, LastBroadcastId: v.LastBroadcastId}
	for _, u := range s.Users.Users {
		want.Users = append(want.Users, u.Name)
	}
	key := func(g *walcastv1.Grant) string {
		r := grantFromPB(g)
		r.DatabaseID, r.CollectionID = g.DatabaseId, g.CollectionId
		return grantKey(r)
	}
	slices.SortFunc(want.Grants, func(a, b *walcastv1.Grant) int { return strings.Compare(key(a), key(b)) })
	if !proto.Equal(v, want) {
		return fmt.Errorf("view of %s:\n got %v\nwant %v", control, v, want)
	}
	return nil
}

// noAnomalies checks every view of every node of the process.
func (e *env) noAnomalies() error {
	for name, ap := range e.app.Appliers() {
		for _, vc := range ap.VChannels() {
			v, err := ap.View(vc)
			if err != nil {
				return err
			}
			if len(v.Anomalies) > 0 {
				return fmt.Errorf("node %s, %s: anomalies %q", name, vc, v.Anomalies)
			}
		}
	}
	return nil
}

// key returns a fresh client key.
func key() string { return client.NewRequestKey() }

// root is the process's import root.
func (e *env) root() string { return e.app.cfg.ImportRoot }

// writeImport writes an import file under the import root (directories
// included) and returns its name.
func (e *env) writeImport(name, content string) string {
	e.t.Helper()
	writeFile(e.t, filepath.Join(e.root(), name), content)
	return name
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// jsonlRows is n JSON lines rows of the default schema (id, vector).
func jsonlRows(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "{\"id\": %d, \"vector\": [%d.5, 1, -2]}\n", i, i%7)
	}
	return b.String()
}

// csvRows is n CSV rows of the default schema, with its header.
func csvRows(n int) string {
	var b strings.Builder
	b.WriteString("vector,id\n")
	for i := range n {
		fmt.Fprintf(&b, "\"[%d, 0.25, 3]\",%d\n", i%5, i)
	}
	return b.String()
}
