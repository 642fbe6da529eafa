package broadcast

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/broadcast/internal/mutate"
	"github.com/walcast/walcast/broadcast/internal/simrt"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/clock"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/tracing"
	"github.com/walcast/walcast/wal"
)

// driver runs the engine's decision core: one loop goroutine steps it with
// every event (API requests, I/O results, timer ticks); the actions it
// returns are performed by bounded worker pools (catalog commits, WAL
// appends, callbacks) whose results come back as events. A catalog that
// commits asynchronously (catalog.AsyncCommitter) is handed its writes by
// the loop itself, and answers them as events from its own goroutine.
//
// A caller's request may skip the loop (tryStep): when the core is free and
// no event waits for the loop, the caller steps the core itself under mu,
// and if the step only answers callers (a duplicate answered from the
// index, a lock granted at once) it delivers the answers itself: no
// goroutine hands the request over and back. Anything else the step asks
// for is left to the loop, which performs it with its batch. A Submit with
// no task in flight skips the loop too (trySubmit): its caller performs
// the step's actions, handing the PENDING write to a worker. A worker's
// result may skip the loop the same way (finish) while its task is the only
// one in flight, and then the worker runs the first write or append the
// step asks for itself: an uncontended broadcast goes from its PENDING write
// to its append and its TOMBSTONE on one goroutine, with no hand-over
// between them. Nothing else touches the core.
type driver struct {
	b     *Broadcaster
	core  *engine.Core
	clock clock.Clock
	// mu guards the core, acts, now, keep, kept and armed: the loop holds
	// it while it steps and performs, a caller's tryStep or trySubmit and
	// a worker's finish while they step.
	mu sync.Mutex
	// queued counts the events sent and not yet stepped: a caller steps
	// the core itself only when it is zero, so that no request overtakes
	// an event sent before it (a goroutine's own Close included).
	queued atomic.Int64
	// wake asks the loop to perform what a caller's step left (and to
	// re-arm its timer).
	wake   chan struct{}
	events chan engine.Event
	stopc  chan error
	// done is closed when the loop has exited: every reply has been sent.
	done chan struct{}

	// ctx bounds every I/O; cancelled when the loop stops.
	ctx    context.Context
	cancel context.CancelFunc

	workers              sync.WaitGroup
	commits, appends, cb *pool
	// async is the catalog if it commits without a waiting goroutine: the
	// loop then hands writes to it directly instead of to commits' workers.
	async catalog.AsyncCommitter

	// running callbacks' cancel funcs, by task id.
	cbMu      sync.Mutex
	cbCancels map[uint64]context.CancelFunc

	stopOnce sync.Once

	// acts is the reused list of actions to perform; now holds the results
	// perform has at once, without I/O, which performReady steps the core
	// with after it.
	acts []engine.Action
	now  []engine.Event
	// keep is set while a worker's finish performs: the first catalog
	// write or WAL append goes to kept (its act non-nil), for that worker
	// to run itself, instead of to a pool.
	keep bool
	kept job
	// armed is the core deadline the loop's timer is set for.
	armed time.Time

	// rt, for the simulator, runs the loop and the jobs and decides the
	// caller-stepped paths and the waits (nil in production); bug is the
	// bug it plants (package mutate).
	rt  simrt.Runtime
	bug mutate.Bug
	// jobs counts the jobs rt runs, for drain.
	jobs atomic.Int64
	// replies are reply channels for call: one goes back only once its
	// request's reply was received (a request abandoned by its caller keeps
	// its channel, which the core may still answer). They are the
	// driver's own, not the process's: a channel made inside a
	// testing/synctest bubble must never reach another broadcaster.
	replies sync.Pool
}

func newDriver(b *Broadcaster, core *engine.Core) *driver {
	d := &driver{b: b, core: core, clock: b.cfg.Clock, events: make(chan engine.Event, 1024), wake: make(chan struct{}, 1),
		stopc: make(chan error, 1), done: make(chan struct{}), cbCancels: make(map[uint64]context.CancelFunc)}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.replies.New = newReplyChan
	d.async, _ = b.cat.(catalog.AsyncCommitter)
	if d.rt = b.cfg.rt; d.rt != nil {
		d.bug = d.rt.Mutation()
	}
	d.commits = newPool(&d.workers, 256, d.run)
	d.appends = newPool(&d.workers, b.cfg.appendConcurrency(), d.run)
	d.cb = newPool(&d.workers, b.cfg.CallbackConcurrency, d.run)
	return d
}

