package sim

import (
	"context"
	"errors"
	"fmt"

	"github.com/walcast/walcast/broadcast"
)

// A driven seed's roles (R8.1, R8.3, R11.5): in some seeds that run the real
// driver, the cluster starts as a secondary (Follow through the API, before
// the workload), and promoters force-promote it through the API
// (ForcePromote): up to two at once, racing, each giving up now and then
// while faults go on, across crashes and graceful Closes of the
// coordinator (a recovered promote goes on, and a later call waits for
// it). Clients wait for the promote, as they wait for it in the
// replication scenario. Every promote call must be answered; one whose
// caller gave up must go on at once or wait only for the loop
// (sched.waitsOnlyForTheCore).

// maxPromoters bounds the ForcePromote calls in flight.
const maxPromoters = 2

// followFirst makes the driven cluster c a secondary of a primary that
// never shows, with faults off, before the workload starts.
func (w *world) followFirst(c *cluster) {
	on := w.faultsOn
	w.faultsOn = false
	defer func() { w.faultsOn = on }()
	var err error
	done := false
	r := w.request(c, "follow", nil, nil)
	cfg := broadcast.ReplicateConfig{Primary: "gone", Secondaries: []broadcast.SecondaryConfig{{Name: c.name}}}
	b := c.drv.b
	c.call(r, func() { err = b.Follow(context.Background(), cfg) }, func() { done = true })
	w.settleGoroutines()
	switch {
	case w.err != nil:
	case !done:
		w.fail("%s: Follow did not return", c.name)
	case err != nil:
		w.fail("%s: Follow: %v", c.name, err)
	default:
		w.awaitPromote = true
		w.tracef("%s: follows a primary that never shows", c.name)
	}
}

// promoteMoves adds the moves of the promoters while the driven cluster
// waits to be promoted: a new ForcePromote call, and giving one up.
func (w *world) promoteMoves(ms []move) []move {
	c := w.primary
	if !w.awaitPromote || c.down || c.drv.b == nil || c.drv.closing {
		return ms
	}
	n := 0
	for _, r := range w.promoters {
		if r.done {
			continue
		}
		w.promoters[n] = r
		n++
		if w.faultsOn {
			r := r
			ms = append(ms, move{weight: 1, do: func() { w.giveUpWait(r) }})
		}
	}
	clear(w.promoters[n:])
	w.promoters = w.promoters[:n]
	if n < maxPromoters {
		ms = append(ms, move{weight: 2, do: func() { w.promote(c) }})
	}
	return ms
}

// promote calls ForcePromote on c's broadcaster.
func (w *world) promote(c *cluster) {
	w.calls++
	r := w.request(c, fmt.Sprintf("promoter/%d", w.calls), nil, nil)
	w.promoters = append(w.promoters, r)
	ctx, cancel := context.WithCancel(context.Background())
	r.call = &driverCall{cancel: cancel}
	b := c.drv.b
	var err error
	var role broadcast.Role
	r.call.g = c.call(r, func() {
		defer cancel()
		_, err = b.ForcePromote(ctx)
		role = b.Role()
	}, func() {
		switch {
		case err == nil && role != broadcast.Primary:
			w.fail("%s: ForcePromote answered but the cluster is %s", c.name, role)
		case err == nil || errors.Is(err, broadcast.ErrNotSecondary) && role == broadcast.Primary:
			w.awaitPromote = false
			w.tracef("%s: promoted (%v)", c.name, err)
		default:
			w.tracef("%s: promote: %v", c.name, err)
		}
	})
}
