package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/walcast/walcast/broadcast/internal/mutate"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/wal"
)

// Writes. Every catalog write goes through the writer: it counts the
// commit, classifies the result, retries the same bytes when the
// durable-write policy says so (with backoff), and hands every other
// decision to done.

// writer owns the catalog writes in flight and their rules: a task has at
// most one write in flight or waiting to be retried, the next waiting
// behind it (so that no REPLICATED record lands after its TOMBSTONE,
// R5.3); a write's result is classified and decided by the durable-write
// policy (below); RetrySame issues the same bytes again with backoff;
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

// The durable-write policy (R6.5): every catalog or WAL write the engine
// makes is classified by its outcome, and this one table says what each
// outcome means for each kind of write (WriteKind, with the actions in
// types.go), on a first attempt and after an attempt that may have
// applied. Every retry the core schedules follows from it; nothing else in
// the engine interprets a write's error.

// Outcome classes of a write.
type Verdict int

// Verdicts.
const (
	// Applied: the write is durable.
	Applied Verdict = iota + 1
	// NotApplied: definitely not written (and it never will be).
	NotApplied
	// Ambiguous: it may or may not have been written (a timeout, a lost
	// answer).
	Ambiguous
	// FencedOut: refused because a newer coordinator term exists.
	FencedOut
	// TooLarge: definitely not written, and the same write never will be
	// (beyond the backend's limits, or malformed).
	TooLarge
)

var verdictNames = map[Verdict]string{Applied: "applied", NotApplied: "not applied", Ambiguous: "ambiguous",
	FencedOut: "fenced", TooLarge: "too large"}

func (v Verdict) String() string { return verdictNames[v] }

// Classify returns the verdict of a catalog commit's error.
func Classify(err error) Verdict {
	switch {
	case err == nil:
		return Applied
	case errors.Is(err, catalog.ErrFenced):
		return FencedOut
	case errors.Is(err, catalog.ErrTooLarge), errors.Is(err, catalog.ErrInvalid):
		return TooLarge
	case catalog.NotApplied(err):
		return NotApplied
	}
	return Ambiguous
}

// ClassifyAppend returns the verdict of a WAL append's error.
func ClassifyAppend(err error) Verdict {
	switch {
	case err == nil:
		return Applied
	case errors.Is(err, wal.ErrTooLarge):
		return TooLarge
	case errors.Is(err, wal.ErrNotApplied):
		return NotApplied
	}
	return Ambiguous
}

// Decision is what the policy makes of a verdict.
type Decision int

// Decisions.
const (
	// Done: go on, the write is durable.
	Done Decision = iota + 1
	// Abort: nothing was or will be written; the task was never created
	// and its caller hears so (ErrTaskNotCreated).
	Abort
	// RetrySame: write the same bytes again after the backoff, until it
	// applies (every write is idempotent).
	RetrySame
	// Refuse: report the failure to whoever asked (the acker, the follower,
	// the callback, which runs again); nothing is retried here.
	Refuse
	// Split: write the batch in smaller parts (an append too large for one
	// entry).
	Split
	// Later: leave it to the next periodic run (GC).
	Later
	// StepDown: stop writing anything; a newer coordinator owns the catalog.
	StepDown
)

var decisionNames = map[Decision]string{Done: "done", Abort: "abort (not created)", RetrySame: "retry the same bytes",
	Refuse: "refuse", Split: "split", Later: "later", StepDown: "step down"}

func (d Decision) String() string { return decisionNames[d] }

// rule is the policy for one kind of write: the decision per verdict, on a
// first attempt and once an earlier attempt may have applied.
type rule struct {
	first, after map[Verdict]Decision
}