// start performs the core's first actions (recovery's) and runs the loop.
func (d *driver) start() {
	d.mu.Lock() // the workers it starts may finish before it is done
	d.performReady()
	d.mu.Unlock()
	if d.rt != nil {
		d.rt.GoLoop(d.loop)
		return
	}
	go d.loop()
}

// spawn runs fn on a new goroutine (the simulator's runtime's, if set).
func (d *driver) spawn(fn func()) {
	if d.rt != nil {
		d.rt.Go(fn)
		return
	}
	go fn()
}

// What woke the loop.
const (
	wokeEvent = iota
	wokeTimer
	wokePoke
	wokeStop
)

func (d *driver) loop() {
	defer close(d.done)
	timer := d.clock.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		d.mu.Lock()
		if at, ok := d.core.Deadline(); ok && !at.Equal(d.armed) {
			d.armed = at
			timer.Reset(at.Sub(d.clock.Now()))
		}
		d.mu.Unlock()
		var (
			woke int
			ev   engine.Event
			err  error
		)
		if d.rt != nil {
			woke, ev, err = d.simWait(timer)
		} else {
			select {
			case ev = <-d.events:
				woke = wokeEvent
			case <-timer.C():
				woke = wokeTimer
			case <-d.wake:
				woke = wokePoke
			case err = <-d.stopc:
				woke = wokeStop
			}
		}
		switch woke {
		case wokeEvent:
			d.mu.Lock()
			d.step(ev)
			// Take whatever else is queued before performing: replies and
			// writes of one batch go out together.
			for n := 0; n < 256; n++ {
				select {
				case ev := <-d.events:
					d.step(ev)
					continue
				default:
				}
				break
			}
		case wokeTimer:
			d.mu.Lock()
			d.armed = time.Time{}
			d.core.Step(d.clock.Now(), engine.Tick{})
		case wokePoke:
			d.mu.Lock()
		case wokeStop:
			d.mu.Lock()
			d.core.Step(d.clock.Now(), engine.Stop{Err: err})
			d.performReady()
			d.mu.Unlock()
			d.drain()
			if d.rt != nil {
				// Between the drain's last look at the events and done
				// closing, a caller's send may still land in the buffer,
				// never to be stepped: its caller waits for done (await).
				d.rt.Yield()
			}
			return
		}
		d.performReady()
		d.mu.Unlock()
	}
}

// simWait is the loop's wait under the simulator's runtime: it parks until
// something woke it, then takes one cause in a fixed order, so that the
// seed (which decides when the loop runs) decides all.
func (d *driver) simWait(timer clock.Timer) (int, engine.Event, error) {
	d.rt.Park(func() bool { return len(d.stopc) > 0 || len(d.events) > 0 || len(timer.C()) > 0 || len(d.wake) > 0 })
	select {
	case err := <-d.stopc:
		return wokeStop, nil, err
	default:
	}
	select {
	case ev := <-d.events:
		return wokeEvent, ev, nil
	default:
	}
	select {
	case <-timer.C():
		return wokeTimer, nil, nil
	default:
	}
	<-d.wake
	return wokePoke, nil, nil
}

// step steps the core with an event the loop received (under mu).
func (d *driver) step(ev engine.Event) {
	d.core.Step(d.clock.Now(), ev)
	d.queued.Add(-1)
}

// tryStep steps the core with a caller's request on the caller's
// goroutine, if the core is free and no event waits for the loop (false:
// send it to the loop). If the step only answers callers, the answers go
// out at once; whatever else it asks for (writes, appends, a timer) is the
// loop's to perform, in its order.
func (d *driver) tryStep(ev engine.Event) bool {
	if !d.lockFree() {
		return false
	}
	defer d.mu.Unlock()
	d.core.Step(d.clock.Now(), ev)
	if !d.core.OnlyReplies() {
		d.poke() // the loop performs it all, and re-arms its timer
		return true
	}
	d.performReady()
	if at, ok := d.core.Deadline(); ok && !at.Equal(d.armed) {
		d.poke()
	}
	return true
}

// lockFree takes mu if it is free, no event waits for the loop and the
// core runs: a goroutine other than the loop may then step the core.
func (d *driver) lockFree() bool {
	if d.rt != nil && !d.rt.Fast() {
		return false // the seed says the mutex was taken
	}
	overtake := d.bug.Is(mutate.FastPathOvertakes)
	if d.queued.Load() != 0 && !overtake || !d.mu.TryLock() {
		return false
	}
	if d.queued.Load() != 0 && !overtake || d.core.View().Stopped() {
		d.mu.Unlock()
		return false
	}
	return true
}

