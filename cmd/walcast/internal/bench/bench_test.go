package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/walcast/walcast/meta"
	"github.com/walcast/walcast/server"
)

func TestMain(m *testing.M) {
	if os.Getenv(childStandalone) != "" {
		serveChildStandalone()
		return
	}
	goleak.VerifyTestMain(m)
}

// childStandalone, set in the environment, makes the test binary a
// standalone for a scale run (TestScaleSmall), as `walcast standalone
// --config FILE` would be: the last argument is the file.
const childStandalone = "WALCAST_BENCH_TEST_STANDALONE"

// serveChildStandalone runs a standalone from the configuration file its
// last argument names, prints its ready line, and runs until it is killed.
func serveChildStandalone() {
	cfg, err := server.Load(os.Args[len(os.Args)-1], nil, nil, nil)
	if err == nil {
		var app *meta.App
		mc := meta.Config{PChannels: cfg.PChannelNames(), ImportRoot: cfg.ImportRoot(), Logger: cfg.Logger(),
			CollectionShards: cfg.Meta.CollectionShards}
		if app, err = meta.NewApp(mc); err == nil {
			var p *server.Process
			if p, err = server.StartStandalone(context.Background(), cfg, app); err == nil {
				fmt.Println(p.ReadyLine("standalone"))
				select {} // until SIGKILL
			}
		}
	}
	fmt.Fprintln(os.Stderr, "child standalone:", err)
	os.Exit(1)
}

// TestScaleSmall runs a scale run at a tiny size against a standalone
// process (this test binary as one): every step is measured, a fresh
// standalone is measured in turns with the full one (interleaved), the
// kill -9 and restart are timed, B12 and B13 are judged, and the curves
// are drawn from the steps. The numbers are not asserted.
func TestScaleSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t.Setenv(childStandalone, "1")
	rep, err := Scale(ctx, ScaleConfig{Collections: 120, Databases: 3, Clients: 3, Steps: 4, Samples: 2, PageSize: 10,
		Command: []string{os.Args[0], "-test.run=^$"}, RatiosOnly: true, Interleaved: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Steps) != 4 || rep.Steps[3].Collections != 120 {
		t.Fatalf("steps %+v", rep.Steps)
	}
	for _, st := range rep.Steps {
		if st.Rate <= 0 || st.P99 <= 0 || st.DescribeP50 <= 0 || st.ListP50 <= 0 || st.RSS <= 0 || st.Catalog <= 0 || st.WAL <= 0 || st.EtcdDB <= 0 {
			t.Errorf("step %+v: a figure is missing", st)
		}
	}
	if rep.Ready <= 0 || rep.FirstDDL < rep.Ready {
		t.Errorf("recovery: ready %v, first DDL %v", rep.Ready, rep.FirstDDL)
	}
	ids := map[string]int{}
	judged := 0
	for _, r := range rep.Results {
		ids[r.ID]++
		// RatiosOnly and Interleaved: only the two interleaved ratios of
		// B12 are judged.
		notJudged := r.Target == "report" || strings.HasSuffix(r.Target, "(not judged)")
		switch {
		case interleaved(r) && notJudged:
			t.Errorf("with Interleaved, %q is not judged: %s", r.What, r.Target)
		case interleaved(r):
			judged++
		case !notJudged || !r.Pass:
			t.Errorf("with RatiosOnly and Interleaved %s %q is judged: %s, pass %v", r.ID, r.What, r.Target, r.Pass)
		}
	}
	if judged != 2 {
		t.Errorf("%d interleaved ratios judged, want 2", judged)
	}
	// The CPU row needs a clock tick of the server's CPU in the first
	// step, which a tiny step may not take, and the GC row a collection
	// in it.
	if ids["B12"] < 5 || ids["B12"] > 7 || ids["B13"] != 5 {
		t.Errorf("results %v: want 5 to 7 of B12 and 5 of B13", ids)
	}
	names := map[string]bool{}
	for _, c := range rep.Curves {
		names[c.Name] = c.Complexity != "" && len(c.Series) > 0 && len(c.Series[0].Points) == 4
	}
	for _, n := range []string{"scale-throughput", "scale-latency", "scale-memory"} {
		if !names[n] {
			t.Errorf("curve %s missing or incomplete", n)
		}
	}
}

