package auth

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/walcast/walcast/message"
)

// Audit writes the audit log (R9.8): one JSON object per line, on a stream
// of its own, for every call refused (by the middleware or by a handler,
// such as a missing metadata privilege) and every admin action (a
// procedure whose role is Admin), with who, the RPC, its target, the result
// and the caller's trace id. It never writes a secret: no token, no
// payload, no raw idempotency key (only its fingerprint, R7.7). A nil
// *Audit writes nothing.
//
// A line looks like
//
//	{"time":"...","msg":"call","rpc":"/walcast.api.v1.BroadcastService/CompleteCallback",
//	 "who":"ops","auth":"token","role":"admin","token_id":"3f...","remote":"127.0.0.1:5312",
//	 "target":{"id":7,"reason":"stuck on a dropped index"},"result":"ok","trace_id":"4bf9...","duration_ms":3.2}
type Audit struct {
	log *slog.Logger
}

// NewAudit returns an audit log writing JSON lines to w.
func NewAudit(w io.Writer) *Audit {
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.LevelKey {
			return slog.Attr{} // every record is an audit record
		}
		return a
	}})
	return &Audit{log: slog.New(h)}
}

// Record writes an action taken outside the RPCs, such as an admin button
// of the web console: who, the action (its path), the result ("ok",
// "unauthenticated", "permission_denied", ...) and, unless ok, why
// (detail). Refusals are written as "refused", the rest as "call", like
// the RPCs' lines.
func (a *Audit) Record(r *http.Request, who Identity, action, result, detail string) {
	if a == nil {
		return
	}
	attrs := []slog.Attr{slog.String("rpc", action)}
	attrs = append(attrs, whoAttrs(who)...)
	attrs = append(attrs, slog.String("remote", r.RemoteAddr), slog.String("result", result))
	if detail != "" {
		attrs = append(attrs, slog.String("error", detail))
	}
	if t := traceID(r.Context(), r.Header); t != "" {
		attrs = append(attrs, slog.String("trace_id", t))
	}
	msg := "call"
	if result == connect.CodeUnauthenticated.String() || result == connect.CodePermissionDenied.String() {
		msg = "refused"
	}
	a.log.LogAttrs(r.Context(), slog.LevelInfo, msg, attrs...)
}

// refused records a call the middleware refused; its body was not read, so
// the target is unknown.
func (a *Audit) refused(r *http.Request, id Identity, proc string, code connect.Code, err error) {
	if a == nil {
		return
	}
	attrs := []slog.Attr{slog.String("rpc", proc)}
	attrs = append(attrs, whoAttrs(id)...)
	attrs = append(attrs, slog.String("remote", r.RemoteAddr), slog.String("result", code.String()),
		slog.String("error", err.Error()))
	if t := traceID(r.Context(), r.Header); t != "" {
		attrs = append(attrs, slog.String("trace_id", t))
	}
	a.log.LogAttrs(context.Background(), slog.LevelInfo, "refused", attrs...)
}

func whoAttrs(id Identity) []slog.Attr {
	who := id.Name
	if who == "" {
		who = "anonymous"
	}
	out := []slog.Attr{slog.String("who", who)}
	if id.Method != "" {
		out = append(out, slog.String("auth", string(id.Method)))
	}
	if id.Role != NoRole {
		out = append(out, slog.String("role", id.Role.String()))
	}
	if id.TokenID != "" {
		out = append(out, slog.String("token_id", id.TokenID))
	}
	return out
}

// traceID returns the W3C trace id of the caller's traceparent header, or
// of the span in ctx.
func traceID(ctx context.Context, h http.Header) string {
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(ctx, propagation.HeaderCarrier(h)))
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}

