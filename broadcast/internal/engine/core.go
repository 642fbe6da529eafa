package engine

import (
	"bytes"
	"cmp"
	"container/heap"
	"encoding/binary"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/walcast/walcast/broadcast/internal/mutate"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/idset"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// Core is the broadcast engine's decision core: a state machine stepped by
// events (Step) that returns what to do next (Ready) and when to be woken
// (Deadline). It holds every rule of the engine — the task state machine
// (types.go), the issuance lock table, the idempotency index, the
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

// recover rebuilds the core from the catalog (R4.8): PENDING tasks re-take
// their resource keys (a conflict is corrupt metadata) and resume
// appending; REPLICATED tasks wait for acks, those whose control copy is
// acked enrolled in control-channel order; open groups take their keys
// again (R13.1); tombstones re-enter GC with their persisted completion
// time (R6.3), a finished group's together; the idempotency index is
// rebuilt for every state; the id floor stays above every id seen.
func (c *Core) recover(s Snapshot) error {
	c.roles.set(s.Topology)
	if err := recoverSide(s, &c.collected, c.promotes, c.promotesOld); err != nil {
		return err
	}
	rs := &recovery{perClass: make([][]tomb, len(c.tombs.classes))}
	err := c.recoverRecords(s, rs)
	if err == nil {
		err = c.groups.recover(rs, c.cfg.Types)
	}
	if err != nil {
		for _, t := range rs.pending {
			c.locks.Release(t.lock)
		}
		for _, g := range c.groups.open {
			if g.lock != nil {
				c.locks.Release(g.lock)
			}
		}
		return err
	}
	var restart int64
	if c.cfg.Mutation.Is(mutate.WindowMovesOnRestart) {
		restart = c.now.UnixNano()
	}
	c.tombs.loadRecovered(rs, c.cfg.ClassOf, restart)
	c.ids.start(s.IDFloor, rs.maxID)
	c.stats.Recovered = len(rs.pending) + len(rs.replicated) + c.tombs.count()
	c.resume(rs)
	c.log.Info("broadcaster recovered", "pending", len(rs.pending), "replicated", len(rs.replicated),
		"tombstones", c.tombs.count(), "open_groups", len(c.groups.open), "next_id", c.ids.next)
	return nil
}

// recovery is what recover gathers from the records.
type recovery struct {
	pending, replicated []*task
	tombs               []recTomb
	// tombsSorted says tombs are in ascending id order (as a catalog lists
	// them), so that scopeOfID finds one by binary search.
	tombsSorted bool
	perClass    [][]tomb
	maxID       uint64
	// released are finished groups' Begins by id: their release time
	// orders the group's tombstones for GC.
	released map[uint64]*Record
}

// gathered returns the tombstone id gathered so far, or nil.
func (rs *recovery) gathered(id uint64) *recTomb {
	if rs.tombsSorted {
		i, ok := slices.BinarySearchFunc(rs.tombs, id, func(r recTomb, id uint64) int { return cmp.Compare(r.tb.id, id) })
		if !ok {
			return nil
		}
		return &rs.tombs[i]
	}
	if i := slices.IndexFunc(rs.tombs, func(r recTomb) bool { return r.tb.id == id }); i >= 0 {
		return &rs.tombs[i]
	}
	return nil
}

type recTomb struct {
	tb  tomb
	rec *Record
	cls int
}

// recoverSide reads the collected ids and the force promotes' positions
// of s into the core's collected set and promotes.
func recoverSide(s Snapshot, collected *idset.Set, promotes map[uint64]map[message.VChannel]uint64, promotesOld map[uint64]bool) error {
	if s.Collected != nil {
		set, err := idset.Decode(s.Collected)
		if err != nil {
			return fmt.Errorf("%w: collected replicated ids: %w", ErrCorruptCatalog, err)
		}
		*collected = set
	}
	for id, raw := range s.Promotes {
		copies, old, err := decodePromote(raw)
		if err != nil {
			return fmt.Errorf("%w: force promote %d positions: %w", ErrCorruptCatalog, id, err)
		}
		if copies == nil {
			// First format: entry offsets per pchannel, kept as positions of
			// the first copy of each entry (only the scan uses them).
			copies = map[message.VChannel]uint64{}
			for p, off := range old {
				copies[p.Control()] = wal.Position(off, 0)
			}
			promotesOld[id] = true
		}
		promotes[id] = copies
	}
	return nil
}

// recoverRecords decodes every task record: tombstones are gathered,
// live tasks registered (PENDING ones with their keys).
func (c *Core) recoverRecords(s Snapshot, rs *recovery) error {
	rs.released = map[uint64]*Record{}
	// The index checks a scope against tombstones gathered, not loaded yet.
	rs.tombsSorted = true
	c.recovering = rs
	defer func() { c.recovering = nil }()
	// Decode every record first, so that the index is sized once for the
	// keyed ones: grown by doubling it would hold up to twice the memory
	// per tombstone (B6).
	recs := make([]*Record, len(s.Tasks))
	keyed := 0
	for i, r := range s.Tasks {
		rec, err := DecodeRecord(r.Raw)
		if err != nil {
			return fmt.Errorf("%w: task record %d: %w", ErrCorruptCatalog, r.ID, err)
		}
		recs[i] = rec
		if rec.Msg.IdempotencyKey != "" {
			keyed++
		}
	}
	if keyed > 0 {
		c.idem.reserve(keyed)
	}
	for i, r := range s.Tasks {
		rec := recs[i]
		recs[i] = nil
		if rec.Msg.Broadcast.ID != r.ID {
			return fmt.Errorf("%w: record %d holds broadcast %d", ErrCorruptCatalog, r.ID, rec.Msg.Broadcast.ID)
		}
		rs.maxID = max(rs.maxID, r.ID)
		cls := c.cfg.ClassOf(rec.Msg.Type)
		if rec.State == Tombstone {
			tb := c.tombs.newTomb(r.ID, r.Raw, rec.Completed.UnixNano(), cls, rec.Msg.Replicate != nil)
			if n := len(rs.tombs); n > 0 && rs.tombs[n-1].tb.id >= r.ID {
				rs.tombsSorted = false
			}
			rs.tombs = append(rs.tombs, recTomb{tb: tb, rec: rec, cls: cls})
			if g := rec.Msg.Group; g != nil && g.Kind == message.GroupBegin && rec.HoldsKeys && !rec.Released.IsZero() {
				rs.released[r.ID] = rec
				if k := g.OwnerKey; k != "" && r.ID > c.groups.endedOwners[k] {
					c.groups.endedOwners[k] = r.ID
				}
			}
			c.idem.register(ScopeOf(rec.Msg.Type, rec.Msg.IdempotencyKey), r.ID, tb.replicated())
			c.obs.TaskState(rec.Msg.Type, 0, Tombstone)
			continue
		}
		t, err := c.recoverTask(rec, cls)
		if err != nil {
			return err
		}
		if t.replicated {
			rs.replicated = append(rs.replicated, t)
		} else {
			rs.pending = append(rs.pending, t)
		}
	}
	return nil
}

// recoverTask registers a live task from its record; a PENDING one takes
// its keys again (a group member only the shared Cluster key: its group
// holds the rest).
func (c *Core) recoverTask(rec *Record, cls int) (*task, error) {
	info, _ := c.cfg.Types.Lookup(rec.Msg.Type)
	t := newTask(rec.Msg, rec.Message, info, rec.Created)
	t.digest, t.request = rec.PayloadDigest, rec.RequestDigest
	t.class = cls
	t.replicated = rec.State == Replicated
	for i := range t.copies {
		if rec.Acked[i] {
			t.copies[i].acked, t.copies[i].ackCP = true, rec.Checkpoints[i]
			if rec.Extras != nil {
				t.copies[i].extra = rec.Extras[i]
			}
			t.nacked++
		}
	}
	t.persistedAcks = t.nacked
	if len(t.msg.Broadcast.AppendFirst) > 0 && t.firstAcked() {
		t.firstDone = true
	}
	if t.replicated {
		c.ids.observe(t.id)
	} else {
		keys := t.keys
		if t.gkind != 0 && t.gkind != message.GroupBegin {
			keys = []resource.Key{resource.SharedCluster()}
		}
		r, err := c.locks.NewRequest(keys)
		if err == nil {
			err = c.locks.TryAcquire(r)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: recovered pending task %d cannot take its resource keys: %w", ErrCorruptCatalog, t.id, err)
		}
		r.Ref = t // labelled by LockOwner
		t.lock = r
	}
	c.tasks[t.id] = t
	c.idem.register(t.scope, t.id, t.replicated)
	c.obs.TaskState(t.msg.Type, 0, rec.State)
	return t, nil
}

// recover rebuilds the open groups (R13.1): a holding Begin's
// TOMBSTONE opens one (with its keys, on a primary), a live Begin too;
// finished members' tombstones and live members join theirs. A member
// whose group is not open, or that does not carry its group's keys and
// targets, is corrupt metadata, but for a secondary's replicated members
// whose Begin has not arrived.
func (gt *groupTable) recover(rs *recovery, types *message.Registry) error {
	for i, r := range rs.tombs {
		h := r.rec.Msg.Group
		if h == nil || h.Kind != message.GroupBegin || !r.rec.Holding() {
			continue
		}
		if err := gt.reopen(r, types); err != nil {
			return err
		}
		rs.tombs[i].tb.id = 0 // held by its group, not in GC's order
	}
	live := append(append([]*task(nil), rs.pending...), rs.replicated...)
	slices.SortFunc(live, func(a, b *task) int { return compareTicks(a.id, b.id, 0, 0) })
	for _, t := range live {
		if t.gkind == message.GroupBegin {
			gt.groupOf(t)
		}
	}
	for i, r := range rs.tombs {
		h := r.rec.Msg.Group
		if h == nil || h.Kind == message.GroupBegin {
			continue
		}
		if g := gt.open[h.ID]; g != nil && g.held() {
			g.keep(r.tb, h.Seq)
			gt.tombs.hold(r.tb)
			rs.tombs[i].tb.id = 0 // taken
		}
	}
	for _, t := range live {
		if t.gkind == 0 || t.gkind == message.GroupBegin {
			continue
		}
		if g := gt.open[t.msg.Group.ID]; (g == nil || g.begin == nil) && !t.replicated {
			return fmt.Errorf("%w: pending broadcast %d is a member of group %d, which is not open", ErrCorruptCatalog, t.id, t.msg.Group.ID)
		}
		g := gt.groupOf(t)
		if !slices.Equal(t.keys, g.keys) || g.txn && !slices.Equal(t.msg.Broadcast.VChannels, g.targets) {
			return fmt.Errorf("%w: broadcast %d does not carry the keys and targets of its group %d", ErrCorruptCatalog, t.id, g.id)
		}
	}
	for _, g := range gt.open {
		g.settle()
	}
	return nil
}

// reopen reopens the group of a holding Begin's TOMBSTONE: on a
// primary it takes the group's keys but the shared Cluster key.
func (gt *groupTable) reopen(r recTomb, types *message.Registry) error {
	info, _ := types.Lookup(r.rec.Msg.Type)
	b := newTask(r.rec.Msg, r.rec.Message, info, r.rec.Created)
	b.class, b.replicated, b.outcome = r.cls, r.rec.State == Replicated || r.rec.Msg.Replicate != nil, r.rec.Outcome
	g := gt.openGroup(b)
	gt.move(b, OnRecoverHolding, Holding)
	g.keep(r.tb, 0)
	g.doneSeq = 0
	gt.tombs.hold(r.tb)
	if gt.roles.role != Primary {
		return nil // a secondary's groups hold nothing until a promote
	}
	lr, err := gt.locks.NewRequest(g.keys[:businessKeys(g.keys)])
	if err == nil {
		err = gt.locks.TryAcquire(lr)
	}
	if err != nil {
		return fmt.Errorf("%w: open %s %d cannot take its resource keys: %w", ErrCorruptCatalog, groupWord(g), g.id, err)
	}
	lr.Ref, lr.Owner = g, g.label()
	g.lock = lr
	return nil
}

// settle orders a recovered group's finished members and works out how far
// they run without a gap.
func (g *group) settle() {
	idx := make([]int, len(g.done))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return int(g.seqs[a]) - int(g.seqs[b]) })
	done, seqs := make([]tomb, len(idx)), make([]uint32, len(idx))
	for j, i := range idx {
		done[j], seqs[j] = g.done[i], g.seqs[i]
	}
	g.done, g.seqs = done, seqs
	g.doneSeq = -1
	for _, s := range seqs {
		if int(s) != g.doneSeq+1 {
			break
		}
		g.doneSeq = int(s)
		g.next = max(g.next, s+1)
	}
	for _, s := range seqs {
		g.next = max(g.next, s+1)
	}
}

