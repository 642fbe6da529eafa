package engine

import (
	"fmt"
	"slices"

	"github.com/walcast/walcast/broadcast/internal/mutate"
	"github.com/walcast/walcast/message"
)

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
