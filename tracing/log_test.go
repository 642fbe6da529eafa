package tracing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/walcast/walcast/tracing"
)

// TestR9_10_LogRecordsCarryTraceIDs: a record logged with a traced context
// carries its trace and span ids; one without a span carries none.
func TestR9_10_LogRecordsCarryTraceIDs(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(tracing.LogHandler(slog.NewJSONHandler(&buf, nil))).With("component", "test")
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	log.InfoContext(ctx, "traced")
	log.Info("untraced")
	dec := json.NewDecoder(&buf)
	var traced, untraced map[string]any
	if err := dec.Decode(&traced); err != nil {
		t.Fatal(err)
	}
	if err := dec.Decode(&untraced); err != nil {
		t.Fatal(err)
	}
	if traced["trace_id"] != tid.String() || traced["span_id"] != sid.String() || traced["component"] != "test" {
		t.Errorf("traced record: %v", traced)
	}
	if _, ok := untraced["trace_id"]; ok {
		t.Errorf("untraced record has a trace id: %v", untraced)
	}
}
