package sim

import (
	"context"
	"fmt"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/message"
)

// Ack waits (R11.5, R13.11): watchers wait for some copies of a live
// broadcast to be acked — WaitVChannelsAcked through the real driver, the
// WaitAcked request of the core otherwise — and give up now and then while
// faults go on. Every wait must be answered (the quiescent phase fails a
// request never answered, R11.3); one given up is withdrawn and must never
// be answered after (request.deliver), or, through the driver, must go on
// at once or wait only for the loop (sched.waitsOnlyForTheCore).

// maxWatchers bounds the ack waits in flight, maxWatches those a run
// starts (while faults go on): a run whose only live task waits (for an
// operator, say) must come to the point where nothing else can happen.
const (
	maxWatchers = 2
	maxWatches  = 8
)

// watchMoves adds the moves of the ack waits: a new one on a cluster with a
// live task, and giving up one in flight.
func (w *world) watchMoves(ms []move) []move {
	n := 0
	for _, r := range w.watchers {
		if r.done {
			continue
		}
		w.watchers[n] = r
		n++
		if w.faultsOn && !r.c.down {
			r := r
			ms = append(ms, move{weight: 1, do: func() { w.giveUpWait(r) }})
		}
	}
	clear(w.watchers[n:])
	w.watchers = w.watchers[:n]
	if n >= maxWatchers || w.watches >= maxWatches || !w.faultsOn {
		return ms
	}
	for _, c := range w.clusters() {
		if c.down || w.lost(c) || c.driver && c.drv.b == nil {
			continue
		}
		if live, _ := c.core.View().Counts(); live > 0 {
			c := c
			ms = append(ms, move{weight: 1, do: func() { w.watch(c) }})
		}
	}
	return ms
}

// watch starts an ack wait for some targets of one of c's live tasks.
func (w *world) watch(c *cluster) {
	live, _ := c.core.View().Counts()
	k := w.rng.IntN(live)
	var id uint64
	var vs []message.VChannel
	c.core.View().EachLive(func(tid uint64, _ engine.State, _ engine.Stage, m *message.Message, _ int) {
		if k == 0 {
			id = tid
			for _, v := range m.Broadcast.VChannels {
				if w.rng.IntN(2) == 0 {
					vs = append(vs, v)
				}
			}
			if len(vs) == 0 {
				vs = m.Broadcast.VChannels[:1]
			}
		}
		k--
	})
	w.watches++
	r := w.request(c, fmt.Sprintf("watcher/ackwait%d", id), func(engine.Reply) {}, nil)
	w.watchers = append(w.watchers, r)
	w.tracef("%s: watcher waits for %d's copies on %v", c.name, id, vs)
	if !c.driver {
		c.step(withTarget(engine.WaitAcked{ID: id, VChannels: vs}, r))
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.call = &driverCall{cancel: cancel}
	b := c.drv.b
	r.call.g = c.call(r, func() {
		defer cancel()
		_ = b.WaitVChannelsAcked(ctx, id, vs...)
	}, func() {})
}

// giveUpWait gives up a wait in flight (its caller's deadline): the core
// is told to withdraw it, or, through the driver, its context ends.
func (w *world) giveUpWait(r *request) {
	w.tracef("%s gives up", r.name())
	if r.call != nil {
		r.giveUp()
		r.call.cancel()
		r.call.g.cancelled = r.call.g.started
		return
	}
	w.withdraw(r.c, r)
}

// withdraw gives up r, a request of the core, and has the core withdraw
// it: from then on the core never answers it (R11.5).
func (w *world) withdraw(c *cluster, r *request) {
	r.giveUp()
	r.withdrawn = true
	done := w.request(c, r.name()+"/withdraw", func(engine.Reply) {}, nil)
	c.step(engine.Withdraw{To: r, Done: done})
}
