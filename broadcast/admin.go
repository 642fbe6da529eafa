package broadcast

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// TaskInfo describes a task for operators (R5.6, R9.5).
type TaskInfo struct {
	ID           uint64
	Type         message.Type
	State        State
	CreatedAt    time.Time
	CompletedAt  time.Time // zero unless TOMBSTONE
	ResourceKeys []resource.Key
	VChannels    []VChannelInfo
	// KeyFingerprint is the idempotency key's fingerprint, "" if none.
	KeyFingerprint string
	AckSyncUp      bool
	// Stage is where a live task is in its lifecycle ("persisting",
	// "appending", "acking", "collecting", "promoting", "queued", "calling",
	// "backoff", "tombstoning"); "tombstoned" for a tombstone.
	Stage string
	// AppendAttempts counts failed append rounds; LastAppendError is the
	// latest failure.
	AppendAttempts  int
	LastAppendError string
	Callback        CallbackInfo
	Outcome         Outcome
	// CatalogCommits counts the commits made for this task so far (R4.9).
	CatalogCommits int
	Message        *message.Message
	// Extras are what consumers returned with their acks (R13.12).
	Extras map[message.VChannel][]byte
	// HoldsKeys says the task is a group's Begin that holds its group's
	// keys (stage "holding"; R13.1, R13.7); ReleasedBy is the end that
	// released them, once it did.
	HoldsKeys  bool
	ReleasedBy uint64
	// Timeline is when the task went through each step (lock wait,
	// persist, appends and acks per vchannel, callback attempts,
	// tombstone), as this broadcaster saw them; set by Task only, for a
	// live task or one of the last engine.MaxTimelines to finish here
	// (HasTimeline).
	Timeline    Timeline
	HasTimeline bool
}

// Timeline is when a task went through each step of its life; a zero time
// is a step not seen (see TaskInfo.Timeline).
type Timeline = engine.Timeline

// MaxTimelines is how many finished tasks keep their Timeline in memory.
const MaxTimelines = engine.MaxTimelines

// VChannelInfo is one target of a task.
type VChannelInfo struct {
	VChannel   message.VChannel
	Appended   bool
	Acked      bool
	Checkpoint wal.Checkpoint
}

// CallbackInfo shows a task's ack callback: a callback that keeps failing
// is visible here, never silently dropped (R5.6).
type CallbackInfo struct {
	Running       bool
	Attempts      int
	LastError     string
	LastAttemptAt time.Time
	NextAttemptAt time.Time
	// History lists the latest attempts (up to 16), oldest first: each
	// with its number, start, end (zero while it runs) and error.
	History []CallbackAttempt
}

// CallbackAttempt is one attempt of a task's ack callback.
type CallbackAttempt = engine.Attempt

func liveInfo(v engine.TaskView) TaskInfo {
	ti := TaskInfo{
		ID: v.ID, Type: v.Msg.Type, State: v.State, CreatedAt: v.Created,
		ResourceKeys: slices.Clone(v.Msg.Broadcast.ResourceKeys), KeyFingerprint: v.Msg.IdempotencyKey.Fingerprint(),
		AckSyncUp: v.Msg.Broadcast.AckSyncUp, Stage: v.Stage.String(), AppendAttempts: v.AppendAttempts,
		LastAppendError: v.AppendError, Outcome: v.Outcome, CatalogCommits: v.Commits, Message: v.Msg,
		Callback: CallbackInfo{Running: v.CallbackStarted && v.Stage != engine.Queued, Attempts: v.Attempts,
			LastError: v.LastError, LastAttemptAt: v.LastAttemptAt, NextAttemptAt: v.NextAttemptAt, History: v.History},
	}
	for _, c := range v.Copies {
		ti.VChannels = append(ti.VChannels, VChannelInfo{VChannel: c.VChannel, Appended: c.Appended, Acked: c.Acked, Checkpoint: c.Checkpoint})
		if c.Extra != nil {
			if ti.Extras == nil {
				ti.Extras = map[message.VChannel][]byte{}
			}
			ti.Extras[c.VChannel] = c.Extra
		}
	}
	return ti
}

func tombInfo(id uint64, raw string) (TaskInfo, error) {
	r, err := engine.DecodeRecord([]byte(raw))
	if err != nil {
		return TaskInfo{}, fmt.Errorf("%w: tombstone %d: %w", ErrCorruptCatalog, id, err)
	}
	ti := TaskInfo{
		ID: id, Type: r.Msg.Type, State: Tombstone, CreatedAt: r.Created, CompletedAt: r.Completed,
		ResourceKeys: r.Msg.Broadcast.ResourceKeys, KeyFingerprint: r.Msg.IdempotencyKey.Fingerprint(),
		AckSyncUp: r.Msg.Broadcast.AckSyncUp, Stage: engine.Tombstoned.String(), Outcome: r.Outcome, Message: r.Msg,
		Extras: r.ExtrasByVChannel(), HoldsKeys: r.Holding(), ReleasedBy: r.ReleasedBy,
	}
	if ti.HoldsKeys {
		ti.Stage = engine.Holding.String()
	}
	for i, v := range r.Msg.Broadcast.VChannels {
		ti.VChannels = append(ti.VChannels, VChannelInfo{VChannel: v, Appended: r.Acked[i], Acked: r.Acked[i], Checkpoint: r.Checkpoints[i]})
	}
	return ti, nil
}

