package embedetcd

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// ZapLogger returns a zap logger that passes warnings and errors to l, as
// records of l's own handler (so in l's format, JSON or text, with
// component=etcd), and drops everything when l is nil. Give it to etcd
// clients (clientv3.Config.Logger), whose default logger writes zap's own
// JSON to stderr.
func ZapLogger(l *slog.Logger) *zap.Logger { return zapLogger(l, nil) }

// zapLogger returns the logger etcd gets: nothing when l is nil, else l for
// warnings and above (etcd's info level logs every start-up detail and slow
// request). With f, etcd's fatal errors go to f.report instead of exiting
// the process silently.
func zapLogger(l *slog.Logger, f *fatal) *zap.Logger {
	var core zapcore.Core = zapcore.NewNopCore()
	if l != nil {
		core = &slogCore{h: l.Handler()}
	}
	var opts []zap.Option
	if f != nil {
		opts = append(opts, zap.WithFatalHook(f))
	}
	return zap.New(core, opts...)
}

// FatalError is a fatal error of the embedded etcd: its storage failed (a
// full disk, an I/O error) and it cannot go on. Config.OnFatal receives it.
type FatalError struct {
	// Message is etcd's own ("failed to save Raft hard state and
	// entries"), Fields its context (the error, paths).
	Message string
	Fields  map[string]any
}

func (e *FatalError) Error() string {
	var b strings.Builder
	b.WriteString("embedded etcd failed: ")
	b.WriteString(e.Message)
	keys := slices.Collect(maps.Keys(e.Fields))
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%v", k, e.Fields[k])
	}
	return b.String()
}

// fatal is the hook etcd's zap logger runs on a Fatal entry (zap's default
// exits the process, with nothing written when the logger drops
// everything, as it does at walcast's default log level).
type fatal struct {
	onFatal func(error)
	early   chan struct{} // closed on a fatal error while Start runs

	mu      sync.Mutex
	err     *FatalError // protected by mu: the first fatal error
	running bool        // protected by mu: Start returned the member
}

func newFatal(onFatal func(error)) *fatal {
	return &fatal{onFatal: onFatal, early: make(chan struct{})}
}

// started marks the member as handed to the caller: later fatal errors go
// to onFatal. It returns the fatal error that came first, if any.
func (f *fatal) started() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.running = true
	return nil
}

// OnWrite implements zapcore.CheckWriteHook. It reports the error once and
// never returns: etcd's caller must not go on after a fatal error, and the
// process that embeds etcd stops (or exits) on the report.
func (f *fatal) OnWrite(ce *zapcore.CheckedEntry, fields []zapcore.Field) {
	enc := zapcore.NewMapObjectEncoder()
	for _, fl := range fields {
		fl.AddTo(enc)
	}
	e := &FatalError{Message: ce.Message, Fields: enc.Fields}
	f.mu.Lock()
	first, running := f.err == nil, f.running
	if first {
		f.err = e
	}
	f.mu.Unlock()
	switch {
	case first && running:
		f.onFatal(e)
	case first:
		close(f.early) // Start returns it
	}
	select {} // the failed goroutine stays here until the process exits
}

// failed returns the first fatal error, nil if none.
func (f *fatal) failed() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		return nil
	}
	return f.err
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
