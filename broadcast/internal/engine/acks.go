package engine

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/walcast/walcast/broadcast/internal/mutate"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// Acks (R4.4, R4.5, R5.5, R8.2). A copy is acked once: the first checkpoint
// wins and repeats are no-ops. The type's ack-once callback runs first; its
// failure leaves the copy unacked. Without AckSyncUp the engine acks every
// copy itself from its append result (FastAck), retrying a failing ack-once
// callback with backoff; with it, only consumers' acks count. A REPLICATED
// task's acks are durable before the acker is answered: nothing would
// re-deliver a secondary's copies.

// ackOnceRef is an ack-once callback run in flight: copy i of t, acked at
// cp with extra once the run succeeds.
type ackOnceRef struct {
	t     *task
	i     int
	cp    wal.Checkpoint
	extra []byte
}

// ack handles a consumer's ack.
func (c *Core) ack(e Ack) {
	t := c.tasks[e.ID]
	if t == nil {
		var err error
		if t, err = c.replicatedTask(e); err != nil || t == nil {
			// Not a replicated copy's ack (its id is another cluster's), not
			// a broadcast this core issued or collected: a newer leader's?
			if err == nil && c.roles.role == Primary && (e.Msg == nil || e.Msg.Replicate == nil) && !c.tombs.has(e.ID) &&
				!c.collected.Has(e.ID) && c.ids.issuedElsewhere(e.ID) {
				err = fmt.Errorf("%w: %w: broadcast %d (this coordinator's ids end below %d): a newer leader issued it; ack it there",
					catalog.ErrFenced, ErrNotIssued, e.ID, c.ids.end)
			}
			c.out.reply(e.To, Reply{Err: err})
			return
		}
	}
	i := t.msg.Index(e.VChannel)
	if i < 0 {
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: %s is not a target of broadcast %d", ErrVChannelNotInTask, e.VChannel, e.ID)})
		return
	}
	c.acks.ackCopy(t, i, e.Checkpoint, e.To, e.Ctx, e.Extra)
}

// replicatedTask creates a REPLICATED task from the first ack of a copy the
// replicator wrote into this (secondary) cluster's WAL (R8.2); it returns
// nil, nil for an ack to ignore: a tombstoned or unknown broadcast that is
// not a replicated copy on a secondary not fenced by a force promote, or a
// stale re-ack of a collected one (#86). The task holds no issuance keys;
// its idempotency key is indexed so that a promoted secondary honours keys
// accepted before a failover (R7.8).
func (c *Core) replicatedTask(e Ack) (*task, error) {
	m := e.Msg
	if c.tombs.has(e.ID) || m == nil || m.Replicate == nil || c.roles.role != Secondary || c.roles.fenced {
		return nil, nil
	}
	if m.Broadcast.ID != e.ID {
		return nil, fmt.Errorf("%w: ack for broadcast %d carries broadcast %d", ErrInvalidArgument, e.ID, m.Broadcast.ID)
	}
	if c.collected.Has(e.ID) {
		// A node re-acking from an older snapshot, or a copy the primary
		// appended again after a crash: the broadcast completed here and was
		// collected; its task must not come back (#86).
		c.stats.StaleAcks++
		c.log.Info("ack of a collected replicated broadcast ignored", "broadcast", e.ID, "vchannel", e.VChannel)
		return nil, nil
	}
	if err := CheckTargets(m.Broadcast.VChannels); err != nil {
		return nil, fmt.Errorf("%w: replicated broadcast %d: %w", ErrInvalidArgument, m.Broadcast.ID, err)
	}
	if err := m.IdempotencyKey.Validate(); err != nil {
		return nil, fmt.Errorf("%w: replicated broadcast %d: %w", ErrInvalidArgument, m.Broadcast.ID, err)
	}
	if m.Group != nil {
		if err := c.groups.replicatedError(m); err != nil {
			return nil, err
		}
	}
	info, _ := c.cfg.Types.Lookup(m.Type)
	t := newTask(m, nil, info, c.now)
	t.replicated = true
	t.class = c.cfg.ClassOf(m.Type)
	c.tasks[t.id] = t
	if !c.cfg.Mutation.Is(mutate.ForgetReplicatedIndex) {
		c.idem.register(t.scope, t.id, t.replicated)
	}
	c.ids.observe(t.id)
	if m.Group != nil {
		c.groups.groupOf(t)
	}
	c.obs.TaskState(m.Type, 0, Replicated)
	c.move(t, OnReplicatedAck, Collecting)
	return t, nil
}

