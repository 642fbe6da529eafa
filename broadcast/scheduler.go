package broadcast

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/tracing"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/resource"
)

// scheduler runs ack callbacks (R5.4). Conflicting tasks enrol in
// control-channel order (WAL order): on the primary a task enrols when its
// copies are appended, and a conflicting one cannot even exist before it
// finished (the issuance keys are held until then); on a secondary a task
// enrols when its control-channel copy is acked, which the control channel's
// consumer does in WAL order; on recovery replicated tasks are sorted by the
// control channel's time tick. Non-conflicting tasks may enrol in any order.
// A task's callback may run when every copy is acked and no earlier
// enrolled, unfinished task holds a conflicting key; a task that cannot run
// yet reserves its keys only against later tasks that conflict with it, so
// non-conflicting callbacks run concurrently and a blocked one stalls nothing
// it does not conflict with.
//
// The scheduler is event-driven: it rescans on enrolment, on a task becoming
// fully acked, and when a callback finishes. There is no polling ticker.
type scheduler struct {
	b *Broadcaster

	mu     sync.Mutex
	queue  []*task           // enrolled, unfinished, in enrolment order
	claims map[claimKey]bool // scratch for scans: key -> held exclusive
}

type claimKey struct {
	d    resource.Domain
	name string
}

func newScheduler(b *Broadcaster) *scheduler {
	return &scheduler{b: b, claims: make(map[claimKey]bool)}
}

func (s *scheduler) enroll(t *task) {
	s.mu.Lock()
	s.queue = append(s.queue, t)
	s.scanLocked()
	s.mu.Unlock()
}

func (s *scheduler) kick() {
	s.mu.Lock()
	s.scanLocked()
	s.mu.Unlock()
}

func (s *scheduler) remove(t *task) {
	s.mu.Lock()
	if i := slices.Index(s.queue, t); i >= 0 {
		s.queue = slices.Delete(s.queue, i, i+1)
	}
	s.scanLocked()
	s.mu.Unlock()
}

// scanLocked starts every callback that may run. Caller holds s.mu.
func (s *scheduler) scanLocked() {
	clear(s.claims)
	for _, t := range s.queue {
		blocked := false
		for _, k := range t.keys {
			excl, held := s.claims[claimKey{k.Domain, k.Name}]
			if held && (excl || k.Mode == resource.Exclusive) {
				blocked = true
				break
			}
		}
		for _, k := range t.keys {
			ck := claimKey{k.Domain, k.Name}
			s.claims[ck] = s.claims[ck] || k.Mode == resource.Exclusive
		}
		if blocked {
			continue
		}
		t.mu.Lock()
		ready := t.allAcked() && !t.cb.running && t.state != Tombstone
		if ready {
			t.cb.running = true
		}
		t.mu.Unlock()
		if ready && !s.b.spawn(func() { s.b.runCallback(t) }) {
			return
		}
	}
}

// runCallback calls t's ack callback until it succeeds and its TOMBSTONE is
// durable, with backoff between attempts (R5.2). Failures are visible in the
// task's callback state; an operator can retry now or complete it (R5.6).
func (b *Broadcaster) runCallback(t *task) {
	bo := b.cfg.Backoff.New()
	fn := b.cfg.Callbacks.ack(t.msg.Type)
	for {
		retry := make(chan struct{}, 1)
		t.mu.Lock()
		force := t.cb.force
		t.cb.attempts++
		attempt := t.cb.attempts
		t.cb.lastAt = b.now()
		t.cb.nextAt = time.Time{}
		t.cb.retry = retry
		results := t.results()
		actx, cancel := context.WithCancel(b.ctx)
		t.cb.cancel = cancel
		t.mu.Unlock()

		eff := newEffects(b.cfg.Prefix)
		var err error
		switch {
		case force != nil:
			eff.outcome = *force
		case fn != nil:
			// The callback's context carries its span (application spans
			// nest under it) and the broadcaster's cancellation.
			cctx, span := b.startTaskSpan(actx, t, tracing.SpanCallback)
			if span.IsRecording() {
				span.SetAttributes(tracing.AttrAttempt.Int(attempt))
			}
			start := time.Now()
			ev := &Event{Message: t.msg, Results: results, Attempt: attempt, Effects: eff}
			err = wait.Safely("callback", func() error { return fn(cctx, ev) })
			b.obs.Callback(t.msg.Type, time.Since(start), err)
			endSpan(span, err)
		}
		cancel()
		if err == nil {
			var raw []byte
			var completed time.Time
			raw, completed, err = b.commitTombstone(t, eff)
			if err == nil {
				b.finish(t, raw, completed, eff.outcome)
				return
			}
		}
		if b.ctx.Err() != nil {
			return
		}
		d := bo.NextBackOff()
		t.mu.Lock()
		forced := t.cb.force != nil && force == nil
		t.cb.lastErr = err.Error()
		t.cb.nextAt = b.now().Add(d)
		t.mu.Unlock()
		b.mu.Lock()
		b.stats.CallbackFailures++
		b.mu.Unlock()
		b.log.Warn("ack callback failed; retrying", "broadcast", t.id, "type", t.msg.Type.String(), "attempt", attempt, "retry_in", d, "err", err)
		if forced {
			continue
		}
		tm := time.NewTimer(d)
		select {
		case <-tm.C:
		case <-retry:
			tm.Stop()
		case <-b.ctx.Done():
			tm.Stop()
			return
		}
	}
}