// Task describes one task, live or tombstoned.
func (b *Broadcaster) Task(id uint64) (TaskInfo, error) {
	var live *engine.TaskView
	var raw string
	var found, hasTL bool
	var tl Timeline
	if !b.d.inspect(func(c engine.View) {
		live, raw, _, found = c.TaskByID(id)
		tl, hasTL = c.RecentTimeline(id)
	}) {
		return TaskInfo{}, b.closedErr()
	}
	var ti TaskInfo
	var err error
	switch {
	case live != nil:
		ti = liveInfo(*live)
	case found:
		ti, err = tombInfo(id, raw)
	default:
		return TaskInfo{}, fmt.Errorf("%w: task %d", ErrNotFound, id)
	}
	if err != nil {
		return TaskInfo{}, err
	}
	ti.Timeline, ti.HasTimeline = tl, hasTL
	return ti, nil
}

// Filter selects tasks for Tasks. Zero fields match everything.
type Filter struct {
	States []State
	Type   message.Type
	// OlderThan keeps tasks created more than this long ago (hanging tasks).
	OlderThan time.Duration
	// AfterID and BeforeID keep tasks with ids above / below them (0: no
	// bound): a cursor for paging.
	AfterID, BeforeID uint64
	// Newest orders the result by descending id (default ascending).
	Newest bool
	// Limit caps the result (0: no cap), after ordering.
	Limit int
}

// tasksChunk is how many tombstones Tasks reads under the loop at a time.
var tasksChunk = 4096