// poke wakes the loop (if it is not awake already).
func (d *driver) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// performReady performs the core's actions, in the loop's reused list,
// and steps the core with the results perform had at once, until it asks
// for nothing more.
func (d *driver) performReady() {
	for {
		d.acts = d.core.AppendReady(d.acts[:0])
		d.perform(d.acts)
		clear(d.acts)
		if len(d.now) == 0 {
			return
		}
		now := d.clock.Now()
		for i, ev := range d.now {
			d.core.Step(now, ev)
			d.now[i] = nil
		}
		d.now = d.now[:0]
	}
}

// drain cancels every I/O and waits for the workers, stepping the stopped
// core with whatever still arrives (it refuses requests and ignores
// results), so that no worker or caller is left blocked.
func (d *driver) drain() {
	d.cancel()
	for _, p := range []*pool{d.commits, d.appends, d.cb} {
		p.close()
	}
	idle := make(chan struct{})
	d.spawn(func() {
		if d.rt != nil {
			d.rt.Park(func() bool { return d.jobs.Load() == 0 })
		} else {
			d.workers.Wait()
		}
		close(idle)
	})
	for {
		idleNow := idle
		if d.rt != nil {
			d.rt.Park(func() bool { return len(d.events) > 0 || closed(idle) })
			if len(d.events) > 0 {
				idleNow = nil // the events first, as the select may
			}
		}
		select {
		case ev := <-d.events:
			d.stepAndPerform(ev)
		case <-idleNow:
			for {
				select {
				case ev := <-d.events:
					d.stepAndPerform(ev)
				default:
					return
				}
			}
		}
	}
}

// stepAndPerform steps the stopped core with ev and performs what it asks.
func (d *driver) stepAndPerform(ev engine.Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.step(ev)
	d.performReady()
}

// stop asks the loop to stop the core with err (nil: Close).
func (d *driver) stop(err error) {
	d.stopOnce.Do(func() { d.stopc <- err })
}

// send delivers an event to the loop; false if the loop has exited. An
// event sent while it exits may be taken and never stepped: a caller waits
// for its answer or for done.
func (d *driver) send(ev engine.Event) bool {
	select {
	case <-d.done:
		return false
	default:
	}
	d.queued.Add(1)
	select {
	case d.events <- ev:
		return true
	case <-d.done:
		d.queued.Add(-1)
		return false
	}
}

// request delivers a caller's request: stepped at once by tryStep if it is
// one that is usually answered without I/O, by trySubmit if it is a Submit
// with nothing else in flight, else (or if neither can) sent to the loop;
// false if the loop has exited.
func (d *driver) request(ev engine.Event) bool {
	if _, ok := ev.(engine.Submit); ok {
		return d.trySubmit(ev) || d.send(ev)
	}
	return answersAtOnce(ev) && d.tryStep(ev) || d.send(ev)
}

// trySubmit steps the core with a Submit on the caller's goroutine, and
// performs what the step asks for (its PENDING write goes to a commits
// worker, or to an asynchronous catalog, as the loop would send it), if the
// core is free, no event waits for the loop and no task is in flight
// (false: send it to the loop). With tasks in flight the loop takes the
// Submit, to batch its write with theirs (group commit); without, there is
// no batch to join, and the hand-over to the loop only costs a wake-up.
// The caller's goroutine never runs the I/O itself: its context must still
// end its wait (the task goes on without it).
func (d *driver) trySubmit(ev engine.Event) bool {
	if !d.lockFree() {
		return false
	}
	defer d.mu.Unlock()
	if live, _ := d.core.View().Counts(); live > 0 {
		return false
	}
	d.core.Step(d.clock.Now(), ev)
	d.performReady()
	if at, ok := d.core.Deadline(); ok && !at.Equal(d.armed) {
		d.poke() // the loop re-arms its timer
	}
	return true
}

// answersAtOnce reports whether ev is a request the core usually answers
// without I/O: a key's original, a lock granted, a handle closed, a
// request withdrawn, a look at the core. A Submit (and an operator's
// action) always asks for a catalog write: it goes to the loop, which
// batches the writes of the requests it drains (group commit), so a caller
// stepping it would only split the batches; only a Submit with nothing in
// flight, which has no batch to join, is stepped by its caller
// (trySubmit).
func answersAtOnce(ev engine.Event) bool {
	switch ev.(type) {
	case engine.Resolve, engine.Lock, engine.Close, engine.Withdraw, engine.Inspect, engine.Wait, engine.WaitAcked:
		return true
	}
	return false
}

