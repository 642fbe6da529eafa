package broadcast

import (
	"context"
	"log/slog"
	"time"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// Observer receives the broadcaster's events, for metrics. Methods are called
// synchronously on hot paths and must be fast and non-blocking.
type Observer interface {
	// TaskState is called when a task enters a state (from is 0 for a new
	// or recovered task) and when it leaves the last one (to is 0: deleted).
	TaskState(t message.Type, from, to State)
	// Appended is called when every copy of a task is in the WAL, with the
	// time since the task was created (broadcast duration).
	Appended(t message.Type, d time.Duration)
	// Completed is called when a task is TOMBSTONE, with its execution time.
	Completed(t message.Type, d time.Duration)
	// Callback is called after each callback attempt with its duration and
	// error (nil on success).
	Callback(t message.Type, d time.Duration, err error)
	// AppendRetry is called when an append round to p failed and will be
	// retried.
	AppendRetry(p message.PChannel, err error)
	// LockWait is called when a broadcast got its resource keys.
	LockWait(keys []resource.Key, d time.Duration)
	// Duplicate is called when a request resolved to an earlier broadcast.
	Duplicate(t message.Type)
	// Evicted is called when GC deleted tombstones: early of them were
	// evicted by MaxCount before reaching MaxLifetime (R6.3). An Observer
	// that also implements ClassObserver hears the class too.
	Evicted(total, early int)
	// CatalogCommit is called for every catalog commit the broadcaster
	// makes; kind is "pending", "ack", "tombstone", "gc", "ids",
	// "replicate" (Follow) or "promote" (where a force promote's copies
	// landed).
	CatalogCommit(kind string)
	// Fenced is called when the catalog reports a newer coordinator term.
	Fenced()
}

// ClassObserver is an Observer that hears per retention class how many
// tombstones GC deleted and how many of them MaxCount evicted early (R6.4).
type ClassObserver interface {
	EvictedClass(class string, total, early int)
}

type nopObserver struct{}

func (nopObserver) TaskState(message.Type, State, State)        {}
func (nopObserver) Appended(message.Type, time.Duration)        {}
func (nopObserver) Completed(message.Type, time.Duration)       {}
func (nopObserver) Callback(message.Type, time.Duration, error) {}
func (nopObserver) AppendRetry(message.PChannel, error)         {}
func (nopObserver) LockWait([]resource.Key, time.Duration)      {}
func (nopObserver) Duplicate(message.Type)                      {}
func (nopObserver) Evicted(int, int)                            {}
func (nopObserver) CatalogCommit(string)                        {}
func (nopObserver) Fenced()                                     {}

// coreObserver passes the core's events on to the Observer, the task spans
// and the lifecycle log. It runs on the driver's loop.
type coreObserver struct {
	b *Broadcaster
}

func (o coreObserver) TaskState(t message.Type, from, to engine.State) {
	o.b.obs.TaskState(t, from, to)
}

func (o coreObserver) Stage(id uint64, m *message.Message, from, to engine.Stage) {
	o.b.spans.stage(id, m, from, to)
	if o.b.log.Enabled(context.Background(), slog.LevelDebug) {
		o.b.log.With(engine.TraceAttrs(m)...).Debug("task stage", "broadcast", id, "type", m.Type.String(), "from", from.String(), "to", to.String())
	}
}

func (o coreObserver) Appended(t message.Type, d time.Duration) { o.b.obs.Appended(t, d) }

func (o coreObserver) Completed(id uint64, m *message.Message, d time.Duration, commits int, out engine.Outcome) {
	o.b.obs.Completed(m.Type, d)
	if o.b.log.Enabled(context.Background(), slog.LevelInfo) {
		o.b.log.With(engine.TraceAttrs(m)...).Info("task completed", "broadcast", id, "type", m.Type.String(), "duration", d, "commits", commits,
			"outcome", out.Status.String())
	}
}

func (o coreObserver) AppendRetry(p message.PChannel, err error) { o.b.obs.AppendRetry(p, err) }

func (o coreObserver) AppendFailed(id uint64, p message.PChannel, err error) {
	o.b.spans.appendFailed(id, p, err)
}

func (o coreObserver) Duplicate(t message.Type) { o.b.obs.Duplicate(t) }

func (o coreObserver) Evicted(class string, total, early int) {
	o.b.obs.Evicted(total, early)
	if co, ok := o.b.obs.(ClassObserver); ok {
		co.EvictedClass(class, total, early)
	}
}

func (o coreObserver) CatalogCommit(kind string) { o.b.obs.CatalogCommit(kind) }

func (o coreObserver) Fenced() { o.b.obs.Fenced() }