// loadRecovered puts the recovered tombstones in their classes' orders: a
// finished group's together, in its Begin's class, ordered by the time its
// end released it (R13.3); the others by completion.
func (ts *tombstones) loadRecovered(rs *recovery, classOf func(message.Type) int, restart int64) {
	type ordered struct {
		tb      tomb
		at, grp uint64
		seq     uint32
		grouped bool
	}
	per := make([][]ordered, len(ts.classes))
	for _, r := range rs.tombs {
		if r.tb.id == 0 {
			continue // held by an open group
		}
		o := ordered{tb: r.tb, at: uint64(r.tb.completed), grp: r.tb.id}
		cls := r.cls
		if h := r.rec.Msg.Group; h != nil {
			gid := h.ID
			if h.Kind == message.GroupBegin {
				gid = r.tb.id
			}
			if b := rs.released[gid]; b != nil {
				o.at, o.grp, o.seq, o.grouped = uint64(b.Released.UnixNano()), gid, h.Seq, true
				cls = classOf(b.Msg.Type)
			}
		}
		o.tb.completed = int64(o.at)
		if restart != 0 {
			o.tb.completed = restart // a planted bug: mutate.WindowMovesOnRestart
		}
		o.tb.setClass(cls)
		per[cls] = append(per[cls], o)
	}
	for cls, os := range per {
		slices.SortFunc(os, func(x, y ordered) int {
			if d := compareTicks(x.at, y.at, x.grp, y.grp); d != 0 {
				return d
			}
			return int(x.seq) - int(y.seq)
		})
		tombs := make([]tomb, len(os))
		for i := 0; i < len(os); {
			j := i + 1
			for j < len(os) && os[i].grouped && os[j].grouped && os[j].grp == os[i].grp {
				j++
			}
			for k := i; k < j; k++ {
				tombs[k] = os[k].tb
			}
			if j-i > 1 {
				tombs[i].run = uint16(j - i)
			}
			i = j
		}
		ts.load(cls, tombs)
	}
}

