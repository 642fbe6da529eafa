package tracing_test

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/tracing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	state  = "vendor=opaque"
)

func spanCtx(t *testing.T) trace.SpanContext {
	t.Helper()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ts, err := trace.ParseTraceState(state)
	if err != nil {
		t.Fatal(err)
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts})
}

func TestInjectExtractRoundTrip(t *testing.T) {
	sc := spanCtx(t)
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	m := &message.Message{TraceState: "stale=1"}
	if !tracing.Inject(ctx, m) {
		t.Fatal("Inject wrote nothing")
	}
	if m.TraceParent != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" || m.TraceState != state {
		t.Errorf("injected %q / %q", m.TraceParent, m.TraceState)
	}
	got := tracing.SpanContext(m)
	if !got.IsRemote() || got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() || !got.IsSampled() || got.TraceState().String() != state {
		t.Errorf("extracted %+v, want %+v (remote)", got, sc)
	}
	// Survives the durable encoding, as the catalog and the WAL store it.
	raw, err := message.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	back, err := message.Unmarshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !tracing.SpanContext(back).Equal(got) {
		t.Errorf("after Marshal/Unmarshal: %+v, want %+v", tracing.SpanContext(back), got)
	}
}

func TestInjectKeepsExistingContext(t *testing.T) {
	ctx := trace.ContextWithSpanContext(context.Background(), spanCtx(t))
	m := &message.Message{TraceParent: parent}
	if tracing.Inject(ctx, m) || m.TraceParent != parent || m.TraceState != "" {
		t.Errorf("Inject overwrote a caller's trace context: %q / %q", m.TraceParent, m.TraceState)
	}
}

func TestInjectWithoutSpanWritesNothing(t *testing.T) {
	m := &message.Message{}
	if tracing.Inject(context.Background(), m) || m.TraceParent != "" || m.TraceState != "" {
		t.Errorf("Inject without a span wrote %q / %q", m.TraceParent, m.TraceState)
	}
	if tracing.Inject(context.Background(), nil) {
		t.Error("Inject into nil reported a write")
	}
}

func TestContextFromMessage(t *testing.T) {
	type key struct{}
	base, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	defer cancel()
	m := &message.Message{TraceParent: parent, TraceState: state}
	ctx := tracing.ContextFromMessage(base, m)
	sc := trace.SpanContextFromContext(ctx)
	if sc.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || sc.SpanID().String() != "b7ad6b7169203331" || !sc.IsRemote() {
		t.Errorf("ContextFromMessage: %+v", sc)
	}
	if ctx.Value(key{}) != "v" {
		t.Error("ContextFromMessage lost ctx's values")
	}
	cancel()
	if ctx.Err() == nil {
		t.Error("ContextFromMessage lost ctx's cancellation")
	}

	for _, bad := range []*message.Message{nil, {}, {TraceParent: "garbage"}, {TraceParent: "00-00000000000000000000000000000000-b7ad6b7169203331-01"}} {
		if got := tracing.ContextFromMessage(base, bad); got != base {
			t.Errorf("ContextFromMessage(%+v) changed ctx", bad)
		}
		if tracing.SpanContext(bad).IsValid() {
			t.Errorf("SpanContext(%+v) is valid", bad)
		}
	}
}

func TestCarrier(t *testing.T) {
	m := &message.Message{}
	var c propagation.TextMapCarrier = tracing.Carrier{Message: m}
	c.Set("traceparent", parent)
	c.Set("tracestate", state)
	c.Set("baggage", "ignored")
	if m.TraceParent != parent || m.TraceState != state || c.Get("baggage") != "" {
		t.Errorf("carrier: %+v", m)
	}
	if got := strings.Join(c.Keys(), ","); got != "traceparent,tracestate" {
		t.Errorf("Keys = %s", got)
	}
	// It holds exactly what the W3C propagator uses.
	if got := strings.Join(propagation.TraceContext{}.Fields(), ","); got != "traceparent,tracestate" {
		t.Errorf("TraceContext fields = %s", got)
	}
}

func TestMessageAttributesFingerprintOnly(t *testing.T) {
	const raw = "raw-client-key"
	m := &message.Message{
		Type: message.Type{Name: "CreateIndex", Version: 2}, IdempotencyKey: message.CollectionKey(9, raw),
		Broadcast: message.BroadcastHeader{ID: 42, VChannels: []message.VChannel{"wal-0/a", "wal-0/_control"}},
	}
	got := map[string]string{}
	for _, kv := range tracing.MessageAttributes(m) {
		got[string(kv.Key)] = kv.Value.String()
		if strings.Contains(kv.Value.String(), raw) {
			t.Errorf("attribute %s carries the raw key", kv.Key)
		}
	}
	want := map[string]string{
		"walcast.message.type": "CreateIndex.v2", "walcast.broadcast.id": "42", "walcast.broadcast.vchannels": "2",
		"walcast.idempotency.key_fp": m.IdempotencyKey.Fingerprint(),
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("attributes %v, want %v", got, want)
	}
	if tracing.MessageAttributes(nil) != nil {
		t.Error("attributes of nil")
	}
}