// commitTombstone writes t as TOMBSTONE with its checkpoints, outcome and the
// callback's effects in one catalog transaction (R5.3), retrying ambiguous
// failures. It returns the record and its completion time. A transaction
// beyond the catalog's limits fails definitely (ErrTooLarge, ErrInvalid):
// that is the callback's failure, retried and visible like any other.
//
// For a REPLICATED task it holds t.persistMu, announced first in
// t.tombstoning: an ack commit in flight finishes before, and none starts
// after (persistAcks), so a REPLICATED record never lands after the
// TOMBSTONE.
func (b *Broadcaster) commitTombstone(t *task, eff *Effects) (_ []byte, _ time.Time, err error) {
	maybeApplied := false
	t.mu.Lock()
	replicated := t.state == Replicated
	if replicated {
		t.tombstoning = make(chan struct{})
	}
	t.mu.Unlock()
	ctx, span := b.startTaskSpan(b.ctx, t, tracing.SpanTombstone)
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrOutcome.String(eff.outcome.Status.String()))
	}
	defer func() { endSpan(span, err) }()
	if replicated {
		t.persistMu.Lock()
		defer func() {
			t.mu.Lock()
			switch {
			case err == nil:
				t.tomb = tombDurable
			case maybeApplied:
				t.tomb = tombInDoubt
			}
			close(t.tombstoning)
			t.tombstoning = nil
			t.mu.Unlock()
			t.persistMu.Unlock()
		}()
	}
	completed := b.now()
	t.mu.Lock()
	raw, err := t.record(Tombstone, completed, eff.outcome)
	t.mu.Unlock()
	if err != nil {
		return nil, completed, err
	}
	ops := append([]catalog.Op{catalog.Put(taskKey(b.cfg.Prefix, t.id), raw)}, eff.ops...)
	bo := b.cfg.Backoff.New()
	for {
		err := b.commit(ctx, "tombstone", t, ops...)
		if err == nil {
			return raw, completed, nil
		}
		if errors.Is(err, catalog.ErrFenced) {
			b.depose(err)
			return nil, completed, err
		}
		// Once an attempt may have been applied, only the same ops may be
		// written: re-running the callback could stage different effects
		// on top of applied ones. A transaction that can never fit is the
		// callback's problem (visible, retried, force-completable).
		if !maybeApplied && (errors.Is(err, catalog.ErrTooLarge) || errors.Is(err, catalog.ErrInvalid)) {
			return nil, completed, fmt.Errorf("tombstone and callback effects: %w", err)
		}
		if !catalog.NotApplied(err) {
			maybeApplied = true
		}
		b.log.Warn("persist tombstone failed; retrying", "broadcast", t.id, "err", err)
		recordRetry(span, err)
		if !wait.Sleep(b.ctx, bo.NextBackOff()) {
			return nil, completed, b.ctx.Err()
		}
	}
}

// finish completes t once its TOMBSTONE is durable: a topology it carries
// is applied, then the issuance keys are released (R3.6) — in that order, so
// a request queued behind a role change sees the new role (R8.1) —, the
// task becomes a tombstone for GC and deduplication, and waiters are
// answered (R4.6).
func (b *Broadcaster) finish(t *task, raw []byte, completed time.Time, out Outcome) {
	t.mu.Lock()
	from := t.state
	t.state = Tombstone
	t.outcome = out
	t.completed = completed
	t.cb.running = false
	g := t.guard
	t.guard = nil
	t.mu.Unlock()
	b.applyFinished(t, out)
	g.Unlock()
	b.mu.Lock()
	delete(b.tasks, t.id)
	b.gc.pushLocked(tomb{id: t.id, raw: b.gc.keepLocked(raw), completed: completed.UnixNano()})
	b.mu.Unlock()
	b.sched.remove(t)
	close(t.done)
	b.obs.TaskState(t.msg.Type, from, Tombstone)
	b.obs.Completed(t.msg.Type, completed.Sub(t.created))
	b.gc.kick()
}