// call sends a request and waits for its reply. If ctx ends first it
// withdraws the request (see await) and returns ctx's error. If the loop
// has exited it returns ErrClosed.
func (d *driver) call(ctx context.Context, mk func(to engine.Target) engine.Event) (engine.Reply, error) {
	rc := d.replies.Get().(chan engine.Reply)
	if !d.request(mk(rc)) {
		d.replies.Put(rc) // the core never saw it
		return engine.Reply{}, d.b.closedErr()
	}
	return d.await(ctx, rc)
}

// await waits for the reply on rc to a request the core took. If ctx ends
// first, the request is withdrawn (withdraw) and await returns ctx's error,
// saying what the request waited for; if the loop exits first, ErrClosed.
// rc goes back to d.replies only once its reply was received.
func (d *driver) await(ctx context.Context, rc chan engine.Reply) (engine.Reply, error) {
	ctxDone, done := ctx.Done(), d.done
	if d.bug.Is(mutate.WaitIgnoresContext) {
		ctxDone = nil
	}
	if d.bug.Is(mutate.WaitDeafToClose) {
		done = nil
	}
	if d.rt != nil {
		ctxDone, done = d.parkAwait(ctx, rc, ctxDone, done)
	}
	select {
	case r := <-rc:
		// The core answers a request once: nothing else is sent on rc.
		d.replies.Put(rc)
		return r, nil
	case <-ctxDone:
		if d.bug.Is(mutate.CancelledNotWithdrawn) {
			return engine.Reply{}, ctx.Err()
		}
		return d.withdraw(ctx, rc)
	case <-done:
		select {
		case r := <-rc:
			return r, nil
		default:
		}
		return engine.Reply{}, d.b.closedErr()
	}
}

// parkAwait parks await on the simulator's runtime until one of its cases
// is ready and returns the channels of the cases left to select on: one
// case at a time, in a fixed order (a select picks among the ready ones at
// random), so the seed decides what is ready when. It is a function of its
// own so that, without the simulator, await's channels stay off the heap
// (its closure would capture them).
func (d *driver) parkAwait(ctx context.Context, rc chan engine.Reply, ctxDone <-chan struct{}, done chan struct{}) (<-chan struct{}, chan struct{}) {
	d.rt.Park(func() bool { return len(rc) > 0 || ctxDone != nil && ctx.Err() != nil || done != nil && closed(done) })
	switch {
	case len(rc) > 0:
		return nil, nil
	case done != nil && closed(done):
		return nil, done
	}
	return ctxDone, done
}

// withdraw takes back the request answered at rc, whose caller's context
// ended, and returns ctx's error saying what it waited for (R11.5). The
// core forgets the request wherever it waits and gives back what it holds
// for it (a queued lock request, an admission slot): a caller that gives up
// leaves nothing behind that could hold a key or a lock for it later
// (R7.3). A reply sent before the withdrawal is returned instead: the
// request was answered, and its caller handles the answer (a lock granted
// is its to release). The withdrawal is one step of the core: the caller
// waits for the loop (or steps the core itself), never for I/O.
func (d *driver) withdraw(ctx context.Context, rc chan engine.Reply) (engine.Reply, error) {
	select {
	case r := <-rc:
		d.replies.Put(rc)
		return r, nil
	default:
	}
	var waited *engine.Waited
	wc := make(chan engine.Reply, 1)
	if d.request(engine.Withdraw{To: rc, Done: wc}) {
		done := d.done
		if d.rt != nil {
			d.rt.Park(func() bool { return len(wc) > 0 || closed(d.done) })
			if len(wc) > 0 {
				done = nil
			}
		}
		select {
		case r := <-wc:
			waited = r.Waited
		case <-done: // stopping answered every request
		}
	}
	select {
	case r := <-rc:
		d.replies.Put(rc)
		return r, nil
	default:
	}
	// rc is not reused: a request the core cannot withdraw (a Follow's
	// write in flight) may still be answered on it.
	return engine.Reply{}, waitErr(ctx.Err(), waited)
}