// TestScaleGCCPUFromMetrics: the scale run reads the server's collector
// CPU from its /metrics, the total less the marking done on idle CPUs, and
// reads 0 from a server that does not export it.
func TestScaleGCCPUFromMetrics(t *testing.T) {
	body := "# HELP go_cpu_classes_gc_total_cpu_seconds_total x\n# TYPE go_cpu_classes_gc_total_cpu_seconds_total counter\n" +
		"go_cpu_classes_gc_total_cpu_seconds_total 2.5\n" +
		"go_cpu_classes_gc_mark_idle_cpu_seconds_total 0.75\ngo_cpu_classes_gc_mark_assist_cpu_seconds_total 0.5\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, body)
	}))
	defer srv.Close()
	s := &scaleServer{cmd: &exec.Cmd{}, metrics: strings.TrimPrefix(srv.URL, "http://")}
	if got := s.gcCPU(context.Background()); got != 1750*time.Millisecond {
		t.Errorf("gcCPU = %v, want 1.75s (2.5 total less 0.75 idle)", got)
	}
	body = "go_goroutines 12\n"
	if got := s.gcCPU(context.Background()); got != 0 {
		t.Errorf("gcCPU without the metric = %v, want 0", got)
	}
	if got := (&scaleServer{cmd: &exec.Cmd{}}).gcCPU(context.Background()); got != 0 {
		t.Errorf("gcCPU without a metrics address = %v, want 0", got)
	}
}

// TestRunSmall runs every benchmark at a tiny size, on both WALs and
// through the API: the harness works and every result is filled in. The numbers are not asserted (they are
// measurements, recorded in BENCHMARKS.md), except the zero-I/O property of
// duplicate hits, which is behaviour.
func TestRunSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := Config{Samples: 10, Clients: 4, Duration: 200 * time.Millisecond, Tombstones: 300, Pending: 10, API: true,
		APIClients: 4, MetaClients: 2}
	var mu sync.Mutex
	kinds := map[string]int{}
	cfg.Progress = func(e Event) {
		mu.Lock()
		kinds[e.Kind]++
		mu.Unlock()
	}
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int{}
	for _, r := range res {
		ids[r.ID]++
		if r.Value <= 0 && r.ID != "B3" {
			t.Errorf("%s %q: value %v", r.ID, r.What, r.Value)
		}
		if r.ID == "B5" && r.Note != "0 catalog round trips + WAL appends during 100 hits" {
			t.Errorf("duplicate hits did I/O: %s", r.Note)
		}
	}
	for id, n := range map[string]int{"B1": 2, "B2": 2, "B2r": 2, "B3": 4, "B4": 2, "B5": 1, "B6": 2, "B8": 1, "B9": 2, "B14": 1, "S1": 1, "S2": 1} {
		if ids[id] != n {
			t.Errorf("%d results for %s, want %d", ids[id], id, n)
		}
	}
	// Every step that began ended; notes say what is set up.
	if kinds["begin"] == 0 || kinds["begin"] != kinds["end"] || kinds["note"] == 0 {
		t.Errorf("progress events %v: want as many ends as begins, and notes", kinds)
	}
}

