package server_test

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/internal/embedetcd"
	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/server"
)

// get returns the status code and body of a GET.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func grpcConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func healthOf(t *testing.T, ctx context.Context, conn *grpc.ClientConn, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("health check %q: %v", service, err)
	}
	return resp.GetStatus()
}

// TestR9_10_ReadyzWithBackendsStopped runs two coordinators against an etcd
// and a NATS server that the test starts (external to the coordinators):
// one leads and is ready, the other is ready as a standby naming the
// leader. Then NATS is stopped: both report not ready, naming the WAL, on
// /readyz and on the gRPC health service; then etcd: the catalog check
// fails too. /healthz stays ok throughout.
func TestR9_10_ReadyzWithBackendsStopped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	etcd, err := embedetcd.Start(ctx, embedetcd.Config{Dir: filepath.Join(dir, "etcd")})
	if err != nil {
		t.Fatal(err)
	}
	etcdOpen := true
	defer func() {
		if etcdOpen {
			_ = etcd.Close()
		}
	}()
	ns, err := embednats.Start(ctx, embednats.Config{Dir: filepath.Join(dir, "nats"), SyncAlways: true, Monitor: true})
	if err != nil {
		t.Fatal(err)
	}
	natsOpen := true
	defer func() {
		if natsOpen {
			ns.Close()
		}
	}()
	coord := func() *server.Process {
		cfg := server.Default()
		cfg.DataDir = t.TempDir()
		cfg.API.Addr = "127.0.0.1:0"
		cfg.Metrics.Addr = ""
		cfg.Log.Level = "error"
		cfg.Catalog.Endpoints = etcd.Endpoints()
		cfg.Catalog.MaxTxnOps = etcd.MaxTxnOps()
		cfg.WAL.NATS.URL = ns.ClientURL()
		cfg.WAL.NATS.MonitorURLs = []string{ns.MonitorURL()}
		cfg.Election.TTL = server.Duration(2 * time.Second)
		p, err := server.StartCoordinator(ctx, cfg, app.Generic{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		return p
	}
	leader := coord()
	url := "http://" + leader.APIAddr()
	waitUntil(t, "the leader ready", func() bool { code, _ := get(t, url+"/readyz"); return code == http.StatusOK })
	if code, body := get(t, url+"/readyz"); !strings.HasPrefix(body, "ready: leader\n") || !strings.Contains(body, "ok recovery: finished") {
		t.Fatalf("leader /readyz: %d %q", code, body)
	}
	standby := coord()
	surl := "http://" + standby.APIAddr()
	waitUntil(t, "the standby ready", func() bool { code, _ := get(t, surl+"/readyz"); return code == http.StatusOK })
	if _, body := get(t, surl+"/readyz"); !strings.HasPrefix(body, "ready: standby\n") || !strings.Contains(body, "the leader is at "+leader.APIAddr()) {
		t.Fatalf("standby /readyz: %q", body)
	}
	lconn, sconn := grpcConn(t, leader.APIAddr()), grpcConn(t, standby.APIAddr())
	const bs = "walcast.api.v1.BroadcastService"
	if s := healthOf(t, ctx, lconn, bs); s != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("leader health %s: %v", bs, s)
	}
	if s := healthOf(t, ctx, sconn, ""); s != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("standby health: %v, want SERVING (ready as a standby)", s)
	}
	if s := healthOf(t, ctx, sconn, bs); s != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("standby health %s: %v, want NOT_SERVING (the leader serves it)", bs, s)
	}

	ns.Close()
	natsOpen = false
	for _, u := range []string{url, surl} {
		waitUntil(t, "not ready without NATS", func() bool { code, _ := get(t, u+"/readyz"); return code == http.StatusServiceUnavailable })
		_, body := get(t, u+"/readyz")
		if !strings.HasPrefix(body, "not ready: wal: ") || !strings.Contains(body, "ok catalog") {
			t.Errorf("%s/readyz without NATS: %q", u, body)
		}
		if code, body := get(t, u+"/healthz"); code != http.StatusOK || body != "ok\n" {
			t.Errorf("/healthz: %d %q", code, body)
		}
	}
	if s := healthOf(t, ctx, lconn, ""); s != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("leader health without NATS: %v", s)
	}

	_ = etcd.Close()
	etcdOpen = false
	_, body := get(t, url+"/readyz")
	if !strings.Contains(body, "FAIL catalog: etcd does not answer: cannot reach etcd at ") || !strings.Contains(body, "connection refused") ||
		!strings.Contains(body, "FAIL wal:") || !strings.Contains(body, "cannot reach NATS at ") {
		t.Errorf("/readyz without etcd and NATS: %q", body)
	}
}

// TestR9_4_PlainGRPCClient uses grpc-go (not Connect) against a standalone:
// server reflection lists the services, a Broadcast succeeds, and the
// health service reports SERVING.
func TestR9_4_PlainGRPCClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := standalone(t, ctx, "grpc")
	defer p.Close()
	conn := grpcConn(t, p.APIAddr())

	stream, err := reflectpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.CloseSend()
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{"walcast.api.v1.BroadcastService", "walcast.api.v1.ReplicationService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, missing %s", names, want)
		}
	}
	// The descriptor of BroadcastService resolves, so tools can build
	// requests from it.
	stream, err = reflectpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: "walcast.api.v1.BroadcastService"}}); err != nil {
		t.Fatal(err)
	}
	if resp, err = stream.Recv(); err != nil || len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Fatalf("file containing BroadcastService: %v %v", resp, err)
	}
	_ = stream.CloseSend()

	out := new(walcastv1.BroadcastResponse)
	err = conn.Invoke(ctx, "/walcast.api.v1.BroadcastService/Broadcast", &walcastv1.BroadcastRequest{
		Type: app.GenericType.String(), Payload: []byte("hi"), Vchannels: []string{"wal-1/a"}, ResourceKeys: []string{"Collection:db:c@X"},
	}, out)
	if err != nil {
		t.Fatalf("Broadcast over grpc-go: %v", err)
	}
	if out.GetBroadcastId() == 0 || out.GetOutcome().GetStatus() != walcastv1.OutcomeStatus_OUTCOME_STATUS_SUCCEEDED {
		t.Fatalf("Broadcast: %v", out)
	}
	if s := healthOf(t, ctx, conn, ""); s != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health: %v", s)
	}
	if s := healthOf(t, ctx, conn, "walcast.api.v1.BroadcastService"); s != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health of BroadcastService: %v", s)
	}
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "no.such.Service"}); err == nil {
		t.Error("health of an unknown service: no error, want NotFound")
	}
}