// callAll is call for n requests, sent to the loop one after another
// without waiting, so that the loop takes them in one wake-up; it waits for
// every reply. errs is nil when every request was answered; else errs[i]
// says why request i was not (the loop exited, or ctx ended first).
func (d *driver) callAll(ctx context.Context, n int, mk func(i int, to engine.Target) engine.Event) (rs []engine.Reply, errs []error) {
	rs = make([]engine.Reply, n)
	fail := func(i int, err error) {
		if errs == nil {
			errs = make([]error, n)
		}
		errs[i] = err
	}
	rcs := make([]chan engine.Reply, n)
	for i := range n {
		rc := d.replies.Get().(chan engine.Reply)
		if !d.send(mk(i, rc)) {
			d.replies.Put(rc)
			fail(i, d.b.closedErr())
			continue
		}
		rcs[i] = rc
	}
	for i, rc := range rcs {
		if rc == nil {
			continue
		}
		var err error
		if rs[i], err = d.await(ctx, rc); err != nil {
			fail(i, err)
		}
	}
	return rs, errs
}

// newReplyChan makes a reply channel for d.replies.
func newReplyChan() any { return make(chan engine.Reply, 1) }

// waitErr is err (the caller's context ended) saying, when the request
// waited for a task, which task and what it was waiting for: a caller stuck
// behind a frozen catalog or WAL learns which one.
func waitErr(err error, w *engine.Waited) error {
	switch {
	case w == nil:
		return err
	case w.ID == 0 && w.Group != 0:
		return fmt.Errorf("waiting for its turn in group %d, behind the member before it: %w", w.Group, err)
	case w.ID == 0:
		return fmt.Errorf("waiting for the catalog to allocate the broadcast's id: %w", err)
	}
	return fmt.Errorf("broadcast %d was %s: %w", w.ID, stageWaiting(w.Stage), err)
}

// stageWaiting says what a task in stage s waits for.
func stageWaiting(s engine.Stage) string {
	switch s {
	case engine.Persisting:
		return "waiting for the catalog to write its PENDING record"
	case engine.FirstPhase:
		return "waiting for its first-phase copies to be appended and acked"
	case engine.Appending:
		return "waiting for the WAL to append its copies"
	case engine.Acking:
		return "waiting for its consumers to ack its copies"
	case engine.Queued:
		return "waiting for acks or for conflicting callbacks before it"
	case engine.Calling:
		return "waiting for its callback to return"
	case engine.Backoff:
		return "waiting to retry its failed callback"
	case engine.Tombstoning:
		return "waiting for the catalog to write its TOMBSTONE"
	}
	return "in stage " + s.String()
}

// inspect runs fn on the core between two events and waits for it; false
// if the loop has exited (fn did not run).
func (d *driver) inspect(fn func(c engine.View)) bool {
	ok := make(chan struct{})
	if !d.request(engine.Inspect{Fn: func(c engine.View) { fn(c); close(ok) }}) {
		return false
	}
	done := d.done
	if d.rt != nil {
		d.rt.Park(func() bool { return closed(ok) || closed(d.done) })
		if closed(ok) {
			done = nil
		}
	}
	select {
	case <-ok:
		return true
	case <-done:
		// An event sent as the loop exited is never stepped (R11.5).
		select {
		case <-ok:
			return true
		default:
			return false
		}
	}
}

// closed reports whether ch is closed.
func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// result delivers a worker's result; a stopped loop still takes it.
func (d *driver) result(ev engine.Event) {
	d.queued.Add(1)
	if d.rt != nil && closed(d.done) {
		d.queued.Add(-1)
		return
	}
	select {
	case d.events <- ev:
	case <-d.done:
		d.queued.Add(-1)
	}
}

// finish delivers the result of a worker's job. If the core is free, no
// event waits for the loop and no other task is in flight, the worker steps
// the core with it itself (as tryStep does a caller's request) and performs
// what the step asks for: the first catalog write or WAL append it runs
// itself, on this goroutine, and finishes with its result in turn; the rest
// goes to the pools as the loop would send it. Otherwise the result goes to
// the loop. Either way the core takes the result in the order the loop
// would: after every event sent before it.
func (d *driver) finish(ev engine.Event) {
	for {
		j, ok := d.stepResult(ev)
		if !ok {
			d.result(ev)
			return
		}
		if j.act.Kind == engine.ActNone {
			return
		}
		ev = d.io(j)
	}
}

// stepResult steps the core with a worker's result if the core is free, no
// event waits and at most one task is live (false: send it to the loop),
// performs the actions, and returns the write or append kept for the worker
// (none: its act's Kind is ActNone).
func (d *driver) stepResult(ev engine.Event) (job, bool) {
	if !d.lockFree() {
		return job{}, false
	}
	defer d.mu.Unlock()
	if live, _ := d.core.View().Counts(); live > 1 {
		// Other tasks are in flight: the loop gathers their results
		// with this one into one batch of writes, appends and replies.
		return job{}, false
	}
	d.core.Step(d.clock.Now(), ev)
	d.keep = true
	d.performReady()
	j := d.kept
	d.keep, d.kept = false, job{}
	if at, ok := d.core.Deadline(); ok && !at.Equal(d.armed) {
		d.poke() // the loop re-arms its timer
	}
	return j, true
}

