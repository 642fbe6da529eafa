package broadcast

import (
	"context"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/walcast/walcast/internal/tracing"
	"github.com/walcast/walcast/message"
)

// Tracing (R9.6). Handle.Broadcast starts a span from the caller's context
// and injects its W3C context into the message before the task is persisted,
// unless the message already carries one. Every later span of the task
// (persist, append, callback, tombstone) is a child of the context persisted
// in the message (task.trace), never of a caller's context: recovery has
// none, and a callback after a restart must still join the caller's trace.
//
// Cost: a task whose message carries no trace context starts no span at all,
// and attributes are only built for recording spans, so with the default
// no-op provider the untraced path pays for the broadcast span alone (what
// otel's no-op Start costs).

// noSpan is the no-op span of a task without trace context.
var noSpan = trace.SpanFromContext(context.Background())

// startBroadcastSpan starts the span of one Broadcast call. A caller without
// a span of its own but with a trace context in msg joins that one; a caller
// with both links to the message's.
func (b *Broadcaster) startBroadcastSpan(ctx context.Context, msg *message.Message, dup bool) (context.Context, trace.Span) {
	parent := ctx
	var opts []trace.SpanStartOption
	if msg != nil && msg.TraceParent != "" {
		if trace.SpanContextFromContext(ctx).IsValid() {
			if sc := tracing.SpanContext(msg); sc.IsValid() {
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
			}
		} else {
			parent = tracing.ContextFromMessage(ctx, msg)
		}
	}
	ctx, span := b.tracer.Start(parent, tracing.SpanBroadcast, opts...)
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrDuplicate.Bool(dup))
		if msg != nil {
			span.SetAttributes(tracing.MessageAttributes(msg)...)
		}
	}
	return ctx, span
}

// endBroadcastSpan ends a Broadcast call's span with its result.
func endBroadcastSpan(span trace.Span, res *Result, err error) {
	if span.IsRecording() && res != nil {
		span.SetAttributes(tracing.AttrBroadcastID.Int64(int64(res.BroadcastID)))
	}
	endSpan(span, err)
}

// startTaskSpan starts span name as a child of the trace context persisted
// in t's message, keeping ctx's cancellation. A task without trace context
// gets no span.
func (b *Broadcaster) startTaskSpan(ctx context.Context, t *task, name string) (context.Context, trace.Span) {
	if !t.trace.IsValid() {
		return ctx, noSpan
	}
	ctx, span := b.tracer.Start(trace.ContextWithRemoteSpanContext(ctx, t.trace), name)
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrMessageType.String(t.msg.Type.String()),
			tracing.AttrBroadcastID.Int64(int64(t.id)))
	}
	return ctx, span
}

// recordRetry records a failure that will be retried as an exception event,
// without failing the span.
func recordRetry(span trace.Span, err error, opts ...trace.EventOption) {
	if span.IsRecording() {
		span.RecordError(err, opts...)
	}
}

// endSpan ends span, failing it with err if err is not nil.
func endSpan(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// endStopped ends a span whose work the broadcaster's shutdown interrupted;
// recovery resumes the work under a new span of the same trace.
func endStopped(span trace.Span) {
	if span.IsRecording() {
		span.AddEvent("broadcaster stopped; recovery resumes the task")
	}
	span.End()
}

// endPersistSpan ends the persist span: a task aborted before its record was
// durable fails it.
func endPersistSpan(span trace.Span, t *task, ok bool) {
	var err error
	if !ok && span.IsRecording() {
		t.mu.Lock()
		err = t.err
		t.mu.Unlock()
		if err == nil {
			endStopped(span)
			return
		}
	}
	endSpan(span, err)
}