// acked moves t on once the tracker recorded copy i's ack: a REPLICATED
// task collecting its acks is enrolled once its control copy is acked;
// any other task goes on once its last copy is (checkAcked).
func (c *Core) acked(t *task, i int) {
	if t.replicated {
		if t.stage == Collecting && (i == t.control || t.control < 0 && t.allAcked()) {
			// Enrolled in ack order of the control channel, which its
			// consumer makes WAL order (R5.4, R8.2).
			c.move(t, OnControlAcked, Queued)
			return
		}
	}
	c.checkAcked(t)
}

// checkAcked moves a task on once its last copy is acked (or, appending, once
// the last copy it waited for is acked with a checkpoint).
func (c *Core) checkAcked(t *task) {
	if t.stage == Appending && t.allAppended() {
		c.allAppended(t)
		return
	}
	if t.stage == FirstPhase {
		c.checkFirstPhase(t)
		return
	}
	c.supplementRestIfDue(t)
	if !t.allAcked() {
		return
	}
	switch t.stage {
	case Acking:
		if t.promote {
			if t.msg.Broadcast.AckSyncUp && !t.acksPersisted() {
				return // the promote's acks are persisted first
			}
			c.move(t, OnAcked, Promoting)
			return
		}
		c.move(t, OnAcked, Queued)
	case Queued:
		c.schedule(t)
	}
}

// supplementRestIfDue appends the rest of a two-phase broadcast a force
// promote supplements once its first copies are acked and those acks are
// durable (R13.11: no second-phase copy before the first acks are durable).
func (c *Core) supplementRestIfDue(t *task) {
	if t.supplementRest && t.firstAcked() && (!t.durableAcks() || t.acksPersisted()) {
		c.supplementMissing(t)
	}
}

// durableAcks reports whether an ack of t is answered only once a record
// holding it is durable: a REPLICATED task's (nothing would re-deliver a
// secondary's copies), a force promote's (a crash must not lose an ack its
// node will not repeat), and an AckSyncUp task's. A consumer's ack of an
// AckSyncUp copy is the one thing that lets its task complete; answered
// from memory, a deposed leader that has not noticed yet (a paused zombie
// that resumed) would take it for its own copy of the task and drop it for
// the new leader, whose task then waited for an ack the node had seen
// answered. The write is fenced on a deposed leader, so the ack is
// refused there and the node sends it to the new leader; and the new
// leader recovers the acks already written.
func (t *task) durableAcks() bool { return t.replicated || t.promote || t.msg.Broadcast.AckSyncUp }

// acksPersisted reports whether every recorded ack is durable.
func (t *task) acksPersisted() bool { return t.persistedAcks >= t.nacked }

// persistAcks writes t's record with its acks, unless a write of t is in
// flight (its completion writes again if needed) or its TOMBSTONE is being
// written (which holds every ack).
func (c *Core) persistAcks(t *task) {
	if t.stage >= Tombstoning || t.tombDue {
		return
	}
	if t.write != nil {
		return
	}
	n := t.nacked
	st := Replicated
	if !t.replicated {
		st = Pending // a force promote's acks (R8.3)
	}
	c.writes.write(WriteAcks, t, t.record(st), nil, func(_ *Core, w *writeOp, d Decision, err error) {
		if t.bytes == nil && w.msg != nil {
			t.bytes = w.msg
		}
		c.acks.written(t, n, d, err)
		c.afterWrite(t)
	})
}

// afterWrite continues a task whose write finished: a TOMBSTONE that
// waited for it, or acks recorded meanwhile.
func (c *Core) afterWrite(t *task) {
	if c.tasks[t.id] != t || c.stopped {
		return
	}
	if t.tombDue {
		t.tombDue = false
		c.tombstone(t)
		return
	}
	if len(t.ackWaiters) > 0 {
		c.persistAcks(t)
	}
	if t.stage == Acking || t.stage == FirstPhase {
		c.checkAcked(t)
	} else {
		c.supplementRestIfDue(t)
	}
}

