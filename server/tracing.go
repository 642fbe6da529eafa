package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc/credentials"

	"github.com/walcast/walcast/server/internal/metrics"
)

// setupTracing installs the process's OpenTelemetry tracer provider from
// tracing.*: "none" keeps OpenTelemetry's no-op default; "stdout" writes
// finished spans as JSON to stderr; "otlp" exports them to a collector over
// gRPC or HTTP (R9.10). Spans carry the resource service.name=walcast,
// service.instance.id and service.version. It returns a function that
// flushes and stops the provider.
func setupTracing(cfg Config) (func() error, error) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t := cfg.Tracing
	var exp sdktrace.SpanExporter
	var err error
	switch t.Exporter {
	case "none":
		return func() error { return nil }, nil
	case "stdout":
		exp, err = stdouttrace.New(stdouttrace.WithWriter(os.Stderr))
	case "otlp":
		exp, err = otlpExporter(cfg)
	default:
		return nil, fmt.Errorf("%w: tracing.exporter: %q", ErrConfig, t.Exporter)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	version, _ := metrics.Version()
	instance := t.InstanceID
	if instance == "" {
		host, _ := os.Hostname()
		instance = host + "/" + strconv.Itoa(os.Getpid())
	}
	res := resource.NewSchemaless(
		attribute.String("service.name", "walcast"),
		attribute.String("service.instance.id", instance),
		attribute.String("service.version", version),
		attribute.String("walcast.cluster", cfg.Cluster.Name),
	)
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(t.SamplingRatio))))
	otel.SetTracerProvider(tp)
	return func() error { return tp.Shutdown(context.Background()) }, nil
}

// requestTrace is ctx with the W3C trace context of a request's headers
// (traceparent, tracestate), the parent of the spans the request starts
// (R9.6). Most requests carry none: the header map is looked up by the
// canonical name first, where the propagator's Get canonicalizes
// "traceparent" into a new string on every request.
func requestTrace(ctx context.Context, h http.Header) context.Context {
	if len(h["Traceparent"]) == 0 {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.HeaderCarrier(h))
}

// otlpHeaders parses key=value headers.
func otlpHeaders(kvs []string) (map[string]string, error) {
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if k = strings.TrimSpace(k); !ok || k == "" {
			return nil, fmt.Errorf("%q is not key=value", kv)
		}
		out[k] = strings.TrimSpace(v)
	}
	return out, nil
}

func otlpExporter(cfg Config) (sdktrace.SpanExporter, error) {
	o := cfg.Tracing.OTLP
	headers, err := otlpHeaders(o.Headers)
	if err != nil {
		return nil, err
	}
	var tlsCfg *tls.Config
	if !o.Insecure {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
		if o.CAFile != "" {
			pem, err := os.ReadFile(o.CAFile)
			if err != nil {
				return nil, fmt.Errorf("%w: tracing.otlp.ca_file: %w", ErrConfig, err)
			}
			tlsCfg.RootCAs = x509.NewCertPool()
			if !tlsCfg.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("%w: tracing.otlp.ca_file: no PEM certificate in %s", ErrConfig, o.CAFile)
			}
		}
	}
	ctx := context.Background()
	if o.Protocol == "http" {
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(o.Endpoint), otlptracehttp.WithHeaders(headers)}
		if tlsCfg == nil {
			opts = append(opts, otlptracehttp.WithInsecure())
		} else {
			opts = append(opts, otlptracehttp.WithTLSClientConfig(tlsCfg))
		}
		return otlptracehttp.New(ctx, opts...)
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(o.Endpoint), otlptracegrpc.WithHeaders(headers)}
	if tlsCfg == nil {
		opts = append(opts, otlptracegrpc.WithInsecure())
	} else {
		opts = append(opts, otlptracegrpc.WithTLSCredentials(credentials.NewTLS(tlsCfg)))
	}
	return otlptracegrpc.New(ctx, opts...)
}
