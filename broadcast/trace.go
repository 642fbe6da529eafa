package broadcast

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/tracing"
)

// Tracing (R9.6). Handle.Broadcast starts a span from the caller's context
// and injects its W3C context into the message before the task is persisted,
// unless the message already carries one. Every later span of the task
// (persist, append, callback, tombstone) is a child of the context persisted
// in the message, never of a caller's context: recovery has none, and a
// callback after a restart must still join the caller's trace.
//
// The persist, append and tombstone spans follow the task's stages (the
// core tells the driver each move); the callback span is the attempt's,
// started by the worker that runs it so that the callback's context carries
// it.
//
// Cost: a task whose message carries no trace context starts no span at all,
// and attributes are only built for recording spans, so with the default
// no-op provider the untraced path pays for the broadcast span alone (what
// otel's no-op Start costs).

// noSpan is the no-op span of a task without trace context.
var noSpan = trace.SpanFromContext(context.Background())

// spans are the open stage spans of traced tasks.
type spans struct {
	tracer trace.Tracer
	mu     sync.Mutex
	live   map[uint64]*taskSpans
}

type taskSpans struct {
	persist, append, tombstone trace.Span
}

func newSpans(t trace.Tracer) *spans { return &spans{tracer: t, live: make(map[uint64]*taskSpans)} }

// start starts span name as a child of the trace context persisted in m,
// keeping ctx's cancellation. A task without trace context gets no span.
func (s *spans) start(ctx context.Context, id uint64, m *message.Message, name string) (context.Context, trace.Span) {
	sc := tracing.SpanContext(m)
	if !sc.IsValid() {
		return ctx, noSpan
	}
	ctx, span := s.tracer.Start(trace.ContextWithRemoteSpanContext(ctx, sc), name)
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrMessageType.String(m.Type.String()), tracing.AttrBroadcastID.Int64(int64(id)))
	}
	return ctx, span
}

// stage opens and closes the stage spans of task id as it moves.
func (s *spans) stage(id uint64, m *message.Message, from, to engine.Stage) {
	if m.TraceParent == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := s.live[id]
	if ts == nil {
		ts = &taskSpans{}
		s.live[id] = ts
	}
	switch from {
	case engine.Persisting:
		if to == engine.Aborted {
			failSpan(ts.persist, "the PENDING record was not written: the task was not created")
		}
		endSpan(ts.persist, nil)
		ts.persist = nil
	case engine.Appending:
		endSpan(ts.append, nil)
		ts.append = nil
	case engine.Tombstoning:
		endSpan(ts.tombstone, nil)
		ts.tombstone = nil
	}
	switch to {
	case engine.Persisting:
		_, ts.persist = s.start(context.Background(), id, m, tracing.SpanPersist)
	case engine.Appending:
		_, ts.append = s.start(context.Background(), id, m, tracing.SpanAppend)
		if ts.append.IsRecording() {
			ts.append.SetAttributes(tracing.AttrCopies.Int(len(m.Broadcast.VChannels)))
		}
	case engine.Tombstoning:
		_, ts.tombstone = s.start(context.Background(), id, m, tracing.SpanTombstone)
	case engine.Tombstoned, engine.Aborted:
		delete(s.live, id)
	}
}

// written records a failed write of a traced task on its stage's span.
func (s *spans) written(w engine.Write, err error) {
	if err == nil || w.Task == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := s.live[w.Task]
	if ts == nil {
		return
	}
	switch w.Kind {
	case engine.WritePending:
		recordRetry(ts.persist, err)
	case engine.WriteTombstone:
		recordRetry(ts.tombstone, err)
	}
}

// appendFailed records a failed append round on the task's append span.
func (s *spans) appendFailed(id uint64, p message.PChannel, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ts := s.live[id]; ts != nil {
		recordRetry(ts.append, err, trace.WithAttributes(tracing.AttrPChannel.String(string(p))))
	}
}

// closeAll ends the spans of tasks the broadcaster's shutdown interrupted;
// recovery resumes the work under new spans of the same trace.
func (s *spans) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, ts := range s.live {
		for _, sp := range []trace.Span{ts.persist, ts.append, ts.tombstone} {
			if sp != nil {
				endStopped(sp)
			}
		}
		delete(s.live, id)
	}
}

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
	if tracing.Idle(b.cfg.TracerProvider, parent) {
		return ctx, noSpan
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

// recordRetry records a failure that will be retried as an exception event,
// without failing the span.
func recordRetry(span trace.Span, err error, opts ...trace.EventOption) {
	if span != nil && span.IsRecording() {
		span.RecordError(err, opts...)
	}
}

// endSpan ends span, failing it with err if err is not nil.
func endSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

func failSpan(span trace.Span, why string) {
	if span != nil && span.IsRecording() {
		span.SetStatus(codes.Error, why)
	}
}

// endStopped ends a span whose work the broadcaster's shutdown interrupted.
func endStopped(span trace.Span) {
	if span.IsRecording() {
		span.AddEvent("broadcaster stopped; recovery resumes the task")
	}
	span.End()
}