// ackTracker owns the acks' rules (R4.4, R4.5, R5.5, R8.2, R13.11): a
// copy is acked once, the first checkpoint wins; a type's ack-once
// callback runs before an ack counts and a failed run leaves the copy
// unacked; the engine's own acks (FastAck) retry a failing run with
// backoff; an acker of a task whose acks must be durable (durableAcks) is
// answered once a record holding its ack is; a WaitAcked is answered once
// every copy it names is acked. The acks themselves are the task's copies'
// state; the tracker owns the ack-once runs in flight. The core owns the
// tasks and their stages: it finds the task an ack names, moves it on
// once an ack is recorded (acked) and writes its record (persist).
type ackTracker struct {
	// runs are the ack-once callback runs in flight, by id.
	runs       map[uint64]ackOnceRef
	hasAckOnce func(message.Type) bool

	// What the tracker uses of its core: ids, the actions out, the time,
	// timers and the retry schedule, whether a task is still live, its
	// logger; what to do once an ack is recorded (acked) and how to make
	// a task's acks durable (persist).
	nextID  func() uint64
	out     *outbox
	now     func() time.Time
	after   func(time.Duration, func()) *deadline
	backoff func() *backoff.ExponentialBackOff
	live    func(*task) bool
	log     func(*task) *slog.Logger
	acked   func(t *task, i int)
	persist func(t *task)
}

// fastAckAll acks every copy from its append result (FastAck); an
// AckSyncUp task waits for its consumers' acks instead.
func (a *ackTracker) fastAckAll(t *task) {
	if !t.msg.Broadcast.AckSyncUp {
		for i := range t.copies {
			a.fastAck(t, i)
		}
	}
}

// fastAck acks copy i on the engine's behalf.
// A consumer's ack-once run may be in flight for the copy already: the
// engine takes over its retries if it fails (a consumer need not retry an
// ack of a FastAck copy).
func (a *ackTracker) fastAck(t *task, i int) {
	cp := &t.copies[i]
	cp.fast = true
	if cp.acked || cp.ackOnce != 0 {
		return
	}
	a.ackCopy(t, i, cp.appendCP, nil, nil, nil)
}

// ackCopy acks copy i at cp (zero: its append result) for to (nil: the
// engine's own FastAck), with what the consumer returned (extra).
func (a *ackTracker) ackCopy(t *task, i int, cp wal.Checkpoint, to Target, ctx context.Context, extra []byte) {
	copy := &t.copies[i]
	if copy.acked || t.stage >= Tombstoning {
		if t.durableAcks() && to != nil {
			a.waitDurable(t, to)
			return
		}
		a.out.reply(to, Reply{})
		return
	}
	if copy.ackOnce != 0 {
		if to != nil {
			copy.ackOnceWaiters = append(copy.ackOnceWaiters, to)
		}
		return
	}
	if cp == (wal.Checkpoint{}) {
		if t.replicated && !copy.appended {
			// A replicated copy's position is known only to its reader: an
			// ack without a checkpoint (LegacyAck) cannot be recorded until
			// this cluster appended (or found) the copy itself.
			a.out.reply(to, Reply{Err: fmt.Errorf("%w: ack of replicated broadcast %d on %s carries no checkpoint, and its position is not known here",
				ErrFailedPrecondition, t.id, t.msg.Broadcast.VChannels[i])})
			return
		}
		cp = copy.appendCP
	}
	if a.hasAckOnce(t.msg.Type) {
		id := a.nextID()
		copy.ackOnce = id
		if to != nil {
			copy.ackOnceWaiters = append(copy.ackOnceWaiters, to)
		}
		a.runs[id] = ackOnceRef{t: t, i: i, cp: cp, extra: extra}
		a.out.ackOnce(AckOnce{Ctx: ctx, ID: id, Task: t.id, Msg: t.msg, VChannel: t.msg.Broadcast.VChannels[i], Checkpoint: cp})
		return
	}
	a.record(t, i, cp, extra)
	if to != nil {
		a.answer(t, to)
	}
}

// done records the result of an ack-once run.
func (a *ackTracker) done(e AckOnceDone) {
	ref, ok := a.runs[e.ID]
	if !ok {
		return
	}
	delete(a.runs, e.ID)
	t, i := ref.t, ref.i
	if !a.live(t) {
		return
	}
	copy := &t.copies[i]
	copy.ackOnce = 0
	waiters := copy.ackOnceWaiters
	copy.ackOnceWaiters = nil
	if e.Err != nil {
		err := fmt.Errorf("ack-once callback for broadcast %d on %s: %w", t.id, t.msg.Broadcast.VChannels[i], e.Err)
		for _, to := range waiters {
			a.out.reply(to, Reply{Err: err})
		}
		if copy.fast {
			a.log(t).Warn("ack-once callback failed; retrying", "broadcast", t.id, "vchannel", t.msg.Broadcast.VChannels[i], "err", e.Err)
			if copy.fastBack == nil {
				copy.fastBack = a.backoff()
			}
			a.after(copy.fastBack.NextBackOff(), func() {
				if a.live(t) && !t.copies[i].acked {
					a.ackCopy(t, i, t.copies[i].appendCP, nil, nil, nil)
				}
			})
		}
		return
	}
	a.record(t, i, ref.cp, ref.extra)
	for _, to := range waiters {
		a.answer(t, to)
	}
}

