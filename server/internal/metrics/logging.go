package metrics

import (
	"context"
	"log/slog"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// Logging returns an Observer that passes every event to next and logs, at
// debug level, what the engine's own lifecycle lines do not say: all copies
// appended, each callback attempt, a failed append round, a lock wait. The
// engine logs each task's stages (debug) and its completion (info, with the
// task's id, type, duration, catalog commits and outcome) itself (R9.6).
func Logging(next broadcast.Observer, log *slog.Logger) broadcast.Observer {
	return logObserver{next: next, log: log}
}

type logObserver struct {
	next broadcast.Observer
	log  *slog.Logger
}

// debug reports whether debug lines are written; callers check it before
// building a line's attributes, so the hot paths allocate nothing at info.
func (o logObserver) debug() bool { return o.log.Enabled(context.Background(), slog.LevelDebug) }

func (o logObserver) TaskState(t message.Type, from, to broadcast.State) {
	o.next.TaskState(t, from, to)
}

func (o logObserver) Appended(t message.Type, d time.Duration) {
	o.next.Appended(t, d)
	if o.debug() {
		o.log.Debug("task appended: every copy is in the WAL", "type", t.String(), "duration", d.String())
	}
}

func (o logObserver) Completed(t message.Type, d time.Duration) { o.next.Completed(t, d) }

func (o logObserver) Callback(t message.Type, d time.Duration, err error) {
	o.next.Callback(t, d, err)
	if err != nil {
		if o.debug() {
			o.log.Debug("callback attempt failed", "type", t.String(), "duration", d.String(), "err", err)
		}
		return
	}
	if o.debug() {
		o.log.Debug("callback attempt succeeded", "type", t.String(), "duration", d.String())
	}
}

func (o logObserver) AppendRetry(p message.PChannel, err error) {
	o.next.AppendRetry(p, err)
	if o.debug() {
		o.log.Debug("append round failed", "pchannel", string(p), "err", err)
	}
}

func (o logObserver) LockWait(keys []resource.Key, d time.Duration) {
	o.next.LockWait(keys, d)
	if o.debug() {
		o.log.Debug("resource keys granted", "keys", string(keysLabel(nil, keys)), "waited", d.String())
	}
}

func (o logObserver) Duplicate(t message.Type) { o.next.Duplicate(t) }
func (o logObserver) Evicted(total, early int) { o.next.Evicted(total, early) }

// EvictedClass passes per-class evictions on (broadcast.ClassObserver).
func (o logObserver) EvictedClass(class string, total, early int) {
	if c, ok := o.next.(broadcast.ClassObserver); ok {
		c.EvictedClass(class, total, early)
	}
}
func (o logObserver) CatalogCommit(kind string) { o.next.CatalogCommit(kind) }
func (o logObserver) Fenced()                   { o.next.Fenced() }
