package engine

import (
	"bytes"
	"container/heap"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/walcast/walcast/internal/idset"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// Core is the broadcast engine's decision core: a state machine stepped by
// events (Step) that returns what to do next (Ready) and when to be woken
// (Deadline). It holds every rule of the engine — the task state machine
// (transitions.go), the issuance lock table, the idempotency index, the
// callback order, the tombstones and their GC, the id allocator, the
// replication role and force promote — and does no I/O, starts no
// goroutine and reads no clock: the time comes with each Step. It is not
// safe for concurrent use; one driver steps it.
type Core struct {
	cfg Config
	obs Observer
	log *slog.Logger
	now time.Time
	out outbox
	seq uint64 // ids of writes, appends, ack-once runs and scans

	tasks map[uint64]*task
	// timelines are the timelines of the tasks that finished last.
	timelines timelines
	handles   handleTable
	locks     resource.Table
	idem      idemIndex // first owner wins (R7.3), admission slots
	// recovering is the recovery under way (nil once recovered): the
	// index finds the tombstones it gathered there.
	recovering *recovery
	// groups are the open groups and their owner keys (R13.1, R13.7).
	groups groupTable
	sched  scheduler
	tombs  tombstones
	ids    ids
	roles  roles
	prom   *promoter
	// promotes holds, per force promote, the positions its copies landed
	// at (recovered, or recorded by this run).
	promotes map[uint64]map[message.VChannel]uint64
	// promotesOld marks positions recovered in the first record format.
	promotesOld map[uint64]bool

	lanes  appendLanes
	acks   ackTracker
	writes writer
	scans  scanner

	// collected are the replicated broadcasts whose tombstones GC deleted
	// (durable, written with the deletes): a late ack of one is stale and
	// must not create its task again (#86).
	collected idset.Set

	timers timers
	gc     collector
	stats  Stats

	stopped bool
	stopErr error
}

// Stats are counters of a core's life.
type Stats struct {
	Broadcasts, Duplicates, CatalogCommits, AppendRounds, AppendRetries int
	CallbackFailures, Evicted, EarlyEvicted, Recovered, StaleAcks       int
	// Bugs counts moves the transition table does not have (0 unless the
	// engine has a bug; the simulator checks it); LastBug describes the
	// latest.
	Bugs    int
	LastBug string
}

// Snapshot is what recovery reads from the catalog: every record under the
// core's prefix that matters (R4.8).
type Snapshot struct {
	// Tasks are the task records, any order.
	Tasks []RawRecord
	// IDFloor is the persisted id floor (0 if none).
	IDFloor uint64
	// Topology is the stored replication topology (zero: none, primary).
	Topology ReplicateConfig
	// Promotes are the force promotes' recorded positions, by task id.
	Promotes map[uint64][]byte
	// Collected is the encoded set of collected replicated broadcast ids
	// (nil: none).
	Collected []byte
}

// RawRecord is one task record as stored.
type RawRecord struct {
	ID  uint64
	Raw []byte
}

// New returns a core recovered from snap at time now (R4.8). Its first
// actions (appends of recovered tasks, GC) are in Ready. A conflict between
// the keys of two recovered pending tasks, or a record that does not
// decode, is reported as ErrCorruptCatalog.
func New(cfg Config, snap Snapshot, now time.Time) (*Core, error) {
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if len(cfg.Classes) == 0 || len(cfg.Classes) >= tombReplicated {
		return nil, fmt.Errorf("engine: %d retention classes (1 to %d)", len(cfg.Classes), tombReplicated-1)
	}
	if cfg.ClassOf == nil {
		cfg.ClassOf = func(message.Type) int { return 0 }
	}
	if cfg.HasAckOnce == nil {
		cfg.HasAckOnce = func(message.Type) bool { return false }
	}
	if cfg.Lane == nil {
		cfg.Lane = func(p message.PChannel) message.PChannel { return p }
	}
	if cfg.AppendConcurrency <= 0 {
		cfg.AppendConcurrency = 1
	}
	c := &Core{
		cfg: cfg, obs: cfg.Observer, log: cfg.Logger, now: now,
		tasks:    make(map[uint64]*task),
		groups:   newGroupTable(cfg.MaxGroupMembers),
		promotes: make(map[uint64]map[message.VChannel]uint64), promotesOld: make(map[uint64]bool),
	}
	c.locks.Now = func() int64 { return c.now.UnixNano() }
	c.gc = collector{tombs: &c.tombs, ids: &c.ids, idem: &c.idem, groups: &c.groups, collected: &c.collected, writes: &c.writes,
		timers: &c.timers, obs: c.obs, stats: &c.stats, log: c.log, prefix: cfg.Prefix, maxOps: cfg.Limits.MaxOps,
		checkInterval: cfg.CheckInterval, mutation: cfg.Mutation, now: func() time.Time { return c.now }, resumeIDs: func() { c.ids.resume(c) }}
	c.timers = timers{now: func() time.Time { return c.now }, seq: c.nextID, stopped: &c.stopped}
	c.idem = newIdemIndex(cfg.IndexScopeBits, c.scopeOfID)
	c.groups.tombs, c.groups.roles, c.groups.out, c.groups.handles, c.groups.locks = &c.tombs, &c.roles, &c.out, &c.handles, &c.locks
	c.groups.log, c.groups.prefix, c.groups.mutation = c.log, cfg.Prefix, cfg.Mutation
	c.groups.live = func(id uint64) bool { return c.tasks[id] != nil }
	c.groups.submit, c.groups.joinEnd, c.groups.schedule, c.groups.move = c.submitMember, c.joinEnd, c.schedule, c.move
	c.handles = handleTable{byID: make(map[HandleID]*handle), locks: &c.locks, idem: &c.idem, roles: &c.roles, out: &c.out,
		now: func() time.Time { return c.now }, original: c.original, log: c.log, maxKeyLength: cfg.MaxKeyLength, mutation: cfg.Mutation}
	tlog := func(t *task) *slog.Logger { return taskLog(c.log, t) }
	c.lanes = newAppendLanes(cfg)
	c.lanes.nextID, c.lanes.out, c.lanes.stats, c.lanes.after, c.lanes.backoff = c.nextID, &c.out, &c.stats, c.timers.after, c.cfg.Backoff.Schedule
	c.lanes.obs, c.lanes.log, c.lanes.laneOf, c.lanes.unqueued = c.obs, c.log, cfg.Lane, c.unqueued
	c.lanes.live = func(t *task) bool { return c.tasks[t.id] == t }
	c.acks = ackTracker{runs: make(map[uint64]ackOnceRef), hasAckOnce: cfg.HasAckOnce,
		nextID: c.nextID, out: &c.out, now: func() time.Time { return c.now }, after: c.timers.after,
		backoff: c.cfg.Backoff.Schedule, live: func(t *task) bool { return c.tasks[t.id] == t }, log: tlog,
		acked: c.acked, persist: c.persistAcks}
	c.scans = scanner{ops: make(map[uint64]*scanOp), nextID: c.nextID, out: &c.out, log: c.log, after: c.timers.after, backoff: c.cfg.Backoff.Schedule}
	c.roles.cluster, c.roles.prefix, c.roles.out, c.roles.log = cfg.ClusterName, cfg.Prefix, &c.out, tlog
	c.writes = writer{ops: make(map[uint64]*writeOp), prefix: cfg.Prefix, core: c, nextID: c.nextID, out: &c.out,
		stats: &c.stats, obs: c.obs, after: c.timers.after, backoff: c.cfg.Backoff.Schedule, log: tlog,
		live: func(t *task) bool { return c.tasks[t.id] == t }, fence: c.fence, mutation: cfg.Mutation}
	c.sched.init()
	c.sched.backoff = c.cfg.Backoff.Schedule
	c.tombs.init(cfg.Classes)
	if err := c.recover(snap); err != nil {
		return nil, err
	}
	c.gc.periodic()
	c.gc.run(true)
	return c, nil
}

// Step applies one event at time now.
func (c *Core) Step(now time.Time, ev Event) {
	c.now = now
	c.timers.fireDue()
	if c.stopped {
		c.refuseStopped(ev)
		return
	}
	switch e := ev.(type) {
	case Resolve:
		c.handles.resolve(e)
	case Lock:
		c.handles.lock(e)
	case Close:
		c.handles.close(e.Handle)
	case Submit:
		c.submit(e)
	case Wait:
		c.wait(e)
	case WaitAcked:
		c.waitAcked(e)
	case Ack:
		c.ack(e)
	case Follow:
		c.follow(e, e.Handle)
	case RetryNow:
		c.retryNow(e)
	case Complete:
		c.complete(e)
	case Withdraw:
		c.out.reply(e.Done, Reply{Waited: c.withdraw(e.To)})
	case Inspect:
		e.Fn(c.View())
	case Written:
		c.writes.written(e)
	case Appended:
		c.appended(e)
	case CallbackDone:
		c.callbackDone(e)
	case AckOnceDone:
		c.acks.done(e)
	case Scanned:
		c.scans.scanned(e)
	case Tick:
	case Stop:
		c.stop(e.Err)
	default:
		panic(fmt.Sprintf("engine: unknown event %T", ev))
	}
	c.timers.fireDue()
}

// Ready returns the actions to perform and forgets them.
func (c *Core) Ready() []Action {
	out := c.out.acts
	c.out.acts = nil
	return out
}

// AppendReady appends the actions to perform to dst, forgets them and
// returns the extended slice: a driver that reuses dst and the core its own
// buffer allocates nothing per step for the list of actions.
func (c *Core) AppendReady(dst []Action) []Action {
	dst = append(dst, c.out.acts...)
	clear(c.out.acts)
	c.out.acts = c.out.acts[:0]
	return dst
}

// OnlyReplies reports whether every action ready is a Reply (also when
// none is): a driver may deliver those on any goroutine, while the other
// actions are I/O for its workers.
func (c *Core) OnlyReplies() bool { return c.out.onlyReplies() }

// Deadline returns when the core must be stepped next (with a Tick) and
// whether it has anything scheduled.
func (c *Core) Deadline() (time.Time, bool) {
	return c.timers.next()
}

func (c *Core) nextID() uint64 {
	c.seq++
	return c.seq
}

// move takes t along a row of the transition table and runs the new
// stage's entry work. A move the table does not have is a bug: it is
// logged loudly and the task stays where it is.
func (c *Core) move(t *task, on Trigger, to Stage) {
	from := t.stage
	if !allowed(from, on, to) {
		taskLog(c.log, t).Error("engine bug: transition not in the table", "broadcast", t.id, "from", from.String(),
			"on", on.String(), "to", to.String())
		c.stats.Bugs++
		c.stats.LastBug = fmt.Sprintf("broadcast %d: %s --%s--> %s", t.id, from, on, to)
		return
	}
	t.stage = to
	c.obs.Stage(t.id, t.msg, from, to)
	c.enter(t, from)
}

// enter does the work of t's new stage.
func (c *Core) enter(t *task, from Stage) {
	switch t.stage {
	case Persisting:
		c.persistPending(t)
	case FirstPhase:
		c.startFirstPhase(t)
	case Appending:
		c.startAppends(t)
	case Acking:
		c.acks.fastAckAll(t)
		c.checkAcked(t)
	case Queued:
		if !t.enrolled {
			c.sched.enroll(t)
		}
		c.schedule(t)
	case Promoting:
		c.startPromote(t)
	case Calling:
		c.startCallback(t)
	case Backoff:
	case Tombstoning:
		c.tombstone(t)
	case Collecting:
	}
}

// Timers. A deadline runs fn when due; a cancelled one is skipped.

type deadline struct {
	at        time.Time
	seq       uint64
	fn        func()
	cancelled bool
}

// cancel stops d from running; nil is fine.
func (d *deadline) cancel() {
	if d != nil {
		d.cancelled = true
	}
}

type deadlines []*deadline

func (h deadlines) Len() int { return len(h) }
func (h deadlines) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h deadlines) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *deadlines) Push(x any)   { *h = append(*h, x.(*deadline)) }
func (h *deadlines) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return x
}