// resume moves the recovered live tasks on: PENDING ones append (a force
// promote resumes), REPLICATED ones whose control copy is acked are
// enrolled in control-channel order (R5.4), the rest when it is acked.
func (c *Core) resume(rs *recovery) {
	slices.SortFunc(rs.pending, func(x, y *task) int { return compareTicks(x.id, y.id, 0, 0) })
	for _, t := range rs.pending {
		if t.promote {
			c.recoverPromote(t)
			continue
		}
		c.move(t, OnRecoverPending, t.afterPersist())
	}
	slices.SortFunc(rs.replicated, func(x, y *task) int { return compareTicks(x.controlTick(), y.controlTick(), x.id, y.id) })
	for _, t := range rs.replicated {
		if t.controlTick() != 0 || t.control < 0 && t.allAcked() {
			c.move(t, OnRecoverReplicated, Queued)
		} else {
			c.move(t, OnRecoverReplicated, Collecting)
		}
	}
}

// recoverPromote resumes a force promote: copies recorded as landed are
// not appended again (#36); acks persisted count.
//
// A promote that crashed before recording its positions may have appended
// some copies: its pchannels are read from the lowest position its copies
// can be at (above every replicated copy acked here, which came before it),
// and the copies found count as appended.
func (c *Core) recoverPromote(t *task) {
	mark := func(i int, p uint64) {
		cp := wal.Checkpoint{MessageID: p, TimeTick: p, LastConfirmed: p}
		t.copies[i].appended, t.copies[i].appendCP = true, cp
		if t.copies[i].acked && t.copies[i].ackCP == (wal.Checkpoint{}) {
			t.copies[i].ackCP = cp
		}
	}
	if pos := c.promotes[t.id]; pos != nil && !c.promotesOld[t.id] {
		for i, v := range t.msg.Broadcast.VChannels {
			if p, ok := pos[v]; ok {
				mark(i, p)
			}
		}
		c.move(t, OnRecoverPending, Appending)
		return
	}
	highest := c.replicatedHighest()
	from := map[message.PChannel]uint64{}
	for _, v := range t.msg.Broadcast.VChannels {
		off := uint64(0)
		if h := highest[v.PChannel()]; h != 0 {
			off = wal.EntryOffset(h)
		}
		from[v.PChannel()] = off
	}
	c.scans.all(from, func(found []Found) {
		for _, f := range found {
			if f.ID != t.id {
				continue
			}
			if i := t.msg.Index(f.VChannel); i >= 0 && !t.copies[i].appended {
				mark(i, f.Checkpoint.MessageID)
			}
		}
		delete(c.promotes, t.id)
		c.move(t, OnRecoverPending, Appending)
	})
}

