package server

import (
	"context"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// TestRequestTraceReadsTraceparent: a request's traceparent header becomes
// the remote parent of its context (R9.6); without one the context is the
// caller's own.
func TestRequestTraceReadsTraceparent(t *testing.T) {
	ctx := context.Background()
	if got := requestTrace(ctx, http.Header{}); got != ctx {
		t.Fatal("a request without traceparent got a new context")
	}
	h := http.Header{}
	h.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	sc := trace.SpanContextFromContext(requestTrace(ctx, h))
	if !sc.IsRemote() || sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || !sc.IsSampled() {
		t.Fatalf("span context %+v, want the remote parent of the header", sc)
	}
}
