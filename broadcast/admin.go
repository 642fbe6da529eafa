package broadcast

import (
	"context"
	"fmt"
	"slices"
	"time"

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
	// AppendAttempts counts failed append rounds; LastAppendError is the
	// latest failure.
	AppendAttempts  int
	LastAppendError string
	Callback        CallbackInfo
	Outcome         Outcome
	// CatalogCommits counts the commits made for this task so far (R4.9).
	CatalogCommits int
	Message        *message.Message
}

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
}

// Task describes one task, live or tombstoned.
func (b *Broadcaster) Task(id uint64) (TaskInfo, error) {
	b.mu.Lock()
	t := b.tasks[id]
	tb, tombstoned := b.gc.getLocked(id)
	b.mu.Unlock()
	switch {
	case t != nil:
		return t.describe(), nil
	case tombstoned:
		return tb.info()
	}
	return TaskInfo{}, fmt.Errorf("%w: task %d", ErrNotFound, id)
}

func (t *task) describe() TaskInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	ti := TaskInfo{
		ID: t.id, Type: t.msg.Type, State: t.state, CreatedAt: t.created, CompletedAt: t.completed,
		ResourceKeys: slices.Clone(t.keys), KeyFingerprint: t.msg.IdempotencyKey.Fingerprint(), AckSyncUp: t.msg.Broadcast.AckSyncUp,
		AppendAttempts: t.appendAttempts, LastAppendError: t.appendErr, Outcome: t.outcome, CatalogCommits: t.commits, Message: t.msg,
		Callback: CallbackInfo{Running: t.cb.running, Attempts: t.cb.attempts, LastError: t.cb.lastErr, LastAttemptAt: t.cb.lastAt, NextAttemptAt: t.cb.nextAt},
	}
	for i, v := range t.msg.Broadcast.VChannels {
		ti.VChannels = append(ti.VChannels, VChannelInfo{VChannel: v, Appended: t.appended[i], Acked: t.acked[i], Checkpoint: t.ackCP[i]})
	}
	return ti
}

func (tb tomb) info() (TaskInfo, error) {
	d, err := tb.decode()
	if err != nil {
		return TaskInfo{}, err
	}
	ti := TaskInfo{
		ID: tb.id, Type: d.msg.Type, State: Tombstone, CreatedAt: d.created(), CompletedAt: tb.completedAt(),
		ResourceKeys: d.msg.Broadcast.ResourceKeys, KeyFingerprint: d.msg.IdempotencyKey.Fingerprint(), AckSyncUp: d.msg.Broadcast.AckSyncUp,
		Outcome: d.outcome(), Message: d.msg,
	}
	for i, v := range d.msg.Broadcast.VChannels {
		vi := VChannelInfo{VChannel: v}
		if i < len(d.pb.Checkpoints) && d.pb.Checkpoints[i].Acked {
			vi.Appended, vi.Acked, vi.Checkpoint = true, true, checkpointOf(d.pb.Checkpoints[i])
		}
		ti.VChannels = append(ti.VChannels, vi)
	}
	return ti, nil
}

// Filter selects tasks for Tasks. Zero fields match everything.
type Filter struct {
	States []State
	Type   message.Type
	// OlderThan keeps tasks created more than this long ago (hanging tasks).
	OlderThan time.Duration
	// Limit caps the result (0: no cap).
	Limit int
}

// Tasks lists tasks matching f, ordered by id.
func (b *Broadcaster) Tasks(f Filter) ([]TaskInfo, error) {
	wantState := func(s State) bool { return len(f.States) == 0 || slices.Contains(f.States, s) }
	b.mu.Lock()
	var live []*task
	if wantState(Pending) || wantState(Replicated) {
		for _, t := range b.tasks {
			live = append(live, t)
		}
	}
	var tombs []tomb
	if wantState(Tombstone) {
		tombs = slices.Clone(b.gc.order[b.gc.head:])
	}
	b.mu.Unlock()
	cutoff := b.now().Add(-f.OlderThan)
	var out []TaskInfo
	keep := func(ti TaskInfo) {
		if !wantState(ti.State) || f.Type != (message.Type{}) && ti.Type != f.Type || f.OlderThan > 0 && ti.CreatedAt.After(cutoff) {
			return
		}
		out = append(out, ti)
	}
	for _, t := range live {
		keep(t.describe())
	}
	for _, tb := range tombs {
		ti, err := tb.info()
		if err != nil {
			return nil, err
		}
		keep(ti)
	}
	slices.SortFunc(out, func(x, y TaskInfo) int { return compareTicks(x.ID, y.ID, 0, 0) })
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// RetryCallback makes a failing callback's next attempt start now instead of
// after its backoff (R5.6).
func (b *Broadcaster) RetryCallback(id uint64) error {
	t, err := b.liveTask(id)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.cb.running || t.cb.retry == nil {
		return fmt.Errorf("%w: task %d has no callback waiting to retry", ErrFailedPrecondition, id)
	}
	select {
	case t.cb.retry <- struct{}{}:
	default:
	}
	return nil
}

// CompleteCallback completes a stuck task without its callback's effects:
// the task becomes TOMBSTONE with outcome ForceCompleted and reason, its keys
// are released, and duplicates report that outcome (R5.6). The running
// attempt, if any, is cancelled. It returns once the task is TOMBSTONE or ctx
// ends.
func (b *Broadcaster) CompleteCallback(ctx context.Context, id uint64, reason string) error {
	t, err := b.liveTask(id)
	if err != nil {
		return err
	}
	t.mu.Lock()
	if !t.cb.running {
		t.mu.Unlock()
		return fmt.Errorf("%w: task %d has not reached its callback (all copies must be acked first)", ErrFailedPrecondition, id)
	}
	if t.cb.force == nil {
		t.cb.force = &Outcome{Status: ForceCompleted, Detail: reason}
	}
	if t.cb.cancel != nil {
		t.cb.cancel()
	}
	if t.cb.retry != nil {
		select {
		case t.cb.retry <- struct{}{}:
		default:
		}
	}
	t.mu.Unlock()
	b.log.Warn("operator force-completes a callback", "broadcast", id, "reason", reason)
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *Broadcaster) liveTask(id uint64) (*task, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t := b.tasks[id]; t != nil {
		return t, nil
	}
	if _, ok := b.tombs[id]; ok {
		return nil, fmt.Errorf("%w: task %d is already TOMBSTONE", ErrFailedPrecondition, id)
	}
	return nil, fmt.Errorf("%w: task %d", ErrNotFound, id)
}
