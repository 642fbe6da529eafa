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
// lost. Concurrent ackers of one task share one commit.
func (b *Broadcaster) persistAcks(ctx context.Context, t *task) error {
	t.mu.Lock()
	want := t.ackGen
	t.mu.Unlock()
	t.persistMu.Lock()
	defer t.persistMu.Unlock()
	t.mu.Lock()
	if t.persistedGen >= want || t.state != Replicated {
		t.mu.Unlock()
		return nil
	}
	gen := t.ackGen
	raw, err := t.record(Replicated, time.Time{}, Outcome{})
	t.mu.Unlock()
	if err != nil {
		return err
	}
	ctx, stop := b.bound(ctx)
	defer stop()
	bo := b.cfg.Backoff.New()
	for {
		err := b.commit(ctx, "ack", t, catalog.Put(taskKey(b.cfg.Prefix, t.id), raw))
		if err == nil {
			t.mu.Lock()
			t.persistedGen = max(t.persistedGen, gen)
			t.mu.Unlock()
			return nil
		}
		if errors.Is(err, catalog.ErrFenced) {
			b.depose(err)
			return err
		}
		if catalog.NotApplied(err) {
			return err
		}
		if !wait.Sleep(ctx, bo.NextBackOff()) {
			return fmt.Errorf("persist ack of broadcast %d: %w", t.id, err)
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
