package engine

import (
	"fmt"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/walcast/walcast/broadcast/internal/mutate"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/resource"
)

// The callback order (R5.4). Conflicting tasks enrol in control-channel
// order (WAL order): on the primary a task enrols when its copies are
// appended, and a conflicting one cannot even exist before it finished (the
// issuance keys are held until then); on a secondary a task enrols when its
// control-channel copy is acked, which the control channel's consumer does
// in WAL order; on recovery replicated tasks enrol by the control channel's
// time tick. A task's callback may run when every copy is acked and no
// earlier enrolled, unfinished task holds a conflicting key; a task that
// cannot run yet reserves its keys only against later tasks that conflict
// with it, so non-conflicting callbacks run concurrently and a blocked one
// stalls nothing it does not conflict with.
//
// Each key has a queue of the enrolled tasks claiming it, in enrolment
// order: a task is blocked on a key while an earlier claim conflicts with
// its own. Deciding whether a task may run, and which tasks a finished one
// unblocks, looks only at the heads of its keys' queues, so the cost of a
// completion does not grow with the number of queued tasks.

type claimKey struct {
	d    resource.Domain
	name string
}

// claim is one enrolled task's claim on one key; pos is its absolute
// position in the key's queue.
type claim struct {
	t    *task
	q    *keyQueue
	excl bool
	pos  uint64
	gone bool
}

// keyQueue is one key's claims in enrolment order: claims[head:] start with
// the first pending claim; claims[i] is at position base+i. firstExcl is the
// position of the first pending exclusive claim (none if there is none).
type keyQueue struct {
	key       claimKey
	claims    []*claim
	head      int
	base      uint64
	firstExcl uint64
}

const none = ^uint64(0)

func (q *keyQueue) at(pos uint64) *claim { return q.claims[pos-q.base] }
func (q *keyQueue) end() uint64          { return q.base + uint64(len(q.claims)) }

// scheduler owns which task's callback runs next and when a failed one
// runs again: the key queues above (which enrolled task is blocked by an
// earlier conflicting one, which tasks a finished one may unblock), when a
// queued task may run (runnable), and a callback's attempts and the
// backoff between them (started, ended, failed). The core owns the tasks
// and their stages: it enrols a task as it is queued, moves it to its
// callback once runnable, sets the timer for the wait failed returns and
// removes it once finished.
type scheduler struct {
	queues map[claimKey]*keyQueue
	// free are emptied queues kept for new keys (their claims slices
	// reused): most broadcasts hold a key no other holds.
	free []*keyQueue
	// backoff returns a fresh retry schedule (the core's policy).
	backoff func() *backoff.ExponentialBackOff
}

// keepFree is how many emptied queues the scheduler keeps.
const keepFree = 64

func (s *scheduler) init() {
	s.queues = make(map[claimKey]*keyQueue)
}

// enroll adds t at the end of the order.
func (s *scheduler) enroll(t *task) {
	t.enrolled = true
	if len(t.keys) <= len(t.claimBuf) && t.claimBuf[0].t == nil {
		// Once only: a removed task's claims may stay in their queues,
		// gone, until the queues' heads pass them.
		t.claims = t.claimBuf[:len(t.keys)]
	} else {
		t.claims = make([]claim, len(t.keys))
	}
	for i, k := range t.keys {
		ck := claimKey{k.Domain, k.Name}
		q := s.queues[ck]
		if q == nil {
			q = s.newQueue(ck)
			s.queues[ck] = q
		}
		cl := &t.claims[i]
		*cl = claim{t: t, q: q, excl: k.Mode == resource.Exclusive, pos: q.end()}
		q.claims = append(q.claims, cl)
		if cl.excl && q.firstExcl == none {
			q.firstExcl = cl.pos
		}
	}
}

// newQueue returns an empty queue for key k, a kept one if there is one.
func (s *scheduler) newQueue(k claimKey) *keyQueue {
	if n := len(s.free); n > 0 {
		q := s.free[n-1]
		s.free[n-1] = nil
		s.free = s.free[:n-1]
		*q = keyQueue{key: k, claims: q.claims[:0], firstExcl: none}
		return q
	}
	return &keyQueue{key: k, firstExcl: none}
}