// answer answers an acker once its ack counts: at once on a primary,
// once durable for a REPLICATED task.
func (a *ackTracker) answer(t *task, to Target) {
	if t.durableAcks() {
		a.waitDurable(t, to)
		return
	}
	a.out.reply(to, Reply{})
}

// record records copy i as acked at cp, with the consumer's extra, answers
// the WaitAcked requests it completes and lets the core move t on.
func (a *ackTracker) record(t *task, i int, cp wal.Checkpoint, extra []byte) {
	copy := &t.copies[i]
	if copy.acked {
		return
	}
	if cp == (wal.Checkpoint{}) {
		cp = copy.appendCP // still zero if the append has not returned: copiesAppended fills it in
	}
	copy.acked, copy.ackCP, copy.extra = true, cp, extra
	copy.ackedAt = a.now().UnixNano()
	t.nacked++
	a.answerWaits(t)
	a.acked(t, i)
}

// waitDurable answers to once a record holding every ack recorded so far
// is durable.
func (a *ackTracker) waitDurable(t *task, to Target) {
	if t.persistedAcks >= t.nacked {
		a.out.reply(to, Reply{})
		return
	}
	t.ackWaiters = append(t.ackWaiters, ackWaiter{to: to, want: t.nacked})
	a.persist(t)
}

// written answers the ack waiters that a write of t's record holding its
// first n acks covers: once it is done, or with its error if the record
// was refused.
func (a *ackTracker) written(t *task, n int, d Decision, err error) {
	switch d {
	case Done:
		t.persistedAcks = max(t.persistedAcks, n)
		n = t.persistedAcks
	case Refuse:
		err = fmt.Errorf("persist ack of broadcast %d: %w", t.id, err)
	default:
		return
	}
	keep := t.ackWaiters[:0]
	for _, w := range t.ackWaiters {
		switch {
		case w.want > n:
			keep = append(keep, w)
		case d == Done:
			a.out.reply(w.to, Reply{})
		default:
			a.out.reply(w.to, Reply{Err: err})
		}
	}
	clear(t.ackWaiters[len(keep):])
	t.ackWaiters = keep
}

// wait answers to once every copy of t on vchannels is acked (R13.11).
func (a *ackTracker) wait(t *task, to Target, vchannels []message.VChannel) {
	idx := make([]int, 0, len(vchannels))
	for _, v := range vchannels {
		i := t.msg.Index(v)
		if i < 0 {
			a.out.reply(to, Reply{Err: fmt.Errorf("%w: %s is not a target of broadcast %d", ErrVChannelNotInTask, v, t.id)})
			return
		}
		idx = append(idx, i)
	}
	w := ackWait{to: to, idx: idx}
	if t.ackedAll(w.idx) {
		a.out.reply(to, Reply{})
		return
	}
	t.ackWaits = append(t.ackWaits, w)
}

// answerWaits answers the WaitAcked requests an ack completed.
func (a *ackTracker) answerWaits(t *task) {
	if len(t.ackWaits) == 0 {
		return
	}
	keep := t.ackWaits[:0]
	for _, w := range t.ackWaits {
		if t.ackedAll(w.idx) {
			a.out.reply(w.to, Reply{})
			continue
		}
		keep = append(keep, w)
	}
	clear(t.ackWaits[len(keep):])
	t.ackWaits = keep
}

// CheckTargets checks a target list: non-empty, well formed, each vchannel
// once (R2.3). Messages that did not come through message.NewBroadcast
// (replicated ones, API input) need it.
func CheckTargets(vs []message.VChannel) error {
	if len(vs) == 0 {
		return message.ErrNoTargets
	}
	seen := make(map[message.VChannel]struct{}, len(vs))
	for _, v := range vs {
		if err := v.Validate(); err != nil {
			return err
		}
		if _, dup := seen[v]; dup {
			return fmt.Errorf("%w: %s", message.ErrDuplicateVChannel, v)
		}
		seen[v] = struct{}{}
	}
	return nil
}

