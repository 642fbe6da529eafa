package server_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/server"
)

// metricsStandalone starts a quiet standalone on free API and metrics
// ports, with mod's changes to its configuration; it is closed when t ends.
func metricsStandalone(ctx context.Context, t *testing.T, mod func(*server.Config)) *server.Process {
	t.Helper()
	return startWith(t, ctx, server.Default().Cluster.Name, t.TempDir(), func(cfg *server.Config) {
		cfg.Metrics.Addr = "127.0.0.1:0"
		if mod != nil {
			mod(cfg)
		}
	})
}

// scrape returns the exposition text of /metrics.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	code, body := get(t, "http://"+addr+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	return body
}

// TestR9_6_PprofWhenAsked: with metrics.pprof, the metrics address serves
// Go's profiles (an operator's way to see where memory goes), to a loopback
// caller when the API has no authentication.
func TestR9_6_PprofWhenAsked(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := metricsStandalone(ctx, t, func(cfg *server.Config) { cfg.Metrics.Pprof = true })
	code, body := get(t, "http://"+p.MetricsAddr()+"/debug/pprof/heap?debug=1")
	if code != http.StatusOK || !strings.Contains(body, "heap profile:") {
		t.Fatalf("/debug/pprof/heap with metrics.pprof: %d\n%.200s", code, body)
	}
	if code, body := get(t, "http://"+p.MetricsAddr()+"/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Fatalf("/debug/pprof/: %d\n%.200s", code, body)
	}
}

// TestR9_6_GarbageCollectorCPUExported: the runtime's estimate of the
// garbage collector's CPU is exported beside Go's default metrics, with
// the total it is a share of, and both have counted something by the time
// the process serves (it collected while starting).
func TestR9_6_GarbageCollectorCPUExported(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := metricsStandalone(ctx, t, nil)
	body := scrape(t, p.MetricsAddr())
	for _, name := range []string{"go_cpu_classes_gc_total_cpu_seconds_total", "go_cpu_classes_gc_mark_idle_cpu_seconds_total",
		"go_cpu_classes_total_cpu_seconds_total", "go_goroutines"} {
		m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("/metrics has no %s", name)
		}
		if name != "go_cpu_classes_gc_mark_idle_cpu_seconds_total" && (m[1] == "0" || strings.HasPrefix(m[1], "-")) {
			t.Errorf("%s = %s, want a positive count", name, m[1])
		}
	}
}

