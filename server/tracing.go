package server

import (
	"context"
	"fmt"
	"os"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// setupTracing installs the process's OpenTelemetry tracer provider from
// tracing.exporter: "none" keeps OpenTelemetry's no-op default; "stdout"
// writes finished spans as JSON to stderr. It returns a function that
// flushes and stops the provider.
func setupTracing(cfg Config) (func() error, error) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	switch cfg.Tracing.Exporter {
	case "none":
		return func() error { return nil }, nil
	case "stdout":
		exp, err := stdouttrace.New(stdouttrace.WithWriter(os.Stderr))
		if err != nil {
			return nil, fmt.Errorf("tracing: %w", err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
		otel.SetTracerProvider(tp)
		return func() error { return tp.Shutdown(context.Background()) }, nil
	}
	return nil, fmt.Errorf("%w: tracing.exporter: %q", ErrConfig, cfg.Tracing.Exporter)
}