// Two-phase append and partial acks (R13.10-R13.12). A broadcast may name
// targets to append first (message.BroadcastHeader.AppendFirst): a shard
// split fences its source vchannel before the new shards start. Their
// copies are appended alone (stage FirstPhase) and count only once their
// consumers ack them, whatever the broadcast's AckSyncUp says; those acks
// are then written to the PENDING record (with their checkpoints and any
// extra the consumer returned), so that a crash after the first phase does
// not run it again; then the other copies are appended as usual. WaitAcked
// answers once named copies are acked: a caller can act between the
// phases, or on any partial set of acks.

// twoPhase reports whether t appends in two phases and the first is not
// over.
func (t *task) twoPhase() bool { return len(t.msg.Broadcast.AppendFirst) > 0 && !t.firstDone }

// first reports whether copy i is appended in the first phase.
func (t *task) first(i int) bool {
	return slices.Contains(t.msg.Broadcast.AppendFirst, t.msg.Broadcast.VChannels[i])
}

// firstAcked reports whether every first-phase copy is acked with a
// checkpoint.
func (t *task) firstAcked() bool {
	for i := range t.copies {
		if t.first(i) && !t.copies[i].acked {
			return false
		}
	}
	return true
}

// afterPersist is the stage a task whose PENDING record is durable goes
// to.
func (t *task) afterPersist() Stage {
	if t.twoPhase() {
		return FirstPhase
	}
	return Appending
}

// startFirstPhase appends the first-phase copies not in the WAL yet.
func (c *Core) startFirstPhase(t *task) {
	c.lanes.queueCopies(t, func(i int) bool {
		cp := t.copies[i]
		return t.first(i) && !cp.appended && !cp.queued && !cp.acked
	})
	c.checkFirstPhase(t)
}

// checkFirstPhase ends the first phase once its copies are acked: their
// acks are made durable, then the rest is appended.
func (c *Core) checkFirstPhase(t *task) {
	if t.stage != FirstPhase || !(t.firstAcked() || c.cfg.Mutation.Is(mutate.SecondPhaseEarly)) || t.write != nil {
		return
	}
	n := t.nacked
	c.writes.write(WriteFirstAcks, t, t.record(Pending), nil, func(_ *Core, _ *writeOp, d Decision, err error) {
		switch d {
		case Done:
			t.firstDone = true
			c.acks.written(t, n, d, err) // acks that waited for durability (durableAcks)
			c.move(t, OnFirstAcked, Appending)
		case Refuse:
			// The record cannot take the acks (too large): go on without
			// them; a crash then runs the first phase again.
			taskLog(c.log, t).Warn("two-phase append: first acks not persisted; going on", "broadcast", t.id, "err", err)
			t.firstDone = true
			c.acks.written(t, n, d, err)
			c.move(t, OnFirstAcked, Appending)
		}
		c.afterWrite(t) // acks recorded while the write was in flight
	})
}

// waitAcked answers once every named copy of a task is acked (R13.11).
func (c *Core) waitAcked(e WaitAcked) {
	t := c.tasks[e.ID]
	if t == nil {
		if c.tombs.has(e.ID) {
			c.out.reply(e.To, Reply{}) // finished: every copy was acked
			return
		}
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: broadcast %d", ErrNotFound, e.ID)})
		return
	}
	c.acks.wait(t, e.To, e.VChannels)
}

func (t *task) ackedAll(idx []int) bool {
	for _, i := range idx {
		if !t.copies[i].acked {
			return false
		}
	}
	return true
}

// firstPhaseOf returns the copies a force promote appends first for a
// replicated two-phase task whose first copies are not all acked: the
// missing first-phase copies (R13.11). It returns nil once they are.
func firstPhaseOf(x *task, missing []int) []int {
	if len(x.msg.Broadcast.AppendFirst) == 0 || x.firstAcked() {
		return nil
	}
	var out []int
	for _, i := range missing {
		if x.first(i) {
			out = append(out, i)
		}
	}
	return out
}

// vchannelsOf names copies, for logs.
func vchannelsOf(t *task, idx []int) []message.VChannel {
	out := make([]message.VChannel, len(idx))
	for j, i := range idx {
		out[j] = t.msg.Broadcast.VChannels[i]
	}
	return out
}