// Policy is the durable-write policy. Read it as: a write of this kind
// that got this verdict, with no earlier attempt that may have applied
// (first) or with one (after), leads to this decision.
var Policy = map[WriteKind]rule{
	// A PENDING record never applied can be given up: the task does not
	// exist. Once it may have, it must be made sure of.
	WritePending: {
		first: map[Verdict]Decision{Applied: Done, NotApplied: Abort, Ambiguous: RetrySame, TooLarge: Abort, FencedOut: StepDown},
		after: map[Verdict]Decision{Applied: Done, NotApplied: RetrySame, Ambiguous: RetrySame, TooLarge: RetrySame, FencedOut: StepDown},
	},
	// Acks are answered only once durable: a definite failure goes back to
	// the acker (who retries); an ambiguous one is retried as is.
	WriteAcks: {
		first: map[Verdict]Decision{Applied: Done, NotApplied: Refuse, Ambiguous: RetrySame, TooLarge: Refuse, FencedOut: StepDown},
		after: map[Verdict]Decision{Applied: Done, NotApplied: RetrySame, Ambiguous: RetrySame, TooLarge: RetrySame, FencedOut: StepDown},
	},
	// A TOMBSTONE that can never fit (the callback staged too much) is the
	// callback's failure: visible, retried, force-completable. Once an
	// attempt may have applied, only the same ops may be written: running
	// the callback again could stage different effects on top of applied
	// ones (R5.3).
	WriteTombstone: {
		first: map[Verdict]Decision{Applied: Done, NotApplied: RetrySame, Ambiguous: RetrySame, TooLarge: Refuse, FencedOut: StepDown},
		after: map[Verdict]Decision{Applied: Done, NotApplied: RetrySame, Ambiguous: RetrySame, TooLarge: RetrySame, FencedOut: StepDown},
	},
	// GC keeps every tombstone (and its index entry) it could not confirm
	// deleted, and tries again at its next run (R6.2).
	WriteGC: {
		first: map[Verdict]Decision{Applied: Done, NotApplied: Later, Ambiguous: Later, TooLarge: Later, FencedOut: StepDown},
		after: map[Verdict]Decision{Applied: Done, NotApplied: Later, Ambiguous: Later, TooLarge: Later, FencedOut: StepDown},
	},
	// An id block not surely reserved is not used: the broadcasts waiting
	// for it are not created (the next block starts above any attempted).
	WriteIDs: {
		first: map[Verdict]Decision{Applied: Done, NotApplied: Refuse, Ambiguous: Refuse, TooLarge: Refuse, FencedOut: StepDown},
		after: map[Verdict]Decision{Applied: Done, NotApplied: Refuse, Ambiguous: Refuse, TooLarge: Refuse, FencedOut: StepDown},
	},
	// Follow reports any failure; it is idempotent and the caller retries.
	WriteTopology: {
		first: map[Verdict]Decision{Applied: Done, NotApplied: Refuse, Ambiguous: Refuse, TooLarge: Refuse, FencedOut: StepDown},
		after: map[Verdict]Decision{Applied: Done, NotApplied: Refuse, Ambiguous: Refuse, TooLarge: Refuse, FencedOut: StepDown},
	},
	// A force promote cannot go on without knowing where its copies are.
	WritePromote: {
		first: map[Verdict]Decision{Applied: Done, NotApplied: RetrySame, Ambiguous: RetrySame, TooLarge: RetrySame, FencedOut: StepDown},
		after: map[Verdict]Decision{Applied: Done, NotApplied: RetrySame, Ambiguous: RetrySame, TooLarge: RetrySame, FencedOut: StepDown},
	},
	// A two-phase append's first acks must be durable before the second
	// phase (R13.11): retried until they are; a record too large to hold
	// them goes on without (a crash then runs the first phase again).
	WriteFirstAcks: {
		first: map[Verdict]Decision{Applied: Done, NotApplied: RetrySame, Ambiguous: RetrySame, TooLarge: Refuse, FencedOut: StepDown},
		after: map[Verdict]Decision{Applied: Done, NotApplied: RetrySame, Ambiguous: RetrySame, TooLarge: RetrySame, FencedOut: StepDown},
	},
	// Copies are appended until they are in the WAL (R4.3), as the same
	// entry (a deduplicating backend recognises an append whose answer was
	// lost); an entry too large is split.
	AppendCopies: {
		first: map[Verdict]Decision{Applied: Done, NotApplied: RetrySame, Ambiguous: RetrySame, TooLarge: Split},
		after: map[Verdict]Decision{Applied: Done, NotApplied: RetrySame, Ambiguous: RetrySame, TooLarge: Split},
	},
}

// Decide returns the policy's decision for a write of kind k with verdict
// v; maybeApplied says whether an earlier attempt of the same write may
// have applied.
func Decide(k WriteKind, v Verdict, maybeApplied bool) Decision {
	r, ok := Policy[k]
	if !ok {
		panic(fmt.Sprintf("engine: no durable-write policy for %v", k))
	}
	m := r.first
	if maybeApplied {
		m = r.after
	}
	d, ok := m[v]
	if !ok {
		panic(fmt.Sprintf("engine: no decision for %v write with verdict %v", k, v))
	}
	return d
}

// MayHaveApplied reports whether an attempt with verdict v may have
// written something.
func MayHaveApplied(v Verdict) bool { return v == Applied || v == Ambiguous }