// blocked reports whether an earlier unfinished task conflicts with t: on
// some key, an exclusive claim of t is not the first pending one, or a
// shared claim of t is behind a pending exclusive one.
func (s *scheduler) blocked(t *task) bool {
	for i := range t.claims {
		cl := &t.claims[i]
		q := cl.q
		if cl.excl && q.claims[q.head] != cl || !cl.excl && q.firstExcl < cl.pos {
			return true
		}
	}
	return false
}

// remove takes a finished t out of the order and returns the tasks that may
// have been waiting for it.
func (s *scheduler) remove(t *task) []*task {
	var next []*task
	for i := range t.claims {
		cl := &t.claims[i]
		cl.gone = true
		q := cl.q
		for q.head < len(q.claims) && q.claims[q.head].gone {
			q.claims[q.head] = nil
			q.head++
		}
		if cl.pos == q.firstExcl {
			q.firstExcl = none
			for p := cl.pos + 1; p < q.end(); p++ {
				if x := q.at(p); !x.gone && x.excl {
					q.firstExcl = p
					break
				}
			}
		}
		if q.head == len(q.claims) {
			delete(s.queues, q.key)
			if len(s.free) < keepFree && cap(q.claims) <= 64 {
				clear(q.claims)
				s.free = append(s.free, q)
			}
			continue
		}
		if q.head > 64 && q.head > len(q.claims)/2 {
			rest := copy(q.claims, q.claims[q.head:])
			clear(q.claims[rest:])
			q.claims = q.claims[:rest]
			q.base += uint64(q.head)
			q.head = 0
		}
		head := q.claims[q.head]
		switch {
		case cl.excl && !head.excl:
			// The shared claims it held back may run now.
			for p := head.pos; p < q.end() && p < q.firstExcl; p++ {
				if x := q.at(p); !x.gone {
					next = append(next, x.t)
				}
			}
		case head.excl && head.pos == q.firstExcl:
			next = append(next, head.t)
		}
	}
	t.claims = nil
	t.enrolled = false
	return next
}

// runnable reports whether t's callback may run: t is queued, every copy
// is acked, a group member's turn has come (or unordered: a planted bug,
// mutate.GroupUnordered) and no earlier enrolled task conflicts with it.
func (s *scheduler) runnable(t *task, unordered bool) bool {
	return t.stage == Queued && t.allAcked() && (t.groupRunnable() || unordered) && !s.blocked(t)
}

// started records that an attempt of t's callback starts at now; the
// view keeps the latest MaxAttemptHistory attempts.
func (s *scheduler) started(t *task, now time.Time) {
	t.attempts++
	t.lastAt = now
	t.nextAt = timeZero
	if len(t.history) == MaxAttemptHistory {
		t.history = append(t.history[:0], t.history[1:]...)
	}
	t.history = append(t.history, Attempt{N: t.attempts, Started: now})
}

// ended records that attempt of t's callback ended at now with err, if it
// is the latest one.
func (s *scheduler) ended(t *task, attempt int, now time.Time, err error) {
	if n := len(t.history); n > 0 && t.history[n-1].N == attempt {
		a := &t.history[n-1]
		a.Ended = now
		if err != nil {
			a.Err = err.Error()
		}
	}
}

// failed records that t's callback failed at now with err and returns the
// wait before its next attempt: the task's backoff schedule, none once if
// an operator asked for a retry while the attempt ran (R5.6).
func (s *scheduler) failed(t *task, err error, now time.Time) time.Duration {
	if t.cbBack == nil {
		t.cbBack = s.backoff()
	}
	d := t.cbBack.NextBackOff()
	if t.retrySoon {
		t.retrySoon, d = false, 0
	}
	t.lastErr = err.Error()
	t.nextAt = now.Add(d)
	return d
}

// schedule starts t's callback if it may run.
func (c *Core) schedule(t *task) {
	if c.cfg.Mutation.Is(mutate.PoisonBlocksOthers) && behindFailing(t, c.tasks) {
		c.timers.after(50*time.Millisecond, func() { c.schedule(t) })
		return
	}
	if !c.sched.runnable(t, c.cfg.Mutation.Is(mutate.GroupUnordered)) {
		return
	}
	c.move(t, OnRun, Calling)
}

