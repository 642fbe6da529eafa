package engine

import (
	"slices"

	"github.com/walcast/walcast/broadcast/internal/mutate"
)

// withdraw takes back the request answered at to, whose caller gave up
// waiting (R11.5), and returns what it waited for (nil: no task, or no
// request); Step answers the Withdraw's Done with it. What the
// request left in the core goes with it, so that nothing outlives its
// caller:
//
//   - a Resolve waiting for another request's admission slot leaves the
//     slot's waiters: were it still there when the slot frees, it would be
//     resolved again and admitted as the scope's first, holding the slot
//     for a caller that is gone, and every later request with its key
//     would wait behind it forever (R7.3);
//   - a Lock waiting for its keys drops its handle: the queued lock
//     request and the admission slot the handle holds go back (R3.6);
//   - a Submit waiting for its id or, as a group member, for its turn is
//     not answered any more, but goes on: once submitted, the broadcast is
//     the task's, which completes in the background (R4.6);
//   - a request waiting for a task (its Submit's or its original's result,
//     acks, a callback completed by an operator) leaves the task's waiters.
//
// A request already answered, or one the core does not know, is not
// found: Done is answered all the same.
func (c *Core) withdraw(to Target) *Waited {
	if to == nil {
		return nil
	}
	if !c.cfg.Mutation.Is(mutate.WaiterNotWithdrawn) && c.idem.withdraw(func(r Resolve) bool { return r.To == to }) {
		return nil
	}
	for _, h := range c.handles.byID {
		if h.to != to {
			continue
		}
		if !h.busy {
			c.handles.drop(h) // waiting for its locks
			return nil
		}
		h.to, h.withdrawn = nil, true
		for _, g := range c.groups.open {
			for i := range g.queue {
				if g.queue[i].h == h {
					g.queue[i].e.To = nil
					return &Waited{Group: g.id}
				}
			}
		}
		return &Waited{Stage: StageNone}
	}
	for _, t := range c.tasks {
		if c.cfg.Mutation.Is(mutate.WithdrawnStillAnswered) && slices.Contains(t.waiters, to) {
			return &Waited{ID: t.id, Stage: t.stage}
		}
		if t.withdraw(to) {
			return &Waited{ID: t.id, Stage: t.stage}
		}
	}
	return nil
}

// withdraw removes to from t's waiters of every kind; false if it was in
// none.
func (t *task) withdraw(to Target) bool {
	if i := slices.Index(t.waiters, to); i >= 0 {
		t.waiters = slices.Delete(t.waiters, i, i+1)
		return true
	}
	if i := slices.Index(t.completeWaits, to); i >= 0 {
		t.completeWaits = slices.Delete(t.completeWaits, i, i+1)
		return true
	}
	if i := slices.IndexFunc(t.ackWaiters, func(a ackWaiter) bool { return a.to == to }); i >= 0 {
		t.ackWaiters = slices.Delete(t.ackWaiters, i, i+1)
		return true
	}
	if i := slices.IndexFunc(t.ackWaits, func(a ackWait) bool { return a.to == to }); i >= 0 {
		t.ackWaits = slices.Delete(t.ackWaits, i, i+1)
		return true
	}
	for j := range t.copies {
		ws := t.copies[j].ackOnceWaiters
		if i := slices.Index(ws, to); i >= 0 {
			t.copies[j].ackOnceWaiters = slices.Delete(ws, i, i+1)
			return true
		}
	}
	return false
}