// timers are the core's deadlines: each runs its function once the time a
// Step brings reaches it, in deadline order (ties in the order they were
// set); a cancelled one, or any once the core stopped, is skipped.
type timers struct {
	heap deadlines
	// What the timers use of their core: the time, the sequence that
	// orders ties (the core's ids) and whether it stopped.
	now     func() time.Time
	seq     func() uint64
	stopped *bool
}

// after schedules fn d from now.
func (ts *timers) after(d time.Duration, fn func()) *deadline {
	dl := &deadline{at: ts.now().Add(d), seq: ts.seq(), fn: fn}
	heap.Push(&ts.heap, dl)
	return dl
}

// fireDue runs every deadline due by now, in deadline order.
func (ts *timers) fireDue() {
	now := ts.now()
	for len(ts.heap) > 0 && !ts.heap[0].at.After(now) {
		d := heap.Pop(&ts.heap).(*deadline)
		if d.cancelled || *ts.stopped {
			continue
		}
		d.cancelled = true
		d.fn()
	}
}

// next returns the earliest deadline not cancelled, false if none.
func (ts *timers) next() (time.Time, bool) {
	for len(ts.heap) > 0 && ts.heap[0].cancelled {
		heap.Pop(&ts.heap)
	}
	if len(ts.heap) == 0 {
		return time.Time{}, false
	}
	return ts.heap[0].at, true
}