// The SPEC §12 benchmarks as Go benchmarks: b.N is ignored, each runs the
// measurement once and reports its value.
func benchOne(b *testing.B, id string) {
	cfg := Defaults()
	cfg.Only = []string{id}
	cfg.Duration = 3 * time.Second
	for b.Loop() {
		res, err := Run(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range res {
			b.ReportMetric(r.Value, r.ID+"_"+r.Unit)
			if r.Ratio > 0 {
				b.ReportMetric(r.Ratio, r.ID+"_ratio")
			}
		}
	}
}

func BenchmarkB1UncontendedLatency(b *testing.B)   { benchOne(b, "B1") }
func BenchmarkB2Throughput(b *testing.B)           { benchOne(b, "B2") }
func BenchmarkB2rBatchedFloor(b *testing.B)        { benchOne(b, "B2r") }
func BenchmarkB8APIThroughput(b *testing.B)        { benchOne(b, "B8") }
func BenchmarkB9CreateCollections(b *testing.B)    { benchOne(b, "B9") }
func BenchmarkB14PrivilegeChanges(b *testing.B)    { benchOne(b, "B14") }
func BenchmarkB4WideBroadcast(b *testing.B)        { benchOne(b, "B4") }
func BenchmarkB5DuplicateHit(b *testing.B)         { benchOne(b, "B5") }
func BenchmarkB6Recovery(b *testing.B)             { benchOne(b, "B6") }
func BenchmarkS1APILatencyTLSAuth(b *testing.B)    { benchOne(b, "S1") }
func BenchmarkS2APIThroughputTLSAuth(b *testing.B) { benchOne(b, "S2") }

// TestSweepSmall runs every growth curve at a tiny size: each has its
// series filled in, and a growth statement.
func TestSweepSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sw := SweepConfig{VChannels: []int{1, 8}, PChannels: []int{4}, Clients: []int{1, 2}, Duration: 100 * time.Millisecond,
		Queued: []int{5, 20}, Tombstones: []int{50, 100}, Samples: 3}
	curves, err := Sweep(ctx, Config{Lanes: 1}, sw)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, c := range curves {
		names[c.Name] = true
		if c.Complexity == "" || len(c.Series) == 0 {
			t.Errorf("%s: %+v", c.Name, c)
		}
		for _, s := range c.Series {
			if len(s.Points) != 2 {
				t.Errorf("%s, %s: %d points, want 2", c.Name, s.Name, len(s.Points))
			}
		}
	}
	for _, n := range []string{"latency-vs-vchannels", "latency-p99-vs-vchannels", "throughput-vs-clients", "scheduler-vs-queued",
		"recovery-vs-tombstones", "memory-vs-tombstones", "rss-vs-tombstones", "duplicate-hit-vs-index"} {
		if !names[n] {
			t.Errorf("no curve %s", n)
		}
	}
}

// TestGrowth classifies series of known shapes.
func TestGrowth(t *testing.T) {
	pts := func(f func(x float64) float64) []Point {
		var ps []Point
		for _, x := range []float64{10, 100, 1000, 10_000} {
			ps = append(ps, Point{x, f(x)})
		}
		return ps
	}
	for want, f := range map[string]func(float64) float64{
		"O(1)":     func(float64) float64 { return 5 },
		"O(log n)": func(x float64) float64 { return 3 * math.Log(x) },
		"O(n)":     func(x float64) float64 { return 2*x + 7 },
	} {
		if got := growth(pts(f)); !strings.HasPrefix(got, want+" ") {
			t.Errorf("growth of %s-shaped points: %s", want, got)
		}
	}
}

// TestReleaseDeletesWhatItHandedOut: release deletes the keys under the
// prefixes handed out, and nothing else, and compacts the embedded etcd's
// history, so that a later benchmark's process does not hold them.
func TestReleaseDeletesWhatItHandedOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := Start(ctx, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	a, b := e.keyPrefix("bench"), e.keyPrefix("raw")
	first, err := e.Client.Put(ctx, "other/k", "v")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{a + "x", a + "y", b + "z"} {
		if _, err := e.Client.Put(ctx, k, "v"); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{a, b} {
		resp, err := e.Client.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil || resp.Count != 0 {
			t.Fatalf("%s after release: %v keys, %v", p, resp.Count, err)
		}
	}
	if resp, err := e.Client.Get(ctx, "other/k"); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("a key outside the prefixes: %v, %v", resp, err)
	}
	if _, err := e.Client.Get(ctx, "other/k", clientv3.WithRev(first.Header.Revision)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("read at a revision before release: %v, want compacted", err)
	}
	if err := e.release(ctx); err != nil {
		t.Fatalf("release with nothing handed out: %v", err)
	}
}