var timeZero time.Time

// idBlock is how many broadcast ids one catalog write reserves.
const idBlock = 1000

// Id spaces (R8.3). The high bits of a broadcast id number its id space,
// the low SpaceBits count within it. A cluster starts in space 0 (ids 1,
// 2, ...). A secondary allocates an id only for a force promote or a
// local-only broadcast (R13.13), and its first allocation opens a space
// above the space of every id it knows of — its replicated tasks, its floor, and every copy in its WAL from the
// highest replicated position acked to the end (a scan: the streaming
// nodes may not have acked them yet) — and the promoted cluster allocates
// on in that space. Its ids are therefore above every id that reached it,
// and apart from every id the lost primary used or may still use, since a
// primary allocates in its own space: a late copy of the primary can never
// carry an id of the promoted cluster, so no node deduplicates one for the
// other and no ack of one counts for the other.
const SpaceBits = 48

// Space returns the id space of broadcast id.
func Space(id uint64) uint64 { return id >> SpaceBits }

// FirstID returns the first broadcast id of id space s.
func FirstID(s uint64) uint64 { return s<<SpaceBits | 1 }

// ids hands out broadcast ids: increasing, never reused, reserved from the
// catalog a block at a time so that allocation rarely costs a round trip.
// An id is allocated when a handle's locks are granted, so the ids of
// conflicting broadcasts increase in lock order.
//
// The persisted floor is above every id handed out; GC raises it past every
// id it deletes (tombs.go), so that a restarted cluster's ids stay above the
// ids its nodes already applied even once their tombstones are gone — also
// replicated ids, which came from another cluster.
type ids struct {
	next  uint64 // next id to hand out, unless seen is higher
	end   uint64 // first id not reserved
	floor uint64 // the persisted value: no id at or above it was handed out
	// attempted is the highest value a write of the floor tried (it may have
	// applied): the next block starts above it.
	attempted uint64
	// seen is the highest id created elsewhere (a replicated task).
	seen uint64
	// spaced says this life opened an id space above every id known
	// (openSpace); opening says the scan for it is under way.
	spaced, opening bool
	// keyBusy says a write of the floor is in flight (a block reservation
	// or a GC raising it): they are serialised, so the floor never goes
	// down.
	keyBusy bool
	waiting []func(id uint64, err error)
}

