package embedetcd

import (
	"context"
	"log/slog"
	"maps"
	"slices"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// ZapLogger returns a zap logger that passes warnings and errors to l, as
// records of l's own handler (so in l's format, JSON or text, with
// component=etcd), and drops everything when l is nil. Give it to etcd
// clients (clientv3.Config.Logger), whose default logger writes zap's own
// JSON to stderr.
func ZapLogger(l *slog.Logger) *zap.Logger { return zapLogger(l) }

// zapLogger returns the logger etcd gets: nothing when l is nil, else l for
// warnings and above (etcd's info level logs every start-up detail and slow
// request).
func zapLogger(l *slog.Logger) *zap.Logger {
	if l == nil {
		return zap.NewNop()
	}
	return zap.New(&slogCore{h: l.Handler()})
}

// slogCore is a zapcore.Core writing to a slog.Handler.
type slogCore struct {
	h      slog.Handler
	fields []zapcore.Field
}

func (c *slogCore) Enabled(l zapcore.Level) bool {
	return l >= zapcore.WarnLevel && c.h.Enabled(context.Background(), slogLevel(l))
}

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{h: c.h, fields: append(slices.Clip(c.fields), fields...)}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	r := slog.NewRecord(e.Time, slogLevel(e.Level), e.Message, 0)
	r.AddAttrs(slog.String("component", "etcd"))
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	for _, k := range slices.Sorted(maps.Keys(enc.Fields)) {
		r.AddAttrs(slog.Any(k, enc.Fields[k]))
	}
	return c.h.Handle(context.Background(), r)
}

func (c *slogCore) Sync() error { return nil }

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l >= zapcore.ErrorLevel:
		return slog.LevelError
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	default:
		return slog.LevelDebug
	}
}