// startCallback starts an attempt of t's callback (R5.2).
func (c *Core) startCallback(t *task) {
	c.sched.started(t, c.now)
	if t.ignore != nil {
		c.callbackDone(CallbackDone{Task: t.id, Attempt: t.attempts, Outcome: *t.ignore})
		return
	}
	if t.msg.Type == AlterReplicateConfig {
		ops, out, err := c.roles.callback(t)
		c.callbackDone(CallbackDone{Task: t.id, Attempt: t.attempts, Ops: ops, Outcome: out, Err: err})
		return
	}
	c.out.callback(Callback{Task: t.id, Attempt: t.attempts, Msg: t.msg, Results: t.results(), Extras: t.extras()})
}

func (c *Core) callbackDone(e CallbackDone) {
	t := c.tasks[e.Task]
	if t == nil || t.stage != Calling || e.Attempt != t.attempts {
		return
	}
	c.sched.ended(t, e.Attempt, c.now, e.Err)
	if e.Err == nil {
		if e.Outcome.Status == 0 {
			e.Outcome.Status = Succeeded
		}
		t.tombOps, t.outcome, t.completed = e.Ops, e.Outcome, c.now
		if c.cfg.Mutation.Is(mutate.ReleaseBeforeTombstone) && t.lock != nil && t.group == nil {
			c.handles.grantedAll(c.locks.Release(t.lock))
			t.lock = nil
		}
		c.move(t, OnCallbackOK, Tombstoning)
		return
	}
	if t.force != nil {
		c.forceTombstone(t, OnForce)
		return
	}
	c.move(t, OnCallbackFailed, Backoff)
	c.callbackFailed(t, e.Err)
}

// callbackFailed records a failed attempt and waits for the next.
func (c *Core) callbackFailed(t *task, err error) {
	d := c.sched.failed(t, err, c.now)
	c.stats.CallbackFailures++
	taskLog(c.log, t).Warn("ack callback failed; retrying", "broadcast", t.id, "type", t.msg.Type.String(), "attempt", t.attempts,
		"retry_in", d, "err", err)
	t.cbTimer = c.timers.after(d, func() {
		if t.stage == Backoff && c.cfg.Mutation.Is(mutate.RetryOutsideTable) {
			c.move(t, OnRun, Calling)
		} else if t.stage == Backoff {
			c.move(t, OnRetry, Calling)
		}
	})
}

// forceTombstone completes t with the operator's outcome, without its
// callback's effects (R5.6).
func (c *Core) forceTombstone(t *task, on Trigger) {
	t.cbTimer.cancel()
	t.tombOps, t.outcome, t.completed = nil, *t.force, c.now
	c.move(t, on, Tombstoning)
}

// tombstone writes t as TOMBSTONE with its checkpoints, outcome and the
// callback's effects in one catalog transaction (R5.3). A write of t in
// flight (its acks) finishes first; one waiting to be retried is dropped,
// since the TOMBSTONE holds every ack.
func (c *Core) tombstone(t *task) {
	if t.anyQueued() && !c.cfg.Mutation.Is(mutate.TombstoneWithCopyQueued) {
		t.tombAfterAppends = true
		return
	}
	if t.write != nil && !c.writes.cancelRetry(t.write) {
		t.tombDue = true
		return
	}
	rw := t.record(Tombstone)
	rec := &rw.spec
	rec.Completed = t.completed
	rw.outcome = t.outcome
	rec.Outcome = &rw.outcome
	rec.HoldsKeys = t.holdsKeys()
	ops := t.tombOps
	if key, val, ok := c.groups.endOp(t); ok {
		// A group's end releases it in the same transaction (R13.3).
		ops = append(slices.Clip(ops), catalog.Put(key, val))
	}
	c.writes.write(WriteTombstone, t, rw, ops, tombstoneWritten)
	if c.cfg.Mutation.Is(mutate.AnswerBeforeDurable) {
		for _, to := range t.waiters {
			c.out.reply(to, Reply{Result: &Result{ID: t.id, Msg: t.msg, Outcome: t.outcome}})
		}
		t.waiters = nil
	}
}

func tombstoneWritten(c *Core, w *writeOp, d Decision, err error) {
	t := w.task
	switch d {
	case Done:
		c.finish(t, w.raw)
	case Refuse:
		t.tombOps = nil
		c.move(t, OnTombstoneRefused, Backoff)
		c.callbackFailed(t, fmt.Errorf("tombstone and callback effects: %w", err))
	}
}