// keepJob reports whether perform hands j to the worker whose finish is
// performing (it keeps the first I/O job it is given).
func (d *driver) keepJob(j job) bool {
	if !d.keep || d.kept.act.Kind != engine.ActNone {
		return false
	}
	d.kept = j
	return true
}

// perform carries out the core's actions: I/O goes to the pools as jobs
// (the action as the core decided it, a value: nothing is allocated to
// hand it over).
func (d *driver) perform(acts []engine.Action) {
	for i := range acts {
		act := &acts[i]
		switch act.Kind {
		case engine.ActReply:
			a := act.Reply
			select {
			case a.To.(chan engine.Reply) <- a:
			default:
				d.b.log.Error("engine bug: a second reply to one request", "reply", fmt.Sprintf("%+v", a))
			}
		case engine.ActWrite:
			switch {
			case d.async != nil:
				d.writeAsync(act.Write)
			case !d.keepJob(job{act: *act}):
				d.submit(d.commits, job{act: *act})
			}
		case engine.ActAppend:
			if !d.keepJob(job{act: *act}) {
				d.submit(d.appends, job{act: *act})
			}
		case engine.ActCallback:
			a := &act.Callback
			if d.b.cfg.Callbacks.ack(a.Msg.Type) == nil {
				// A type without a callback is done at once (callbacks
				// are all registered before New): no worker is woken to run nothing.
				d.now = append(d.now, engine.CallbackDone{Task: a.Task, Attempt: a.Attempt, Outcome: Outcome{Status: Succeeded}})
				continue
			}
			ctx, cancel := context.WithCancel(d.ctx)
			d.cbMu.Lock()
			d.cbCancels[a.Task] = cancel
			d.cbMu.Unlock()
			d.submit(d.cb, job{act: *act, ctx: ctx, cancel: cancel})
		case engine.ActCancelCallback:
			d.cbMu.Lock()
			if cancel := d.cbCancels[act.CancelCallback.Task]; cancel != nil {
				cancel()
			}
			d.cbMu.Unlock()
		case engine.ActAckOnce:
			d.submit(d.cb, job{act: *act})
		case engine.ActScan:
			d.submit(d.commits, job{act: *act})
		case engine.ActRoleChanged:
			d.b.setRole(act.RoleChanged.Role, act.RoleChanged.Config)
		case engine.ActFenced:
			d.b.fenced(act.Fenced.Err)
		default:
			panic(fmt.Sprintf("broadcast: unknown action %s", act.Kind))
		}
	}
}

// submit hands j to pool p, or runs it on a goroutine of the simulator's
// runtime.
func (d *driver) submit(p *pool, j job) {
	if d.rt == nil {
		p.submit(j)
		return
	}
	d.goSim(j)
}

// goSim runs j on a goroutine of the simulator's runtime. (A function of
// its own: the closure captures j, a value too large to copy into it, so
// j goes to the heap, which a run without the simulator need not pay.)
func (d *driver) goSim(j job) {
	d.jobs.Add(1)
	d.rt.Go(func() {
		defer d.jobs.Add(-1)
		d.run(j)
	})
}

// job is an action for a pool's worker; a callback's with its context.
type job struct {
	act    engine.Action
	ctx    context.Context
	cancel context.CancelFunc
}

// run performs a job on a pool's worker.
func (d *driver) run(j job) {
	switch j.act.Kind {
	case engine.ActWrite, engine.ActAppend:
		d.finish(d.io(j))
	case engine.ActCallback:
		d.finish(d.callback(j.ctx, j.cancel, j.act.Callback))
	case engine.ActAckOnce:
		d.finish(d.ackOnce(j.act.AckOnce))
	case engine.ActScan:
		d.finish(d.scan(j.act.Scan))
	}
}

// io performs a catalog write or a WAL append and returns its result.
func (d *driver) io(j job) engine.Event {
	if j.act.Kind == engine.ActWrite {
		return d.write(j.act.Write)
	}
	return d.append(j.act.Append)
}