// TestR9_6_CountersExistAtZero: before anything happened, the promised
// counters are exported at zero for every registered type and pchannel, and
// the process gauges (leader, term, role, oldest task, node lag, build info)
// are there.
func TestR9_6_CountersExistAtZero(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := metricsStandalone(ctx, t, nil)
	if code, _ := get(t, "http://"+p.MetricsAddr()+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without metrics.pprof: %d, want 404", code)
	}
	text := scrape(t, p.MetricsAddr())
	for _, want := range []string{
		`walcast_broadcaster_append_retries_total{pchannel="wal-0"} 0`,
		`walcast_broadcaster_append_retries_total{pchannel="wal-3"} 0`,
		`walcast_broadcaster_callback_failures_total{type="Generic.v1"} 0`,
		`walcast_broadcaster_duplicates_total{type="GenericSync.v1"} 0`,
		`walcast_broadcaster_catalog_commits_total{kind="tombstone"} 0`,
		`walcast_broadcaster_tombstones_early_evicted_total 0`,
		`walcast_broadcaster_fenced_total 0`,
		`walcast_broadcaster_tasks{state="pending",type="Generic.v1"} 0`,
		`walcast_broadcaster_execution_duration_seconds_count{type="Generic.v1"} 0`,
		`walcast_api_requests_total{code="ok",method="walcast.api.v1.BroadcastService/Broadcast"} 0`,
		`walcast_coordinator_leader 1`,
		`walcast_cluster_role{role="primary"} 1`,
		`walcast_broadcaster_oldest_live_task_age_seconds 0`,
		`walcast_node_up{node="node-0"} 1`,
		`walcast_node_apply_lag_entries{node="node-1",pchannel="wal-1"} 0`,
		`walcast_replication_running 0`,
		`walcast_replication_lag_entries{pchannel="wal-2"} 0`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("missing at start: %s", want)
		}
	}
	if !regexp.MustCompile(`walcast_coordinator_term [1-9]`).MatchString(text) {
		t.Error("walcast_coordinator_term is not a positive revision on the leader")
	}
	if !regexp.MustCompile(`walcast_build_info\{go_version="go[^"]+",revision="[^"]*",version="[^"]+"\} 1`).MatchString(text) {
		t.Error("no walcast_build_info")
	}

	// API calls are counted by method and code, over every protocol.
	c := walcastv1connect.NewBroadcastServiceClient(http.DefaultClient, "http://"+p.APIAddr())
	if _, err := c.Broadcast(ctx, connect.NewRequest(&walcastv1.BroadcastRequest{Type: app.GenericType.String(), Payload: []byte("x"),
		Vchannels: []string{"wal-1/a"}, ResourceKeys: []string{"Collection:db:c@X"}})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetTask(ctx, connect.NewRequest(&walcastv1.GetTaskRequest{Id: 999})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("GetTask 999: %v", err)
	}
	grpc := walcastv1connect.NewBroadcastServiceClient(http2Client(t), "http://"+p.APIAddr(), connect.WithGRPC())
	if _, err := grpc.GetTask(ctx, connect.NewRequest(&walcastv1.GetTaskRequest{Id: 998})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("GetTask 998 over gRPC: %v", err)
	}
	web := walcastv1connect.NewBroadcastServiceClient(http.DefaultClient, "http://"+p.APIAddr(), connect.WithGRPCWeb())
	if _, err := web.ListLocks(ctx, connect.NewRequest(&walcastv1.ListLocksRequest{})); err != nil {
		t.Fatal(err)
	}
	text = scrape(t, p.MetricsAddr())
	for _, want := range []string{
		`walcast_api_requests_total{code="ok",method="walcast.api.v1.BroadcastService/Broadcast"} 1`,
		`walcast_api_requests_total{code="not_found",method="walcast.api.v1.BroadcastService/GetTask"} 2`,
		`walcast_api_requests_total{code="ok",method="walcast.api.v1.BroadcastService/ListLocks"} 1`,
		`walcast_api_request_duration_seconds_count{method="walcast.api.v1.BroadcastService/Broadcast"} 1`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("after the calls, missing: %s\n%s", want, grepLines(text, "walcast_api_requests_total"))
		}
	}
}

func http2Client(t *testing.T) *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// metricRE finds metric names in PromQL.
var metricRE = regexp.MustCompile(`\bwalcast_[a-z0-9_]+`)

// TestR9_6_DeployedRulesAndDashboardUseExportedMetrics: every walcast
// metric deploy/prometheus/alerts.yaml and deploy/grafana/walcast.json use
// is exported by a standalone after one broadcast (series of histograms by
// their _bucket, _sum and _count names).
func TestR9_6_DeployedRulesAndDashboardUseExportedMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := metricsStandalone(ctx, t, nil)
	c := walcastv1connect.NewBroadcastServiceClient(http.DefaultClient, "http://"+p.APIAddr())
	if _, err := c.Broadcast(ctx, connect.NewRequest(&walcastv1.BroadcastRequest{Type: app.GenericType.String(), Payload: []byte("x"),
		Vchannels: []string{"wal-1/a"}, ResourceKeys: []string{"Collection:db:c@X"}})); err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, line := range strings.Split(scrape(t, p.MetricsAddr()), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		exported[name] = true
	}
	for _, file := range []string{"../deploy/prometheus/alerts.yaml", "../deploy/grafana/walcast.json"} {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		used := slices.Compact(slices.Sorted(slices.Values(metricRE.FindAllString(string(raw), -1))))
		if len(used) < 10 {
			t.Fatalf("%s uses only %d walcast metrics: %v", file, len(used), used)
		}
		for _, m := range used {
			if !exported[m] {
				t.Errorf("%s uses %s, which walcast does not export", file, m)
			}
		}
	}
}

func grepLines(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
