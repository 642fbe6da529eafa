package broadcast

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
)

// replicatedLocked creates a REPLICATED task from the first ack of a copy
// the replicator wrote into this (secondary) cluster's WAL (R8.2). It holds
// no issuance keys; its idempotency key is indexed so a promoted secondary
// honours keys accepted before a failover (R7.8). Caller holds b.mu.
func (b *Broadcaster) replicatedLocked(a Ack) (*task, error) {
	m := a.Message
	if m.Broadcast.ID != a.BroadcastID {
		return nil, fmt.Errorf("%w: ack for broadcast %d carries broadcast %d", ErrInvalidArgument, a.BroadcastID, m.Broadcast.ID)
	}
	if err := checkTargets(m.Broadcast.VChannels); err != nil {
		return nil, fmt.Errorf("%w: replicated broadcast %d: %w", ErrInvalidArgument, m.Broadcast.ID, err)
	}
	if err := m.IdempotencyKey.Validate(); err != nil {
		return nil, fmt.Errorf("%w: replicated broadcast %d: %w", ErrInvalidArgument, m.Broadcast.ID, err)
	}
	raw, err := message.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("%w: encode replicated broadcast %d: %w", ErrInvalidArgument, m.Broadcast.ID, err)
	}
	info, _ := b.cfg.Types.Lookup(m.Type)
	t := newTask(m, raw, info, Replicated, b.now())
	b.tasks[t.id] = t
	b.indexLocked(t.scope, t.id)
	b.ids.observe(t.id)
	b.obs.TaskState(m.Type, 0, Replicated)
	return t, nil
}

// persistAcks makes t's recorded acks durable before the acker is answered:
// a secondary does not own the copies, so nothing would re-deliver an ack it
// lost. Concurrent ackers of one task share one commit. No attempt starts
// once the task's TOMBSTONE commit has (commitTombstone): that record holds
// every ack, and a REPLICATED record landing after it would make recovery
// run the callback again (R5.3). If ctx ends first, the error wraps ctx's.
func (b *Broadcaster) persistAcks(ctx context.Context, t *task) error {
	t.mu.Lock()
	want := t.nacked
	t.mu.Unlock()
	ctx, stop := b.bound(ctx)
	defer stop()
	bo := b.cfg.Backoff.New()
	for {
		t.persistMu.Lock()
		t.mu.Lock()
		done := t.persistedAcks >= want || t.state != Replicated || t.tomb == tombDurable
		inDoubt := t.tomb == tombInDoubt
		tombstoning := t.tombstoning
		var raw []byte
		var err error
		n := t.nacked
		if !done && !inDoubt && tombstoning == nil {
			raw, err = t.record(Replicated, time.Time{}, Outcome{})
		}
		t.mu.Unlock()
		switch {
		case done:
			t.persistMu.Unlock()
			return nil
		case inDoubt:
			// Only a stopping broadcaster leaves a TOMBSTONE in doubt; the
			// acker retries with the next one.
			t.persistMu.Unlock()
			return fmt.Errorf("persist ack of broadcast %d: its TOMBSTONE may be written: %w", t.id, ErrClosed)
		case tombstoning != nil:
			// The TOMBSTONE commit waits for this lock: let it go first.
			t.persistMu.Unlock()
			select {
			case <-tombstoning:
				continue
			case <-ctx.Done():
				return fmt.Errorf("persist ack of broadcast %d: %w", t.id, ctx.Err())
			}
		case err != nil:
			t.persistMu.Unlock()
			return err
		}
		// A replicated id passing the persisted id floor raises it in the
		// same commit, so that ids this cluster hands out once promoted stay
		// above every id its nodes applied, also after a restart when every
		// replicated tombstone was collected.
		ops := []catalog.Op{catalog.Put(taskKey(b.cfg.Prefix, t.id), raw)}
		floor, raised := b.ids.raiseFloor(t.id)
		if floor != nil {
			ops = append(ops, *floor)
		}
		err = b.commit(ctx, "ack", t, ops...)
		raised(err == nil)
		if err == nil {
			t.mu.Lock()
			t.persistedAcks = max(t.persistedAcks, n)
			t.mu.Unlock()
		}
		t.persistMu.Unlock()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, catalog.ErrFenced):
			b.depose(err)
			return err
		case catalog.NotApplied(err) && ctx.Err() == nil:
			return err
		}
		if ctx.Err() != nil || !wait.Sleep(ctx, bo.NextBackOff()) {
			return fmt.Errorf("persist ack of broadcast %d: %w (last attempt: %v)", t.id, ctx.Err(), err)
		}
	}
}

// enrollReplicated enrols a replicated task in the callback scheduler when
// its control-channel copy was acked (copy i), in ack order, which the
// consumer of the control channel makes WAL order (R5.4, R8.2).
func (b *Broadcaster) enrollReplicated(t *task, i int) {
	t.mu.Lock()
	enrol := !t.enrolled && t.state == Replicated && (i == t.control || t.control < 0 && t.allAcked())
	if enrol {
		t.enrolled = true
	}
	t.mu.Unlock()
	if enrol {
		b.sched.enroll(t)
	}
}

// bound returns a context that ends when ctx ends or the broadcaster stops.
func (b *Broadcaster) bound(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(b.ctx, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}