// finish completes t once its TOMBSTONE is durable: a topology it carries
// is applied, then the issuance keys are released (R3.6) — in that order,
// so that a request queued behind a role change sees the new role (R8.1) —,
// the task becomes a tombstone for GC and deduplication, and waiters are
// answered (R4.6).
func (c *Core) finish(t *task, raw []byte) {
	from := t.state()
	if t.holdsKeys() {
		c.move(t, OnTombstoned, Holding)
	} else {
		c.move(t, OnTombstoned, Tombstoned)
	}
	c.roles.apply(t)
	delete(c.tasks, t.id)
	c.timelines.keepTask(t, c.now)
	tb := c.tombs.newTomb(t.id, raw, t.completed.UnixNano(), t.class, t.replicated)
	next := c.sched.remove(t)
	if t.promote {
		// The promoted cluster takes its open groups' keys before the
		// exclusive Cluster key goes (R13.5).
		c.groups.handOver()
	}
	if t.lock != nil && t.stage != Holding {
		c.handles.grantedAll(c.locks.Release(t.lock))
		t.lock = nil
	}
	if t.group == nil || !c.groups.finishMember(t, tb) {
		c.tombs.push(tb)
	}
	res := &Result{ID: t.id, Msg: t.msg, Appends: t.results(), Extras: t.extras(), Outcome: t.outcome}
	if t.scope != (Scope{}) {
		w := c.tombs.window(t.class, t.id, t.created, t.completed)
		res.Window = &w
	}
	for _, to := range t.waiters {
		c.out.reply(to, Reply{Result: res})
	}
	t.waiters = nil
	for _, a := range t.ackWaiters {
		c.out.reply(a.to, Reply{})
	}
	t.ackWaiters = nil
	for _, to := range t.completeWaits {
		c.out.reply(to, Reply{})
	}
	t.completeWaits = nil
	c.obs.TaskState(t.msg.Type, from, Tombstone)
	c.obs.Completed(t.id, t.msg, t.completed.Sub(t.created), t.commits, t.outcome)
	for _, x := range next {
		c.schedule(x)
	}
	if c.prom != nil {
		c.prom.finished(t)
	}
	c.gc.run(false)
}

// retryNow makes a failing callback's next attempt start now (R5.6).
func (c *Core) retryNow(e RetryNow) {
	t, err := c.liveTask(e.ID)
	if err != nil {
		c.out.reply(e.To, Reply{Err: err})
		return
	}
	switch {
	case t.stage == Backoff:
		t.cbTimer.cancel()
		c.move(t, OnRetry, Calling)
	case t.stage == Calling || t.stage == Tombstoning:
		// An attempt runs: if it fails, the next starts at once.
		t.retrySoon = true
	default:
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: task %d has no callback waiting to retry", ErrFailedPrecondition, e.ID)})
		return
	}
	c.out.reply(e.To, Reply{})
}

// complete completes a stuck task without its callback's effects (R5.6):
// the running attempt, if any, is cancelled; the reply comes once the task
// is TOMBSTONE.
func (c *Core) complete(e Complete) {
	t, err := c.liveTask(e.ID)
	if err != nil {
		c.out.reply(e.To, Reply{Err: err})
		return
	}
	if t.attempts == 0 {
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: task %d has not reached its callback (all copies must be acked first)", ErrFailedPrecondition, e.ID)})
		return
	}
	if t.force == nil {
		t.force = &Outcome{Status: ForceCompleted, Detail: e.Reason}
	}
	c.log.Warn("operator force-completes a callback", "broadcast", e.ID, "reason", e.Reason)
	t.completeWaits = append(t.completeWaits, e.To)
	switch t.stage {
	case Calling:
		c.out.cancelCallback(t.id)
	case Backoff:
		c.forceTombstone(t, OnForce)
	}
}

func (c *Core) liveTask(id uint64) (*task, error) {
	if t := c.tasks[id]; t != nil {
		return t, nil
	}
	if c.tombs.has(id) {
		return nil, fmt.Errorf("%w: task %d is already TOMBSTONE", ErrFailedPrecondition, id)
	}
	return nil, fmt.Errorf("%w: task %d", ErrNotFound, id)
}

// behindFailing is a planted bug (mutate.PoisonBlocksOthers): t's callback
// waits while any other task's callback waits to be retried (schedule
// tries again a little later).
func behindFailing(t *task, tasks map[uint64]*task) bool {
	for _, x := range tasks {
		if x != t && x.stage == Backoff && t.stage == Queued {
			return true
		}
	}
	return false
}