// write performs a write on a worker: it waits for the commit.
func (d *driver) write(w engine.Write) engine.Event {
	ops, rec, msg, buf, err := writeOps(w)
	if err != nil {
		return engine.Written{ID: w.ID, Err: err}
	}
	err = d.b.cat.Commit(d.ctx, ops...)
	if err != nil && d.ctx.Err() != nil && !catalog.NotApplied(err) {
		// Cut short by Close: the commit may still apply.
		err = fmt.Errorf("%w (broadcaster closing)", err)
	}
	if d.ctx.Err() == nil {
		// The commit returned its answer: the catalog holds ops no more.
		putOps(buf, ops)
	}
	d.b.spans.written(w, err)
	return engine.Written{ID: w.ID, Err: err, Record: rec, Message: msg}
}

// writeAsync hands a write to the catalog from the loop, which goes on at
// once; the commit's answer comes back through the write's asyncWrite. A
// write refused before it was queued (its record does not encode, a closed
// catalog, too many ops) has its answer at once.
func (d *driver) writeAsync(w engine.Write) {
	ops, rec, msg, buf, err := writeOps(w)
	if err == nil {
		aw := asyncWrites.Get().(*asyncWrite)
		*aw = asyncWrite{d: d, w: w, ops: ops, rec: rec, msg: msg, buf: buf}
		if err = d.async.CommitAsync(aw, ops...); err == nil {
			return
		}
		putOps(buf, ops)
		*aw = asyncWrite{}
		asyncWrites.Put(aw)
	}
	d.b.spans.written(w, err)
	d.now = append(d.now, engine.Written{ID: w.ID, Err: err})
}

// asyncWrite is a write handed to an AsyncCommitter, waiting for its
// answer.
type asyncWrite struct {
	d        *driver
	w        engine.Write
	ops      []catalog.Op
	rec, msg []byte
	buf      *[]catalog.Op
}

var asyncWrites = sync.Pool{New: func() any { return new(asyncWrite) }}

// Committed delivers the write's answer to the loop, on the catalog's
// goroutine. After Close the stopped core ignores it (and result drops it
// once the loop has exited), as it does a worker's write cut short.
func (aw *asyncWrite) Committed(err error) {
	d, w, rec, msg := aw.d, aw.w, aw.rec, aw.msg
	putOps(aw.buf, aw.ops)
	*aw = asyncWrite{}
	asyncWrites.Put(aw)
	d.b.spans.written(w, err)
	d.result(engine.Written{ID: w.ID, Err: err, Record: rec, Message: msg})
}

// writeOps returns the ops of w: with its record, encoded, first. buf is
// the pooled list they were built in (nil: w.Ops as they are), for putOps.
func writeOps(w engine.Write) (ops []catalog.Op, rec, msg []byte, buf *[]catalog.Op, err error) {
	if w.Record == nil {
		return w.Ops, nil, nil, nil, nil
	}
	if rec, msg, err = engine.EncodeRecord(w.Record); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("%w: encode record: %w", catalog.ErrInvalid, err)
	}
	buf = opBufs.Get().(*[]catalog.Op)
	ops = append(append((*buf)[:0], catalog.Put(w.Record.Key, rec)), w.Ops...)
	return ops, rec, msg, buf, nil
}

// putOps gives back the pooled list ops were built in, once the catalog
// has answered their commit and holds them no more.
func putOps(buf *[]catalog.Op, ops []catalog.Op) {
	if buf == nil {
		return
	}
	clear(ops)
	*buf = ops[:0]
	opBufs.Put(buf)
}

// opBufs are the op lists of record writes, reused once their commit has
// answered.
var opBufs = sync.Pool{New: func() any { b := make([]catalog.Op, 0, 4); return &b }}

func (d *driver) append(a engine.Append) engine.Event {
	res, err := d.b.cfg.WAL.AppendSalted(d.ctx, a.Lane, d.b.salt, a.Items)
	return engine.Appended{ID: a.ID, Results: res, Err: err}
}

