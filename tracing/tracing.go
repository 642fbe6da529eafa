// Package tracing joins walcast's OpenTelemetry spans into one trace per
// broadcast (SPEC R9.6): caller → persist → append → node apply/ack →
// callback, across processes and restarts.
//
// The join point is the W3C trace context stored in the message itself
// (message.Message.TraceParent and TraceState). The broadcaster injects the
// context of its "walcast.broadcast" span before the task is persisted, so
// the context is durable with the task and travels in every WAL copy. Every
// later step — in the coordinator, after a coordinator restart, or in a
// streaming node — extracts it from the message instead of relying on a
// caller's context, which recovery does not have.
//
// # In a streaming node
//
// A consumer that applies a copy starts its span from the message, so the
// apply (and the ack it sends, if the ack RPC propagates ctx) nests under the
// broadcaster's span of the same broadcast:
//
//	ctx, span := tracer.Start(tracing.ContextFromMessage(ctx, c.Message), tracing.SpanNodeApply,
//		trace.WithSpanKind(trace.SpanKindConsumer),
//		trace.WithAttributes(tracing.MessageAttributes(c.Message)...),
//		trace.WithAttributes(tracing.AttrVChannel.String(string(c.VChannel))))
//	defer span.End()
//
// ContextFromMessage keeps ctx's cancellation and values; a message without
// (or with a malformed) trace context leaves ctx unchanged: tracing is never
// a correctness dependency.
//
// Span attributes never carry a raw idempotency key, only its fingerprint
// (R7.7): use MessageAttributes rather than reading the key yourself.
//
// This package depends on the OpenTelemetry API only (trace, attribute,
// propagation), never on the SDK; the message package does not depend on
// OpenTelemetry at all.
package tracing

import (
	"context"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/walcast/walcast/message"
)

// TracerName is the instrumentation name of the broadcast engine's tracer.
const TracerName = "github.com/walcast/walcast/broadcast"

// Span names. The engine's spans after SpanBroadcast are children of the
// trace context persisted in the message, not of the caller's context.
const (
	// SpanBroadcast covers Handle.Broadcast, from the caller's context.
	SpanBroadcast = "walcast.broadcast"
	// SpanPersist covers making the PENDING record durable.
	SpanPersist = "walcast.persist"
	// SpanAppend covers one task's appends, from submission until every copy
	// is in the WAL; failed rounds are recorded as exception events.
	SpanAppend = "walcast.append"
	// SpanCallback covers one ack callback attempt; the callback's context
	// carries it, so application spans nest under it.
	SpanCallback = "walcast.callback"
	// SpanTombstone covers the TOMBSTONE commit (with the callback's staged
	// effects).
	SpanTombstone = "walcast.tombstone"
	// SpanNodeApply is the name a streaming node gives the span of applying
	// (and acking) one copy; see the package documentation.
	SpanNodeApply = "walcast.node.apply"
)

// Attribute keys used on walcast spans.
const (
	// AttrMessageType is the message type, as message.Type.String writes it.
	AttrMessageType = attribute.Key("walcast.message.type")
	// AttrBroadcastID is the broadcast id (for a duplicate: the original's).
	AttrBroadcastID = attribute.Key("walcast.broadcast.id")
	// AttrVChannels is the number of target vchannels (control channel
	// included once the message is stamped).
	AttrVChannels = attribute.Key("walcast.broadcast.vchannels")
	// AttrVChannel is the vchannel of one copy.
	AttrVChannel = attribute.Key("walcast.vchannel")
	// AttrPChannel is the pchannel of an append.
	AttrPChannel = attribute.Key("walcast.pchannel")
	// AttrCopies is the number of copies an append span waits for.
	AttrCopies = attribute.Key("walcast.append.copies")
	// AttrKeyFingerprint is the idempotency key's fingerprint; the raw key
	// never appears in a span.
	AttrKeyFingerprint = attribute.Key("walcast.idempotency.key_fp")
	// AttrDuplicate says whether a broadcast resolved to an earlier one.
	AttrDuplicate = attribute.Key("walcast.duplicate")
	// AttrAttempt is the callback attempt number, from 1.
	AttrAttempt = attribute.Key("walcast.callback.attempt")
	// AttrOutcome is the outcome a TOMBSTONE records.
	AttrOutcome = attribute.Key("walcast.outcome")
)

