package broadcast_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/tracing"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// newTracer returns an SDK tracer provider that records every span.
func newTracer(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, sr
}

func withTracer(tp trace.TracerProvider) func(*broadcast.Config) {
	return func(c *broadcast.Config) { c.TracerProvider = tp }
}

func spansNamed(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func oneSpan(t *testing.T, spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	got := spansNamed(spans, name)
	if len(got) != 1 {
		t.Fatalf("%d spans named %s, want 1", len(got), name)
	}
	return got[0]
}

func spanAttr(s sdktrace.ReadOnlySpan, k attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// registerTraced registers a type whose callback reports its context and
// starts an application span under it.
func registerTraced(t *testing.T, e *env, tp trace.TracerProvider, typ message.Type, fn func(ctx context.Context) error) {
	t.Helper()
	e.types.MustRegister(message.TypeInfo{Type: typ})
	if err := broadcast.OnAck(e.cbs, typ, broadcast.Raw(), func(ctx context.Context, _ *broadcast.TypedEvent[[]byte]) error {
		_, span := tp.Tracer("app").Start(ctx, "app.callback-work")
		defer span.End()
		return fn(ctx)
	}); err != nil {
		t.Fatal(err)
	}
}

// TestR9_6_TraceJoinsCaller: one broadcast yields walcast.broadcast under the
// caller's span, and persist, append, callback and tombstone spans under
// walcast.broadcast, all in the caller's trace; the callback's context
// carries its span; the trace context is persisted with the task and travels
// in every WAL copy.
func TestR9_6_TraceJoinsCaller(t *testing.T) {
	tp, sr := newTracer(t)
	e := newEnv(t)
	typ := message.Type{Name: "Traced", Version: 1}
	registerTraced(t, e, tp, typ, func(ctx context.Context) error {
		if ctx.Done() == nil {
			return errors.New("callback context lost the broadcaster's cancellation")
		}
		return nil
	})
	b := e.open(withTracer(tp))

	ctx, caller := tp.Tracer("test").Start(ctxT(t, 10*time.Second), "caller")
	res, err := do(ctx, b, msgOf(t, typ, "p", []message.VChannel{vch(1, "a"), vch(2, "b")}), resource.ExclusiveCollection("db", "c"))
	caller.End()
	if err != nil {
		t.Fatal(err)
	}
	spans := sr.Ended()
	want := caller.SpanContext()
	bs := oneSpan(t, spans, tracing.SpanBroadcast)
	if bs.Parent().SpanID() != want.SpanID() {
		t.Errorf("walcast.broadcast's parent is %s, want the caller's span %s", bs.Parent().SpanID(), want.SpanID())
	}
	for _, name := range []string{tracing.SpanPersist, tracing.SpanAppend, tracing.SpanCallback, tracing.SpanTombstone} {
		s := oneSpan(t, spans, name)
		if s.Parent().SpanID() != bs.SpanContext().SpanID() {
			t.Errorf("%s's parent is %s, want walcast.broadcast %s", name, s.Parent().SpanID(), bs.SpanContext().SpanID())
		}
		if v, _ := spanAttr(s, tracing.AttrBroadcastID); v.AsInt64() != int64(res.BroadcastID) {
			t.Errorf("%s: broadcast id %v, want %d", name, v.String(), res.BroadcastID)
		}
		if s.Status().Code == codes.Error {
			t.Errorf("%s failed: %s", name, s.Status().Description)
		}
	}
	for _, s := range spans {
		if s.SpanContext().TraceID() != want.TraceID() {
			t.Errorf("span %s is in trace %s, want the caller's %s", s.Name(), s.SpanContext().TraceID(), want.TraceID())
		}
	}
	app := oneSpan(t, spans, "app.callback-work")
	if cb := oneSpan(t, spans, tracing.SpanCallback); app.Parent().SpanID() != cb.SpanContext().SpanID() {
		t.Errorf("the application's span does not nest under walcast.callback")
	}
	if v, _ := spanAttr(oneSpan(t, spans, tracing.SpanCallback), tracing.AttrAttempt); v.AsInt64() != 1 {
		t.Errorf("callback attempt attribute = %v, want 1", v.String())
	}
	for k, want := range map[attribute.Key]attribute.Value{
		tracing.AttrBroadcastID: attribute.Int64Value(int64(res.BroadcastID)),
		tracing.AttrMessageType: attribute.StringValue("Traced.v1"),
		tracing.AttrVChannels:   attribute.IntValue(3), // control channel included
		tracing.AttrDuplicate:   attribute.BoolValue(false),
	} {
		if got, ok := spanAttr(bs, k); !ok || got != want {
			t.Errorf("walcast.broadcast %s = %v, want %v", k, got.String(), want.String())
		}
	}

	// Persisted with the task, and in every copy.
	ti, err := b.Task(res.BroadcastID)
	if err != nil {
		t.Fatal(err)
	}
	if sc := tracing.SpanContext(ti.Message); sc.TraceID() != want.TraceID() || sc.SpanID() != bs.SpanContext().SpanID() {
		t.Errorf("persisted trace context %q does not name walcast.broadcast", ti.Message.TraceParent)
	}
	n := 0
	for _, p := range pchans {
		for off, data := range e.log.Entries(p) {
			cs, err := wal.Decode(uint64(off), data)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				if c.Message.Broadcast.ID != res.BroadcastID {
					continue
				}
				n++
				if c.Message.TraceParent != ti.Message.TraceParent {
					t.Errorf("copy on %s carries trace context %q, want %q", c.VChannel, c.Message.TraceParent, ti.Message.TraceParent)
				}
				// What a streaming node does with a copy.
				nctx := tracing.ContextFromMessage(context.Background(), c.Message)
				if trace.SpanContextFromContext(nctx).TraceID() != want.TraceID() {
					t.Errorf("ContextFromMessage on a copy does not join the caller's trace")
				}
			}
		}
	}
	if n != 3 {
		t.Errorf("found %d copies, want 3", n)
	}
}

// TestR9_6_TraceRecordsFailures: a failed append round is an event of the
// append span, and each callback attempt is its own span, a failed one
// with status Error.
func TestR9_6_TraceRecordsFailures(t *testing.T) {
	tp, sr := newTracer(t)
	e := newEnv(t)
	typ := message.Type{Name: "Flaky", Version: 1}
	var fails atomic.Int32
	fails.Store(1)
	registerTraced(t, e, tp, typ, func(context.Context) error {
		if fails.Add(-1) >= 0 {
			return errors.New("injected callback failure")
		}
		return nil
	})
	b := e.open(withTracer(tp))
	e.log.FailNext("wal-2", 1, wmem.Fault{Fail: true})

	ctx, caller := tp.Tracer("test").Start(ctxT(t, 10*time.Second), "caller")
	_, err := do(ctx, b, msgOf(t, typ, "p", []message.VChannel{vch(2, "a")}), resource.ExclusiveCollection("db", "c"))
	caller.End()
	if err != nil {
		t.Fatal(err)
	}
	spans := sr.Ended()
	app := oneSpan(t, spans, tracing.SpanAppend)
	found := false
	for _, ev := range app.Events() {
		for _, kv := range ev.Attributes {
			if kv.Key == tracing.AttrPChannel && kv.Value.AsString() == "wal-2" {
				found = true
			}
		}
	}
	if !found || app.Status().Code == codes.Error {
		t.Errorf("append span: events %+v, status %+v; want a wal-2 failure event and no error status", app.Events(), app.Status())
	}
	cbs := spansNamed(spans, tracing.SpanCallback)
	if len(cbs) != 2 {
		t.Fatalf("%d callback spans, want 2", len(cbs))
	}
	for i, s := range cbs {
		attempt, _ := spanAttr(s, tracing.AttrAttempt)
		if attempt.AsInt64() != int64(i+1) {
			t.Errorf("callback span %d: attempt %v", i, attempt.String())
		}
		if wantErr := i == 0; (s.Status().Code == codes.Error) != wantErr {
			t.Errorf("callback attempt %d: status %+v", i+1, s.Status())
		}
		if s.SpanContext().TraceID() != caller.SpanContext().TraceID() {
			t.Errorf("callback attempt %d is not in the caller's trace", i+1)
		}
	}
}

// TestR9_6_CallbackAfterRestartJoinsCallerTrace: the broadcaster stops while
// a callback runs; a new broadcaster, with a tracer provider of its own (as a
// new process has), recovers the task from the catalog and its callback
// span is still in the original caller's trace, under walcast.broadcast.
func TestR9_6_CallbackAfterRestartJoinsCallerTrace(t *testing.T) {
	tp1, sr1 := newTracer(t)
	tp2, sr2 := newTracer(t)
	e := newEnv(t)
	typ := message.Type{Name: "Blocking", Version: 1}
	var block atomic.Bool
	block.Store(true)
	started := make(chan struct{}, 1)
	registerTraced(t, e, tp2, typ, func(ctx context.Context) error {
		if block.Load() {
			started <- struct{}{}
			<-ctx.Done() // the broadcaster's cancellation reaches the callback
			return ctx.Err()
		}
		return nil
	})
	b1 := e.open(withTracer(tp1))

	ctx, caller := tp1.Tracer("test").Start(ctxT(t, 10*time.Second), "caller")
	errc := make(chan error, 1)
	go func() {
		_, err := do(ctx, b1, msgOf(t, typ, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c"))
		errc <- err
	}()
	<-started
	_ = b1.Close()
	if err := <-errc; err == nil || broadcast.IsTaskNotCreated(err) {
		t.Fatalf("broadcast interrupted after its task was created returned %v", err)
	}
	caller.End()
	bs := oneSpan(t, sr1.Ended(), tracing.SpanBroadcast)
	if cb := oneSpan(t, sr1.Ended(), tracing.SpanCallback); cb.Status().Code != codes.Error {
		t.Errorf("interrupted callback span status %+v, want Error", cb.Status())
	}

	block.Store(false)
	b2 := e.open(withTracer(tp2))
	waitIdle(t, b2)
	spans := sr2.Ended()
	cb := oneSpan(t, spans, tracing.SpanCallback)
	if got, want := cb.SpanContext().TraceID(), caller.SpanContext().TraceID(); got != want {
		t.Fatalf("recovered callback span is in trace %s, want the caller's %s", got, want)
	}
	if cb.Parent().SpanID() != bs.SpanContext().SpanID() || !cb.Parent().IsRemote() {
		t.Errorf("recovered callback span's parent %v, want the (remote) walcast.broadcast span %s", cb.Parent(), bs.SpanContext().SpanID())
	}
	for _, name := range []string{tracing.SpanAppend, tracing.SpanTombstone} {
		if s := oneSpan(t, spans, name); s.SpanContext().TraceID() != caller.SpanContext().TraceID() {
			t.Errorf("recovered %s span is not in the caller's trace", name)
		}
	}
	// The application's spans of both attempts (the application's tracer
	// outlived the broadcaster) nest under their callback spans.
	for _, s := range spansNamed(spans, "app.callback-work") {
		if s.SpanContext().TraceID() != caller.SpanContext().TraceID() {
			t.Errorf("application span of a callback attempt is not in the caller's trace")
		}
	}
	if n := len(spansNamed(spans, tracing.SpanPersist)); n != 0 {
		t.Errorf("recovery persisted the task again (%d persist spans)", n)
	}
}

// TestR9_6_CallerTraceContextKept: a trace context the caller put in the
// message is persisted as is and parents the task's spans; the broadcast
// span stays in the caller's context trace and links to it.
func TestR9_6_CallerTraceContextKept(t *testing.T) {
	const (
		parent  = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		state   = "vendor=opaque"
		traceID = "0af7651916cd43dd8448eb211c80319c"
		spanID  = "b7ad6b7169203331"
	)
	tp, sr := newTracer(t)
	e := newEnv(t)
	b := e.open(withTracer(tp))
	for _, withCallerSpan := range []bool{true, false} {
		sr.Reset()
		ctx := ctxT(t, 10*time.Second)
		var caller trace.Span
		if withCallerSpan {
			ctx, caller = tp.Tracer("test").Start(ctx, "caller")
		}
		m := msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")})
		m.TraceParent, m.TraceState = parent, state
		res, err := do(ctx, b, m, resource.ExclusiveCollection("db", "c"))
		if err != nil {
			t.Fatal(err)
		}
		if m.TraceParent != parent {
			t.Fatalf("the caller's message was modified")
		}
		ti, err := b.Task(res.BroadcastID)
		if err != nil {
			t.Fatal(err)
		}
		if ti.Message.TraceParent != parent || ti.Message.TraceState != state {
			t.Errorf("persisted trace context %q / %q, want the caller's %q / %q", ti.Message.TraceParent, ti.Message.TraceState, parent, state)
		}
		spans := sr.Ended()
		cb := oneSpan(t, spans, tracing.SpanCallback)
		if cb.SpanContext().TraceID().String() != traceID || cb.Parent().SpanID().String() != spanID {
			t.Errorf("callback span in %s under %s, want %s under %s", cb.SpanContext().TraceID(), cb.Parent().SpanID(), traceID, spanID)
		}
		if cb.SpanContext().TraceState().Get("vendor") != "opaque" {
			t.Errorf("callback span lost the tracestate: %q", cb.SpanContext().TraceState())
		}
		bs := oneSpan(t, spans, tracing.SpanBroadcast)
		if withCallerSpan {
			caller.End()
			if bs.SpanContext().TraceID() != caller.SpanContext().TraceID() {
				t.Errorf("broadcast span left the caller's context trace")
			}
			if l := bs.Links(); len(l) != 1 || l[0].SpanContext.TraceID().String() != traceID {
				t.Errorf("broadcast span links %+v, want one to the message's trace", l)
			}
		} else if bs.Parent().SpanID().String() != spanID {
			t.Errorf("without a caller span, walcast.broadcast should join the message's trace context; parent %s", bs.Parent().SpanID())
		}
	}
}

// TestR9_6_RawIdempotencyKeyNeverInSpans: spans carry the key's fingerprint,
// never the key.
func TestR9_6_RawIdempotencyKeyNeverInSpans(t *testing.T) {
	const raw = "raw-client-key-do-not-leak-42"
	tp, sr := newTracer(t)
	e := newEnv(t)
	b := e.open(withTracer(tp))
	key := message.CollectionKey(7, raw)
	run := func() *broadcast.Result {
		ctx, caller := tp.Tracer("test").Start(ctxT(t, 10*time.Second), "caller")
		defer caller.End()
		h, err := b.WithIdempotentResourceKeys(ctx, broadcast.Idempotent{Type: typCreate, Key: key}, resource.ExclusiveCollection("db", "c"))
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		res, err := h.Broadcast(ctx, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}, message.WithIdempotencyKey(key)))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	first, retry := run(), run()
	if retry.Duplicated == nil {
		t.Fatal("retry was not a duplicate")
	}
	var text []string
	for _, s := range sr.Ended() {
		text = append(text, s.Name(), s.Status().Description)
		for _, kv := range s.Attributes() {
			text = append(text, string(kv.Key), kv.Value.String())
		}
		for _, ev := range s.Events() {
			text = append(text, ev.Name)
			for _, kv := range ev.Attributes {
				text = append(text, string(kv.Key), kv.Value.String())
			}
		}
	}
	if all := strings.Join(text, "\n"); strings.Contains(all, raw) {
		t.Errorf("a span carries the raw idempotency key:\n%s", all)
	}
	bss := spansNamed(sr.Ended(), tracing.SpanBroadcast)
	if len(bss) != 2 {
		t.Fatalf("%d broadcast spans, want 2", len(bss))
	}
	for i, s := range bss {
		if fp, _ := spanAttr(s, tracing.AttrKeyFingerprint); fp.AsString() != key.Fingerprint() {
			t.Errorf("broadcast span %d: key fingerprint %q, want %q", i, fp.AsString(), key.Fingerprint())
		}
		dup, _ := spanAttr(s, tracing.AttrDuplicate)
		id, _ := spanAttr(s, tracing.AttrBroadcastID)
		if dup.AsBool() != (i == 1) || id.AsInt64() != int64(first.BroadcastID) {
			t.Errorf("broadcast span %d: duplicate=%v id=%v, want %v / %d", i, dup.AsBool(), id.AsInt64(), i == 1, first.BroadcastID)
		}
	}
}

// TestR9_6_NoTraceContextWithoutSpan: with the default (no-op) provider and
// a caller without a span, nothing is injected into the message.
func TestR9_6_NoTraceContextWithoutSpan(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	res, err := do(ctxT(t, 10*time.Second), b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	ti, err := b.Task(res.BroadcastID)
	if err != nil {
		t.Fatal(err)
	}
	if ti.Message.TraceParent != "" || ti.Message.TraceState != "" {
		t.Errorf("untraced broadcast persisted trace context %q / %q", ti.Message.TraceParent, ti.Message.TraceState)
	}
}

// TestR9_6_GlobalProviderInstalledAfterNew: a broadcaster on the default
// (global) provider skips its spans while none is installed, and traces
// once an application installs one, also after New.
func TestR9_6_GlobalProviderInstalledAfterNew(t *testing.T) {
	if !strings.HasSuffix(fmt.Sprintf("%T", otel.GetTracerProvider()), "global.tracerProvider") {
		t.Skip("a provider was installed earlier in this process (-count > 1): only otel's first, delegating, global provider forwards to one installed later")
	}
	e := newEnv(t)
	b := e.open() // no TracerProvider: the global one
	ctx := ctxT(t, 10*time.Second)
	if _, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c")); err != nil {
		t.Fatal(err)
	}
	tp, sr := newTracer(t)
	otel.SetTracerProvider(tp) // for the rest of the process: shut down at the end of the test
	if _, err := do(ctx, b, msgOf(t, typCreate, "q", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c")); err != nil {
		t.Fatal(err)
	}
	oneSpan(t, sr.Ended(), tracing.SpanBroadcast)
}

// BenchmarkBroadcastTraced is BenchmarkBroadcast with a recording SDK tracer
// provider (no exporter) and a caller span: the cost of tracing when on.
func BenchmarkBroadcastTraced(b *testing.B) {
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	e := newEnv(b)
	bc := e.open(withTracer(tp))
	ctx, caller := tp.Tracer("bench").Start(context.Background(), "caller")
	defer caller.End()
	m, _ := message.NewBroadcast(typPlain, []byte("payload"), benchTargets)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := do(ctx, bc, m, resource.ExclusiveCollection("db", "c")); err != nil {
			b.Fatal(err)
		}
	}
}

// TestR9_10_EngineLogsCarryTheCallersTrace: the records the engine logs
// about a traced broadcast — its stages, a failed callback attempt, its
// completion — carry the caller's trace_id (and a span_id), so that they
// join the trace like records logged with a traced context.
func TestR9_10_EngineLogsCarryTheCallersTrace(t *testing.T) {
	tp, _ := newTracer(t)
	var buf strings.Builder
	var mu sync.Mutex
	e := newEnv(t)
	typ := message.Type{Name: "FlakyLogged", Version: 1}
	var fails atomic.Int32
	fails.Store(1)
	registerTraced(t, e, tp, typ, func(context.Context) error {
		if fails.Add(-1) >= 0 {
			return errors.New("injected callback failure")
		}
		return nil
	})
	b := e.open(withTracer(tp), func(c *broadcast.Config) { c.Logger = newBufLogger(&buf, &mu) })
	ctx, caller := tp.Tracer("test").Start(ctxT(t, 10*time.Second), "caller")
	res, err := do(ctx, b, msgOf(t, typ, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c"))
	caller.End()
	if err != nil {
		t.Fatal(err)
	}
	want := caller.SpanContext().TraceID().String()
	mu.Lock()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	mu.Unlock()
	seen := map[string]bool{}
	for _, l := range lines {
		var r map[string]any
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		if r["broadcast"] != float64(res.BroadcastID) {
			continue
		}
		msg, _ := r["msg"].(string)
		if r["trace_id"] != want || r["span_id"] == nil || r["span_id"] == "" {
			t.Errorf("%q: trace_id %v span_id %v, want the caller's trace %s", msg, r["trace_id"], r["span_id"], want)
		}
		seen[msg] = true
	}
	for _, m := range []string{"task stage", "ack callback failed; retrying", "task completed"} {
		if !seen[m] {
			t.Errorf("no %q record for broadcast %d", m, res.BroadcastID)
		}
	}
}
