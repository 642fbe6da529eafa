package server_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/server"
)

// receiver is an in-process OTLP collector: it keeps the spans exported to
// it with their resource attributes, and the request headers.
type receiver struct {
	collectorpb.UnimplementedTraceServiceServer
	mu      sync.Mutex
	spans   []*tracepb.Span
	res     map[string]string
	headers map[string]string
}

func (r *receiver) add(req *collectorpb.ExportTraceServiceRequest, headers map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		r.res = map[string]string{}
		for _, kv := range rs.GetResource().GetAttributes() {
			r.res[kv.GetKey()] = kv.GetValue().GetStringValue()
		}
		for _, ss := range rs.GetScopeSpans() {
			r.spans = append(r.spans, ss.GetSpans()...)
		}
	}
	r.headers = headers
}

func (r *receiver) Export(ctx context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	h := map[string]string{}
	for k, v := range md {
		h[k] = v[0]
	}
	r.add(req, h)
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

// ServeHTTP is the OTLP/HTTP (protobuf) endpoint.
func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	var m collectorpb.ExportTraceServiceRequest
	if req.URL.Path != "/v1/traces" || proto.Unmarshal(b, &m) != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	r.add(&m, map[string]string{"x-tenant": req.Header.Get("X-Tenant")})
	out, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// appliedOn is walcast_node_copies_applied_total of pchannel p in the
// process's registry.
func appliedOn(t *testing.T, proc *server.Process, p string) float64 {
	t.Helper()
	mfs, err := proc.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "walcast_node_copies_applied_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "pchannel" && l.GetValue() == p {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// TestR9_10_TracesExportOverOTLP runs a standalone exporting to an
// in-process collector, over gRPC and over HTTP: one broadcast's spans
// (caller → persist → append → node apply → tombstone) arrive in the caller's
// trace, joined parent to child, with the walcast resource and the
// configured headers.
func TestR9_10_TracesExportOverOTLP(t *testing.T) {
	for _, protocol := range []string{"grpc", "http"} {
		t.Run(protocol, func(t *testing.T) {
			rec := &receiver{}
			var endpoint string
			if protocol == "grpc" {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				gs := grpc.NewServer()
				collectorpb.RegisterTraceServiceServer(gs, rec)
				go func() { _ = gs.Serve(ln) }()
				defer gs.Stop()
				endpoint = ln.Addr().String()
			} else {
				hs := httptest.NewServer(rec)
				defer hs.Close()
				endpoint = hs.Listener.Addr().String()
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := server.Default()
			cfg.DataDir = t.TempDir()
			cfg.API.Addr = "127.0.0.1:0"
			cfg.Metrics.Addr = ""
			cfg.Log.Level = "error"
			cfg.Tracing.Exporter = "otlp"
			cfg.Tracing.InstanceID = "test-instance"
			cfg.Tracing.OTLP.Protocol = protocol
			cfg.Tracing.OTLP.Endpoint = endpoint
			cfg.Tracing.OTLP.Insecure = true
			cfg.Tracing.OTLP.Headers = []string{"x-tenant=walcast-test"}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			p, err := server.StartStandalone(ctx, cfg, app.Generic{})
			if err != nil {
				t.Fatal(err)
			}
			const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
			c := walcastv1connect.NewBroadcastServiceClient(http.DefaultClient, "http://"+p.APIAddr())
			req := connect.NewRequest(&walcastv1.BroadcastRequest{Type: app.GenericType.String(), Payload: []byte("x"),
				Vchannels: []string{"wal-1/a"}, ResourceKeys: []string{"Collection:db:c@X"}})
			req.Header().Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
			before := appliedOn(t, p, "wal-1")
			if _, err := c.Broadcast(ctx, req); err != nil {
				t.Fatal(err)
			}
			// The broadcast completes once its copy is appended (FastAck,
			// R4.4); the node applies it after that. Its span ends before
			// the node counts the copy applied.
			waitUntil(t, "the node to apply the copy", func() bool { return appliedOn(t, p, "wal-1") > before })
			// Close flushes the batch to the collector.
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			byID := map[string]*tracepb.Span{}
			names := map[string]bool{}
			for _, s := range rec.spans {
				if id := bytesHex(s.GetTraceId()); id == traceID {
					byID[bytesHex(s.GetSpanId())] = s
					names[s.GetName()] = true
				}
			}
			// Generic.v1 has no callback; the streaming node's apply joins
			// the trace through the context persisted in the message.
			for _, want := range []string{"walcast.broadcast", "walcast.persist", "walcast.append", "walcast.node.apply", "walcast.tombstone"} {
				if !names[want] {
					t.Errorf("no %s span in the caller's trace; got %v", want, names)
				}
			}
			// Joined: every span's parent is the caller's span or another
			// exported span of the trace.
			for _, s := range byID {
				parent := bytesHex(s.GetParentSpanId())
				if _, ok := byID[parent]; !ok && parent != "00f067aa0ba902b7" {
					t.Errorf("span %s has parent %s, outside the trace", s.GetName(), parent)
				}
			}
			if rec.res["service.name"] != "walcast" || rec.res["service.instance.id"] != "test-instance" || rec.res["service.version"] == "" {
				t.Errorf("resource: %v", rec.res)
			}
			if rec.headers["x-tenant"] != "walcast-test" {
				t.Errorf("headers: %v", rec.headers)
			}
		})
	}
}

func bytesHex(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 2*len(b))
	for i, c := range b {
		out[2*i], out[2*i+1] = digits[c>>4], digits[c&15]
	}
	return string(out)
}
