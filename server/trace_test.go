package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/server/apitest"
)

// TestR9_6_APICallerTraceJoinsBroadcast: a client's traceparent header makes
// the broadcast's spans part of the client's trace (R9.6).
func TestR9_6_APICallerTraceJoinsBroadcast(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	e := apitest.New(t)
	b := e.Open(func(c *broadcast.Config) { c.TracerProvider = tp })
	srv := apitest.Serve(t, app.StaticLeader(b), nil)
	c := walcastv1connect.NewBroadcastServiceClient(http.DefaultClient, srv.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	req := connect.NewRequest(&walcastv1.BroadcastRequest{Type: apitest.Create.String(), Vchannels: []string{"wal-1/a"},
		ResourceKeys: []string{"Collection:db:c@X"}})
	req.Header().Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	if _, err := c.Broadcast(ctx, req); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID().String() != traceID {
			t.Errorf("span %s in trace %s, want the caller's %s", s.Name(), s.SpanContext().TraceID(), traceID)
		}
		names[s.Name()] = true
	}
	for _, want := range []string{"walcast.broadcast", "walcast.persist", "walcast.append", "walcast.callback", "walcast.tombstone"} {
		if !names[want] {
			t.Errorf("no %s span; got %v", want, names)
		}
	}
}
