package tracing

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// unsetProvider is otel's global tracer provider as it is before any was
// installed (nil if one was installed before this package's init): a
// delegating provider whose spans, until one is set, record nothing and
// carry their parent's span context.
var unsetProvider = func() trace.TracerProvider {
	tp := otel.GetTracerProvider()
	if strings.HasSuffix(fmt.Sprintf("%T", tp), "global.tracerProvider") {
		return tp
	}
	return nil
}()

// Idle reports whether a span that tp starts under parent would record
// nothing and change nothing that a child sees: tp is otel's global
// provider, none has been installed yet, and parent's span (if any) does not
// record. Callers skip such spans, each of which costs otel allocations.
// Once an application installs a provider, also after tp was taken, Idle is
// false.
func Idle(tp trace.TracerProvider, parent context.Context) bool {
	return unsetProvider != nil && tp == unsetProvider &&
		otel.GetTracerProvider() == unsetProvider && !trace.SpanFromContext(parent).IsRecording()
}