func (s *ids) start(floor, maxID uint64) {
	s.floor = floor
	s.next = max(floor, maxID+1, 1)
	s.end = s.next
	s.attempted = floor
}

// used reports whether any id was ever handed out or observed here.
func (s *ids) used() bool { return s.floor > 0 || s.next > 1 || s.seen > 0 }

// observe keeps future ids above an id created elsewhere.
func (s *ids) observe(id uint64) { s.seen = max(s.seen, id) }

// issuedElsewhere reports whether id, of a broadcast a primary does not
// know (neither live, tombstoned nor collected here, nor a replicated
// copy's), is one it cannot have issued: a primary's ids are all below the
// end of its reserved block, and every leader reserves its block above the
// persisted floor before it hands out an id, so an unknown id at or above
// the end (and above every replicated id seen) was issued by a leader that
// took over. This core is deposed and has not noticed (a zombie resumed,
// its lease not yet found lost): answering an ack of such an id as done
// would drop it, and the newer leader's task would wait for it forever.
func (s *ids) issuedElsewhere(id uint64) bool { return id >= s.end && id > s.seen }

func (s *ids) put(prefix string, v uint64) catalog.Op {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return catalog.Put(IDsKey(prefix), b[:])
}

// floorFor returns the floor a GC deleting ids up to maxID must write, 0 if
// the floor is high enough already or a floor write is in flight.
func (s *ids) floorFor(maxID uint64) uint64 {
	if s.keyBusy || maxID < s.floor {
		return 0
	}
	return max(s.end, s.attempted, maxID+1)
}