// Tasks lists tasks matching f, ordered by id (descending if f.Newest).
func (b *Broadcaster) Tasks(f Filter) ([]TaskInfo, error) {
	wantState := func(s State) bool { return len(f.States) == 0 || slices.Contains(f.States, s) }
	wantID := func(id uint64) bool {
		return (f.AfterID == 0 || id > f.AfterID) && (f.BeforeID == 0 || id < f.BeforeID)
	}
	var live []engine.TaskView
	if (wantState(Pending) || wantState(Replicated)) && !b.d.inspect(func(c engine.View) { live = c.LiveTasks() }) {
		return nil, b.closedErr()
	}
	cutoff := b.cfg.Clock.Now().Add(-f.OlderThan)
	var out []TaskInfo
	keep := func(ti TaskInfo) {
		if !wantState(ti.State) || f.Type != (message.Type{}) && ti.Type != f.Type || f.OlderThan > 0 && ti.CreatedAt.After(cutoff) {
			return
		}
		out = append(out, ti)
	}
	listed := make(map[uint64]bool, len(live))
	for _, v := range live {
		if wantID(v.ID) {
			listed[v.ID] = true
			keep(liveInfo(v))
		}
	}
	if wantState(Tombstone) {
		// The tombstones in range, newest or oldest first, until Limit
		// matched: a chunk at a time under the loop, decoded outside it,
		// so that no page copies the whole set (R10.1) nor holds the loop
		// long. One that finished since it was listed live is not listed
		// twice.
		after, before := f.AfterID, f.BeforeID
		for {
			var chunk []engine.TombRecord
			var last uint64
			var more bool
			if !b.d.inspect(func(c engine.View) {
				last, more = c.EachTombstone(after, before, f.Newest, tasksChunk, func(id uint64, rec string) bool {
					chunk = append(chunk, engine.TombRecord{ID: id, Record: rec})
					return true
				})
			}) {
				return nil, b.closedErr()
			}
			full := false
			for _, tb := range chunk {
				if f.Limit > 0 && len(out) >= f.Limit+len(live) {
					full = true
					break
				}
				if listed[tb.ID] {
					continue
				}
				ti, err := tombInfo(tb.ID, tb.Record)
				if err != nil {
					return nil, err
				}
				keep(ti)
			}
			if full || !more {
				break
			}
			if f.Newest {
				before = last
			} else {
				after = last
			}
		}
	}
	slices.SortFunc(out, func(x, y TaskInfo) int {
		if f.Newest {
			x, y = y, x
		}
		switch {
		case x.ID < y.ID:
			return -1
		case x.ID > y.ID:
			return 1
		}
		return 0
	})
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// RetryCallback makes a failing callback's next attempt start now instead of
// after its backoff (R5.6).
func (b *Broadcaster) RetryCallback(id uint64) error {
	r, err := b.d.call(context.Background(), func(to engine.Target) engine.Event { return engine.RetryNow{To: to, ID: id} })
	if err != nil {
		return err
	}
	return r.Err
}

// CompleteCallback completes a stuck task without its callback's effects:
// the task becomes TOMBSTONE with outcome ForceCompleted and reason, its keys
// are released, and duplicates report that outcome (R5.6). The running
// attempt, if any, is cancelled. It returns once the task is TOMBSTONE or ctx
// ends.
func (b *Broadcaster) CompleteCallback(ctx context.Context, id uint64, reason string) error {
	r, err := b.d.call(ctx, func(to engine.Target) engine.Event { return engine.Complete{To: to, ID: id, Reason: reason} })
	if err != nil {
		return err
	}
	return r.Err
}

// Ack acknowledges one copy of a broadcast (R4.5). Acks are idempotent: the
// first checkpoint of a vchannel wins and repeats are no-ops. An ack for a
// tombstoned or unknown broadcast is ignored, unless it carries a replicated
// message, which creates a REPLICATED task (R8.2). An ack for a vchannel the
// broadcast does not target fails with ErrVChannelNotInTask.
//
// A consumer that does not carry the message may ack with just the id and
// vchannel (zero Checkpoint); the append result is used then. On a
// secondary the ack is durable when Ack returns.
func (b *Broadcaster) Ack(ctx context.Context, a Ack) error {
	if err := b.closedErr(); err != nil {
		return err
	}
	if err := checkAck(a); err != nil {
		return err
	}
	r, err := b.d.call(ctx, func(to engine.Target) engine.Event { return ackEvent(ctx, to, a) })
	if err != nil {
		return fmt.Errorf("ack of broadcast %d: %w", a.BroadcastID, err)
	}
	return r.Err
}

// AckAll is Ack for the acks a consumer has together (the copies of one WAL
// entry): they reach the coordinator in one hand-over, and each is answered
// as Ack alone would answer it. errs[i] answers acks[i]; errs is nil when
// every ack was taken. Under load this costs the coordinator one wake-up per
// entry instead of one per copy.
func (b *Broadcaster) AckAll(ctx context.Context, acks []Ack) (errs []error) {
	fail := func(i int, err error) {
		if errs == nil {
			errs = make([]error, len(acks))
		}
		errs[i] = err
	}
	if err := b.closedErr(); err != nil {
		for i := range acks {
			fail(i, err)
		}
		return errs
	}
	ok := make([]int, 0, len(acks)) // the acks that go to the core
	for i, a := range acks {
		if err := checkAck(a); err != nil {
			fail(i, err)
			continue
		}
		ok = append(ok, i)
	}
	rs, cerrs := b.d.callAll(ctx, len(ok), func(j int, to engine.Target) engine.Event { return ackEvent(ctx, to, acks[ok[j]]) })
	for j, i := range ok {
		switch {
		case cerrs != nil && cerrs[j] != nil:
			fail(i, fmt.Errorf("ack of broadcast %d: %w", acks[i].BroadcastID, cerrs[j]))
		case rs[j].Err != nil:
			fail(i, rs[j].Err)
		}
	}
	return errs
}

// checkAck refuses an ack the core must not see.
func checkAck(a Ack) error {
	if n := len(a.Extra); n > MaxAckExtraBytes {
		return fmt.Errorf("%w: ack of broadcast %d on %s: extra is %d bytes, limit %d: return a reference to a larger result",
			ErrInvalidArgument, a.BroadcastID, a.VChannel, n, MaxAckExtraBytes)
	}
	return nil
}

func ackEvent(ctx context.Context, to engine.Target, a Ack) engine.Event {
	return engine.Ack{To: to, ID: a.BroadcastID, VChannel: a.VChannel, Checkpoint: a.Checkpoint, Msg: a.Message, Ctx: ctx, Extra: a.Extra}
}

// MaxAckExtraBytes bounds Ack.Extra: it is persisted in the task's record
// with its checkpoint, and records must fit a catalog transaction.
const MaxAckExtraBytes = 1 << 10

// Ack is one consumer acknowledgement.
type Ack struct {
	BroadcastID uint64
	VChannel    message.VChannel
	// Checkpoint is where the consumer read the copy; zero if unknown.
	Checkpoint wal.Checkpoint
	// Message is the copy's message, if the consumer has it. A replicated
	// copy's message creates the REPLICATED task on a secondary.
	Message *message.Message
	// Extra is what the consumer returns with its ack (R13.12): persisted
	// with the checkpoint, given to the callback (Event.Extras) and to the
	// caller (Result.Extras); at most MaxAckExtraBytes.
	Extra []byte
}
