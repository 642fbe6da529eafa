package server

import (
	"context"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/walcast/walcast/message"
)

// TestParseTypeAgreesWithMessageParseType: the API's fast type parser
// accepts exactly what message.ParseType accepts, with the same result, and
// refuses the rest with ParseType's error.
func TestParseTypeAgreesWithMessageParseType(t *testing.T) {
	for _, s := range []string{
		"CreateCollection.v1", "Generic.v0", "a.b.v12", "x.v4294967295", "x.v4294967296", "x.v01", "x.v00",
		"x.v+1", "x.v-1", "x.v", "x.v1a", "x.v 1", ".v1", "v1", "", "x.v1.v2", "x.v2.y", "x.v١",
	} {
		want, wantErr := message.ParseType(s)
		got, err := parseType(s)
		if got != want || (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
			t.Errorf("parseType(%q) = %v, %v; message.ParseType: %v, %v", s, got, err, want, wantErr)
		}
	}
}

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