// alloc hands an id to then, reserving a block first if none is left; then
// gets an error wrapping ErrTaskNotCreated if the block could not be
// reserved.
func (s *ids) alloc(c *Core, then func(id uint64, err error)) {
	if id, ok := s.now(c); ok {
		then(id, nil)
		return
	}
	s.waiting = append(s.waiting, then)
	if c.roles.role == Secondary && !s.spaced {
		s.openSpace(c)
		return
	}
	s.resume(c)
}

// now hands out an id at once if the reserved block has one left.
func (s *ids) now(c *Core) (uint64, bool) {
	if c.roles.role == Secondary && !s.spaced {
		// A force promote's id, or a local-only broadcast's (R13.13): the
		// only allocations on a secondary, in a space of their own.
		return 0, false
	}
	s.next = max(s.next, s.seen+1)
	if s.next < s.end {
		id := s.next
		s.next++
		return id, true
	}
	return 0, false
}

// resume reserves a block for the waiting handles if none is being
// reserved.
func (s *ids) resume(c *Core) {
	if len(s.waiting) == 0 || s.keyBusy || s.opening || c.gc.writing {
		return
	}
	end := max(s.next, s.attempted) + idBlock
	s.attempted = end
	s.keyBusy = true
	c.writes.write(WriteIDs, nil, nil, []catalog.Op{s.put(c.cfg.Prefix, end)}, func(_ *Core, _ *writeOp, d Decision, err error) {
		s.keyBusy = false
		waiting := s.waiting
		s.waiting = nil
		switch d {
		case Done:
			s.end, s.floor = end, end
			for _, then := range waiting {
				s.alloc(c, then)
			}
		case Refuse, StepDown:
			for _, then := range waiting {
				then(0, fmt.Errorf("%w: allocate broadcast id: %w", ErrTaskNotCreated, err))
			}
		}
		if c.gc.again {
			again := c.gc.againAll
			c.gc.again, c.gc.againAll = false, false
			c.gc.run(again)
		}
	})
}

// openSpace moves the next id to the first id of a space above every id
// this cluster knows of, then allocates for the waiting handles. The ids it
// cannot know from its tasks, tombstones and floor are those of replicated
// copies its streaming nodes have not acked: every pchannel is read from
// its highest acked replicated position to the end for them. A failed read
// is retried (the scanner), so the promote waits rather than guessing.
func (s *ids) openSpace(c *Core) {
	if s.opening {
		return
	}
	s.opening = true
	highest := c.replicatedHighest()
	from := map[message.PChannel]uint64{}
	for _, v := range c.cfg.ControlTargets {
		p := v.PChannel()
		off := uint64(0)
		if h := highest[p]; h != 0 {
			off = wal.EntryOffset(h)
		}
		from[p] = off
	}
	c.scans.all(from, func(found []Found) {
		s.opening = false
		top := max(s.seen, s.next-1)
		if s.floor > 0 {
			top = max(top, s.floor-1)
		}
		if s.attempted > 0 {
			top = max(top, s.attempted-1)
		}
		for _, f := range found {
			top = max(top, f.ID)
		}
		s.next = max(s.next, FirstID(Space(top)+1))
		s.spaced = true
		c.log.Warn("force promote: broadcast ids continue in a new id space", "space", Space(s.next),
			"first_id", s.next, "highest_known_id", top, "copies_scanned", len(found))
		waiting := s.waiting
		s.waiting = nil
		for _, then := range waiting {
			s.alloc(c, then)
		}
	})
}
