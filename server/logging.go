package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"google.golang.org/grpc/grpclog"

	"github.com/walcast/walcast/server/internal/metrics"
)

// SetVersion records the version the binary was stamped with at build time
// (the CLI's -X main.version=...): walcast_build_info and the traces'
// service.version report it. Call it before starting a process.
func SetVersion(v string) { metrics.Stamped = v }

// RouteLogs makes log the one destination of the lines that libraries in the
// process print by themselves: the standard library's log package (through
// slog.SetDefault), OpenTelemetry's internal logger and its error handler (a
// span export that fails: the collector is down or refuses), and gRPC's
// logger (the OTLP/gRPC exporter's and the etcd client's connections). A
// server command calls it once, before it starts anything: gRPC's logger may
// not be replaced while gRPC runs.
func RouteLogs(log *slog.Logger) {
	slog.SetDefault(log)
	otel.SetLogger(logr.FromSlogHandler(log.With("component", "opentelemetry").Handler()))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: exporting spans failed (tracing.otlp.*: is the collector reachable?)", "err", err)
	}))
	grpclog.SetLoggerV2(grpcLogger{log: log.With("component", "grpc")})
}

// grpcLogger is gRPC's logger over slog: warnings and errors pass (gRPC's own
// default), informational lines only at debug level.
type grpcLogger struct{ log *slog.Logger }

func (g grpcLogger) out(l slog.Level, msg string) {
	g.log.Log(context.Background(), l, strings.TrimSpace(msg))
}

func (g grpcLogger) Info(args ...any)   { g.out(slog.LevelDebug, fmt.Sprint(args...)) }
func (g grpcLogger) Infoln(args ...any) { g.out(slog.LevelDebug, fmt.Sprintln(args...)) }
func (g grpcLogger) Infof(format string, args ...any) {
	g.out(slog.LevelDebug, fmt.Sprintf(format, args...))
}
func (g grpcLogger) Warning(args ...any)   { g.out(slog.LevelWarn, fmt.Sprint(args...)) }
func (g grpcLogger) Warningln(args ...any) { g.out(slog.LevelWarn, fmt.Sprintln(args...)) }
func (g grpcLogger) Warningf(format string, args ...any) {
	g.out(slog.LevelWarn, fmt.Sprintf(format, args...))
}
func (g grpcLogger) Error(args ...any)   { g.out(slog.LevelError, fmt.Sprint(args...)) }
func (g grpcLogger) Errorln(args ...any) { g.out(slog.LevelError, fmt.Sprintln(args...)) }
func (g grpcLogger) Errorf(format string, args ...any) {
	g.out(slog.LevelError, fmt.Sprintf(format, args...))
}

// Fatal logs; gRPC exits the process after a Fatal log itself.
func (g grpcLogger) Fatal(args ...any)   { g.out(slog.LevelError, fmt.Sprint(args...)) }
func (g grpcLogger) Fatalln(args ...any) { g.out(slog.LevelError, fmt.Sprintln(args...)) }
func (g grpcLogger) Fatalf(format string, args ...any) {
	g.out(slog.LevelError, fmt.Sprintf(format, args...))
}

// V reports whether gRPC's verbose logs are wanted: never (they would flood
// the process log).
func (g grpcLogger) V(int) bool { return false }
