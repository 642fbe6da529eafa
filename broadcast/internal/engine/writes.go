package engine

import (
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/walcast/walcast/broadcast/internal/mutate"
	"github.com/walcast/walcast/catalog"
)

// Writes. Every catalog write goes through the writer: it counts the
// commit, classifies the result, retries the same bytes when the
// durable-write policy says so (with backoff), and hands every other
// decision to done.

// writer owns the catalog writes in flight and their rules: a task has at
// most one write in flight or waiting to be retried, the next waiting
// behind it (so that no REPLICATED record lands after its TOMBSTONE,
// R5.3); a write's result is classified and decided by the durable-write
// policy (policy.go); RetrySame issues the same bytes again with backoff;
// StepDown fences the core.
type writer struct {
	ops    map[uint64]*writeOp
	prefix string // the catalog prefix of task keys
	// core is handed to every write's done and failed.
	core *Core

	// What the writer uses of its core: ids, the actions out, the
	// counters and observer, timers and the retry schedule, a task's
	// logger, whether a task is still live, and fencing.
	nextID   func() uint64
	out      *outbox
	stats    *Stats
	obs      Observer
	after    func(time.Duration, func()) *deadline
	backoff  func() *backoff.ExponentialBackOff
	log      func(*task) *slog.Logger
	live     func(*task) bool
	fence    func(error)
	mutation mutate.Bug
}

type writeOp struct {
	id    uint64
	kind  WriteKind
	task  *task
	rec   *RecordSpec
	ops   []catalog.Op
	maybe bool // an attempt may have applied
	bo    *backoff.ExponentialBackOff
	retry *deadline
	// done gets every decision but RetrySame; w's fields say what was
	// written (raw, msg). The writes of every broadcast give a plain
	// function of the write, no closure to allocate.
	done writeDone
	// failed, if set, hears about every failed attempt.
	failed   func(c *Core, w *writeOp, err error)
	raw, msg []byte
	inFlight bool
}

// writeDone handles the decision about a write.
type writeDone func(c *Core, w *writeOp, d Decision, err error)

// write issues a catalog write. A task has at most one write in flight or
// waiting to be retried (so that no REPLICATED record can land after its
// TOMBSTONE, R5.3); a second one waits for the first to end.
func (wr *writer) write(kind WriteKind, t *task, rw *recordWrite, ops []catalog.Op, done writeDone) *writeOp {
	var w *writeOp
	var rec *RecordSpec
	if rw != nil {
		w, rec = &rw.w, &rw.spec
	} else {
		w = &writeOp{}
	}
	w.kind, w.task, w.rec, w.ops, w.done = kind, t, rec, ops, done
	if rec != nil && t != nil {
		if t.key == "" {
			t.key = TaskKey(wr.prefix, t.id)
		}
		rec.Key = t.key
	}
	if t != nil {
		if t.write != nil {
			t.writes = append(t.writes, w)
			return w
		}
		t.write = w
	}
	wr.issue(w)
	return w
}

// next issues the write of t that waited for the one that ended.
func (wr *writer) next(t *task) {
	if t.write != nil || len(t.writes) == 0 || !wr.live(t) {
		return
	}
	w := t.writes[0]
	t.writes = t.writes[1:]
	t.write = w
	wr.issue(w)
}

func (wr *writer) issue(w *writeOp) {
	w.id = wr.nextID()
	w.inFlight = true
	w.retry = nil
	wr.ops[w.id] = w
	wr.stats.CatalogCommits++
	wr.obs.CatalogCommit(w.kind.String())
	if w.task != nil {
		w.task.commits++
	}
	wr.out.write(Write{ID: w.id, Kind: w.kind, Task: taskID(w.task), Record: w.rec, Ops: w.ops})
}

func taskID(t *task) uint64 {
	if t == nil {
		return 0
	}
	return t.id
}

func (wr *writer) written(e Written) {
	w := wr.ops[e.ID]
	if w == nil {
		return
	}
	delete(wr.ops, e.ID)
	w.inFlight = false
	v := Classify(e.Err)
	d := Decide(w.kind, v, w.maybe)
	if wr.mutation.Is(mutate.CallbackTwice) && w.kind == WriteTombstone && d == RetrySame && MayHaveApplied(v) {
		d = Refuse
	}
	if MayHaveApplied(v) {
		w.maybe = true
	}
	if v == Applied {
		w.raw, w.msg = e.Record, e.Message
	}
	if w.task != nil && w.task.write == w && d != RetrySame {
		w.task.write = nil
		defer wr.next(w.task)
	}
	c := wr.core
	switch d {
	case RetrySame:
		if w.failed != nil {
			w.failed(c, w, e.Err)
		}
		if w.bo == nil {
			w.bo = wr.backoff()
		}
		wr.log(w.task).Warn("catalog write failed; retrying", "kind", w.kind.String(), "broadcast", taskID(w.task), "err", e.Err)
		w.retry = wr.after(w.bo.NextBackOff(), func() { wr.issue(w) })
	case StepDown:
		w.done(c, w, d, e.Err)
		wr.fence(e.Err)
	default:
		if d != Done && w.failed != nil {
			w.failed(c, w, e.Err)
		}
		w.done(c, w, d, e.Err)
	}
}

// cancelRetry drops a write that waits to be retried (not one in flight);
// it reports whether it did.
func (wr *writer) cancelRetry(w *writeOp) bool {
	if w == nil || w.inFlight || w.retry == nil {
		return false
	}
	w.retry.cancel()
	if w.task != nil && w.task.write == w {
		w.task.write = nil
		defer wr.next(w.task)
	}
	return true
}