// Interceptor returns the Connect interceptor that records admin actions
// and calls refused by their handlers, with their target (the request's
// fields, see the type's documentation) and result. Give it to every
// service handler of the process. It decides nothing.
func (a *Audit) Interceptor() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if a == nil || req.Spec().IsClient {
				return next(ctx, req)
			}
			start := time.Now()
			res, err := next(ctx, req)
			proc := req.Spec().Procedure
			role, _ := Required(proc)
			code := connect.CodeOf(err)
			if err == nil && role != Admin || err != nil && role != Admin && code != connect.CodePermissionDenied && code != connect.CodeUnauthenticated {
				return res, err
			}
			id, _ := FromContext(ctx)
			attrs := []slog.Attr{slog.String("rpc", proc)}
			attrs = append(attrs, whoAttrs(id)...)
			attrs = append(attrs, slog.String("remote", req.Peer().Addr))
			if m, ok := req.Any().(proto.Message); ok {
				if t := targetAttrs(m.ProtoReflect(), 0); len(t) > 0 {
					attrs = append(attrs, slog.Any("target", slog.GroupValue(t...)))
				}
			}
			result := "ok"
			if err != nil {
				result = code.String()
			}
			attrs = append(attrs, slog.String("result", result))
			if err != nil {
				msg := err.Error()
				if ce := new(connect.Error); errors.As(err, &ce) {
					msg = ce.Message()
				}
				attrs = append(attrs, slog.String("error", msg))
			}
			if t := traceID(ctx, req.Header()); t != "" {
				attrs = append(attrs, slog.String("trace_id", t))
			}
			attrs = append(attrs, slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000))
			a.log.LogAttrs(ctx, slog.LevelInfo, "call", attrs...)
			return res, err
		}
	})
}

// Bounds of what a target shows of a request.
const (
	maxTargetString = 256
	maxTargetList   = 16
	maxTargetDepth  = 2
)

// targetAttrs lists the set fields of a request: scalars as they are
// (strings cut at 256 bytes), idempotency keys as fingerprints, bytes
// fields and maps by size only (payloads are not the audit log's business),
// lists of up to 16 items, nested messages two levels deep.
func targetAttrs(m protoreflect.Message, depth int) []slog.Attr {
	var out []slog.Attr
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := string(fd.Name())
		switch {
		case fd.IsMap():
			out = append(out, slog.Int(name+"_count", v.Map().Len()))
		case fd.IsList():
			l := v.List()
			if fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind {
				var items []slog.Attr
				for i := 0; i < l.Len() && i < maxTargetList; i++ {
					if a, ok := scalar(fd, l.Get(i), depth); ok {
						a.Key = strconv.Itoa(i)
						items = append(items, a)
					}
				}
				out = append(out, slog.Any(name, slog.GroupValue(items...)))
			} else {
				var items []any
				for i := 0; i < l.Len() && i < maxTargetList; i++ {
					if a, ok := scalar(fd, l.Get(i), depth); ok {
						items = append(items, a.Value.Any())
					}
				}
				out = append(out, slog.Any(name, items))
			}
			if l.Len() > maxTargetList {
				out = append(out, slog.Int(name+"_count", l.Len()))
			}
		case name == "idempotency_key" && fd.Kind() == protoreflect.StringKind:
			out = append(out, slog.String("idempotency_key_fingerprint", message.IdempotencyKey(v.String()).Fingerprint()))
		case fd.Kind() == protoreflect.BytesKind:
			out = append(out, slog.Int(name+"_bytes", len(v.Bytes())))
		default:
			if a, ok := scalar(fd, v, depth); ok {
				a.Key = name
				out = append(out, a)
			}
		}
		return true
	})
	return out
}

func scalar(fd protoreflect.FieldDescriptor, v protoreflect.Value, depth int) (slog.Attr, bool) {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return slog.String("", clip(v.String())), true
	case protoreflect.BoolKind:
		return slog.Bool("", v.Bool()), true
	case protoreflect.Int32Kind, protoreflect.Int64Kind, protoreflect.Sint32Kind, protoreflect.Sint64Kind,
		protoreflect.Sfixed32Kind, protoreflect.Sfixed64Kind:
		return slog.Int64("", v.Int()), true
	case protoreflect.Uint32Kind, protoreflect.Uint64Kind, protoreflect.Fixed32Kind, protoreflect.Fixed64Kind:
		return slog.Uint64("", v.Uint()), true
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return slog.String("", string(ev.Name())), true
		}
		return slog.Int64("", int64(v.Enum())), true
	case protoreflect.MessageKind, protoreflect.GroupKind:
		if depth >= maxTargetDepth {
			return slog.Attr{}, false
		}
		return slog.Any("", slog.GroupValue(targetAttrs(v.Message(), depth+1)...)), true
	}
	return slog.Attr{}, false
}

func clip(s string) string {
	if len(s) <= maxTargetString {
		return s
	}
	s = s[:maxTargetString]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}