// fence stops the core after the catalog reported a newer term: a deposed
// coordinator writes nothing more (R9.2).
func (c *Core) fence(err error) {
	if c.stopped {
		return
	}
	c.obs.Fenced()
	c.log.Error("broadcaster fenced: a newer coordinator term exists; stopping", "err", err)
	c.out.fenced(err)
	c.stop(fmt.Errorf("%w: %w", ErrClosed, err))
}

// stop answers every waiter and stops the core.
func (c *Core) stop(err error) {
	if c.stopped {
		return
	}
	if err == nil {
		err = ErrClosed
	}
	c.stopped, c.stopErr = true, err
	c.ids.waiting = nil
	// In id order, so that a replay answers in the same order.
	hids := slices.Sorted(maps.Keys(c.handles.byID))
	for _, id := range hids {
		h := c.handles.byID[id]
		if h.to != nil {
			c.out.reply(h.to, Reply{Err: fmt.Errorf("%w: %w", ErrTaskNotCreated, err)})
			h.to = nil
		}
	}
	scopes := slices.SortedFunc(maps.Keys(c.idem.admits), func(a, b Scope) int { return bytes.Compare(a[:], b[:]) })
	for _, sc := range scopes {
		a := c.idem.admits[sc]
		for _, r := range a.waiters {
			c.out.reply(r.To, Reply{Err: fmt.Errorf("%w: %w", ErrTaskNotCreated, err)})
		}
		a.waiters = nil
	}
	for _, id := range slices.Sorted(maps.Keys(c.tasks)) {
		t := c.tasks[id]
		var werr error
		if t.stage == Persisting && !t.maybePersisted {
			werr = fmt.Errorf("%w: %w", ErrTaskNotCreated, err)
		} else {
			werr = fmt.Errorf("broadcast %d was created and completes after recovery: %w", t.id, err)
		}
		for _, to := range t.waiters {
			c.out.reply(to, Reply{Err: werr})
		}
		t.waiters = nil
		for _, a := range t.ackWaiters {
			c.out.reply(a.to, Reply{Err: fmt.Errorf("ack of broadcast %d: %w", t.id, err)})
		}
		t.ackWaiters = nil
		for i := range t.copies {
			for _, to := range t.copies[i].ackOnceWaiters {
				c.out.reply(to, Reply{Err: fmt.Errorf("ack of broadcast %d: %w", t.id, err)})
			}
			t.copies[i].ackOnceWaiters = nil
		}
		for _, to := range t.completeWaits {
			c.out.reply(to, Reply{Err: err})
		}
		t.completeWaits = nil
		for _, a := range t.ackWaits {
			c.out.reply(a.to, Reply{Err: fmt.Errorf("acks of broadcast %d: %w", t.id, err)})
		}
		t.ackWaits = nil
	}
}

// refuseStopped answers a request that arrives after Stop.
func (c *Core) refuseStopped(ev Event) {
	notCreated := fmt.Errorf("%w: %w", ErrTaskNotCreated, c.stopErr)
	switch e := ev.(type) {
	case Resolve:
		c.out.reply(e.To, Reply{Err: notCreated})
	case Lock:
		c.out.reply(e.To, Reply{Err: notCreated})
	case Submit:
		c.out.reply(e.To, Reply{Err: notCreated})
	case Wait:
		c.out.reply(e.To, Reply{Err: c.stopErr})
	case WaitAcked:
		c.out.reply(e.To, Reply{Err: c.stopErr})
	case Ack:
		c.out.reply(e.To, Reply{Err: c.stopErr})
	case Follow:
		c.out.reply(e.To, Reply{Err: notCreated})
	case RetryNow:
		c.out.reply(e.To, Reply{Err: c.stopErr})
	case Complete:
		c.out.reply(e.To, Reply{Err: c.stopErr})
	case Withdraw:
		c.out.reply(e.Done, Reply{}) // Stop answered every request
	case Inspect:
		e.Fn(c.View())
	}
}
