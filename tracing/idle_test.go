package tracing

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// TestIdleOnlyWhileNothingIsInstalled: spans of otel's global provider are
// idle until a provider is installed; a given provider's, or under a
// recording parent, never are.
func TestIdleOnlyWhileNothingIsInstalled(t *testing.T) {
	global := otel.GetTracerProvider()
	if unsetProvider == nil || global != unsetProvider {
		t.Skip("a provider was installed earlier in this process")
	}
	ctx := context.Background()
	if !Idle(global, ctx) {
		t.Fatal("the global provider with nothing installed is not idle")
	}
	sdk := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	if Idle(sdk, ctx) {
		t.Fatal("a provider of its own is idle")
	}
	parent, span := sdk.Tracer("t").Start(ctx, "parent")
	defer span.End()
	if Idle(global, parent) {
		t.Fatal("idle under a recording parent")
	}
	otel.SetTracerProvider(sdk)
	if Idle(global, ctx) {
		t.Fatal("the global provider is still idle once a provider is installed")
	}
}