// callback runs one attempt of a task's ack callback. Its context carries
// the attempt's span (application spans nest under it) and is cancelled by
// Close or an operator's CompleteCallback.
func (d *driver) callback(ctx context.Context, cancel context.CancelFunc, a engine.Callback) engine.Event {
	defer func() {
		d.cbMu.Lock()
		delete(d.cbCancels, a.Task)
		d.cbMu.Unlock()
		cancel()
	}()
	eff := newEffects(d.b.cfg.Prefix)
	var err error
	if fn := d.b.cfg.Callbacks.ack(a.Msg.Type); fn != nil {
		cctx, span := d.b.spans.start(ctx, a.Task, a.Msg, tracing.SpanCallback)
		if span.IsRecording() {
			span.SetAttributes(tracing.AttrAttempt.Int(a.Attempt))
		}
		start := time.Now()
		ev := &Event{Message: a.Msg, Results: a.Results, Extras: a.Extras, Attempt: a.Attempt, Effects: eff}
		err = wait.Safely("callback", func() error { return fn(cctx, ev) })
		d.b.obs.Callback(a.Msg.Type, time.Since(start), err)
		endSpan(span, err)
	}
	switch {
	case err != nil && IsPermanent(err) && !d.bug.Is(mutate.PermanentRetried):
		// No retry can fix it: the task ends failed, without the
		// attempt's effects (R11.6).
		return engine.CallbackDone{Task: a.Task, Attempt: a.Attempt, Outcome: Outcome{Status: Failed, Detail: err.Error()}}
	case err != nil:
		return engine.CallbackDone{Task: a.Task, Attempt: a.Attempt, Err: err}
	}
	return engine.CallbackDone{Task: a.Task, Attempt: a.Attempt, Ops: eff.ops, Outcome: eff.outcome}
}

func (d *driver) ackOnce(a engine.AckOnce) engine.Event {
	var err error
	if fn := d.b.cfg.Callbacks.ackOnce(a.Msg.Type); fn != nil {
		ev := &AckEvent{Message: a.Msg, VChannel: a.VChannel, Checkpoint: a.Checkpoint}
		ctx := d.ctx
		if a.Ctx != nil {
			// The acker's context, bounded by the broadcaster's life.
			var stop func()
			ctx, stop = mergeCancel(a.Ctx, d.ctx)
			defer stop()
		}
		err = wait.Safely("callback", func() error { return fn(ctx, ev) })
	}
	return engine.AckOnceDone{ID: a.ID, Err: err}
}

func (d *driver) scan(s engine.Scan) engine.Event {
	var found []engine.Found
	err := d.b.cfg.WAL.ReadToEnd(d.ctx, s.PChannel, s.From, func(c wal.Copy) error {
		found = append(found, engine.Found{ID: c.Message.Broadcast.ID, VChannel: c.VChannel, Checkpoint: c.Checkpoint})
		return nil
	})
	if err != nil {
		found = nil
	}
	return engine.Scanned{ID: s.ID, Found: found, Err: err}
}

// pool runs jobs (with run) on at most max goroutines, started on demand; up to
// keepIdle of them stay parked when idle (so that an uncontended broadcast
// does not start a goroutine per write, append and callback), the others
// end. submit never blocks; close lets the parked ones end once the queue
// is empty. A job a worker's finish keeps runs on that worker, outside any
// pool's count: max bounds goroutines, while the core bounds concurrent
// appends itself (R4.3).
type pool struct {
	wg      *sync.WaitGroup
	mu      sync.Mutex
	wake    *sync.Cond
	run     func(job)
	queue   []job
	head    int // queue[head:] waits
	running int
	idle    int // parked workers not yet woken
	max     int
	closed  bool
}

// keepIdle is how many idle workers a pool keeps parked.
const keepIdle = 4

func newPool(wg *sync.WaitGroup, max int, run func(job)) *pool {
	p := &pool{wg: wg, max: max, run: run}
	p.wake = sync.NewCond(&p.mu)
	return p
}

func (p *pool) submit(j job) {
	p.mu.Lock()
	p.queue = append(p.queue, j)
	switch {
	case p.idle > 0:
		p.idle-- // this worker is spoken for
		p.wake.Signal()
		p.mu.Unlock()
	case p.running < p.max:
		p.running++
		p.wg.Add(1)
		p.mu.Unlock()
		go p.work()
	default:
		p.mu.Unlock()
	}
}

func (p *pool) work() {
	defer p.wg.Done()
	p.mu.Lock()
	for {
		if p.head == len(p.queue) {
			if p.closed || p.idle >= keepIdle {
				p.running--
				p.mu.Unlock()
				return
			}
			p.idle++
			p.wake.Wait() // submit or close took this worker off idle
			continue
		}
		j := p.queue[p.head]
		p.queue[p.head] = job{}
		p.head++
		if p.head == len(p.queue) {
			p.queue, p.head = p.queue[:0], 0
		}
		p.mu.Unlock()
		p.run(j)
		p.mu.Lock()
	}
}

// close ends the parked workers, and each running one once the queue is
// empty.
func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	p.idle = 0
	p.wake.Broadcast()
	p.mu.Unlock()
}

// mergeCancel returns ctx (values and all) cancelled also when other ends.
func mergeCancel(ctx, other context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(other, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}