// W3C header names, as propagation.TraceContext reads and writes them.
const (
	traceparent = "traceparent"
	tracestate  = "tracestate"
)

// propagator is the W3C Trace Context propagator. It is used directly, not
// through otel.GetTextMapPropagator: the format is part of walcast's durable
// message, not a process-wide choice.
var propagator propagation.TraceContext

// Carrier adapts a message's TraceParent and TraceState fields to
// propagation.TextMapCarrier. Set writes into the message, so use it only on a
// message nobody else sees yet (a stamped message is immutable).
type Carrier struct {
	Message *message.Message
}

var _ propagation.TextMapCarrier = Carrier{}

// Get returns the value of the traceparent or tracestate field, "" for any
// other key.
func (c Carrier) Get(key string) string {
	switch key {
	case traceparent:
		return c.Message.TraceParent
	case tracestate:
		return c.Message.TraceState
	}
	return ""
}

// Set writes the traceparent or tracestate field; other keys are ignored.
func (c Carrier) Set(key, value string) {
	switch key {
	case traceparent:
		c.Message.TraceParent = value
	case tracestate:
		c.Message.TraceState = value
	}
}

// Keys returns the keys the carrier can hold.
func (c Carrier) Keys() []string { return []string{traceparent, tracestate} }

// Inject writes the trace context of ctx's span into m, unless m already
// carries one (a caller-provided context is kept) or ctx has no valid span
// context. It reports whether it wrote. m must not be shared yet.
func Inject(ctx context.Context, m *message.Message) bool {
	if m == nil || m.TraceParent != "" {
		return false
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return false
	}
	m.TraceState = "" // a tracestate without its traceparent means nothing
	propagator.Inject(ctx, Carrier{m})
	return m.TraceParent != ""
}

// SpanContext returns the remote span context stored in m; it is invalid
// (IsValid false) if m carries none or a malformed one.
func SpanContext(m *message.Message) trace.SpanContext {
	if m == nil || m.TraceParent == "" {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(propagator.Extract(context.Background(), Carrier{m}))
}

// ContextFromMessage returns ctx with m's stored trace context as the
// (remote) parent of spans started from it, replacing any span ctx carried.
// Cancellation, deadline and values of ctx are kept. If m carries no valid
// trace context, ctx is returned unchanged.
func ContextFromMessage(ctx context.Context, m *message.Message) context.Context {
	if m == nil || m.TraceParent == "" {
		return ctx
	}
	return propagator.Extract(ctx, Carrier{m})
}

// MessageAttributes returns the attributes walcast puts on a message's spans:
// type, broadcast id (if stamped), number of target vchannels, and the
// idempotency key's fingerprint (if keyed) — never the raw key.
func MessageAttributes(m *message.Message) []attribute.KeyValue {
	if m == nil {
		return nil
	}
	attrs := make([]attribute.KeyValue, 0, 4)
	// The type as Type.String writes it, without its fmt.Sprintf: a node
	// builds these attributes for every copy it applies, traced or not.
	attrs = append(attrs, AttrMessageType.String(m.Type.Name+".v"+strconv.FormatUint(uint64(m.Type.Version), 10)))
	if id := m.Broadcast.ID; id != 0 {
		attrs = append(attrs, AttrBroadcastID.Int64(int64(id)))
	}
	attrs = append(attrs, AttrVChannels.Int(len(m.Broadcast.VChannels)))
	if m.IdempotencyKey != "" {
		attrs = append(attrs, AttrKeyFingerprint.String(m.IdempotencyKey.Fingerprint()))
	}
	return attrs
}
