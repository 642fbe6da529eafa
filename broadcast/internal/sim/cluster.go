package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/catalog"
	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/internal/retry"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// cluster is one simulated walcast cluster: its catalog and WAL (in-memory
// backends, stepped synchronously), the decision core, the actions in
// flight, and its streaming nodes (consumers).
type cluster struct {
	w      *world
	name   string
	store  *cmem.Store
	cat    *cmem.Catalog // the current term's handle
	log    *wmem.Log
	wal    *wal.WAL
	lanes  []message.PChannel
	core   *engine.Core
	gen    int // core generation: results of an older one are dropped
	salt   string
	ops    []*op
	nodes  []*consumer
	down   bool // crashed or fenced, not recovered yet
	types  *message.Registry
	cfg    engine.Config
	hasCB  map[message.Type]bool
	crashN int
	// promoteCrashes counts crashes while a force promote supplements
	// (crashMove).
	promoteCrashes int
	// reverseSnapshot lists the records to recovery in reverse key order
	// (a scenario's: a catalog need not list them sorted).
	reverseSnapshot bool
	// laneN is how many WAL lanes the pchannels fold into (0: one each);
	// drv is set in driver mode (drive.go).
	laneN  int
	driver bool
	drv    driven
	// stepN counts the core's steps (and new cores): a reading of the
	// core taken at the same stepN is still true (live). A driven core is
	// stepped by the driver's goroutines, so it is read afresh each time.
	stepN uint64
	live  liveCache
	// checkedN is the stepN at the checker's last full look at the core
	// (checker.always): the state it passed then has not changed since.
	checkedN    uint64
	checkedCore *engine.Core
}

// liveCache is a cluster's live tasks in id order as of core step at, and
// its open groups as of core step groupsAt.
type liveCache struct {
	at, groupsAt     uint64
	core, groupsCore *engine.Core
	tasks            []liveTask
	groups           []engine.GroupView
}

// liveTask is one live task as engine.View.EachLive reports it.
type liveTask struct {
	id       uint64
	st       engine.State
	stage    engine.Stage
	msg      *message.Message
	attempts int
}

// stillAt reports whether a reading of core taken at step at is still
// true: the cluster's core, not stepped since (never for a driven core,
// which the driver's goroutines step).
func (c *cluster) stillAt(core *engine.Core, at uint64) bool {
	return !c.driver && core == c.core && at == c.stepN
}

// liveTasks returns the core's live tasks in id order. The slice is the
// cluster's: valid until its core steps again.
func (c *cluster) liveTasks() []liveTask {
	if c.live.tasks != nil && c.stillAt(c.live.core, c.live.at) {
		return c.live.tasks
	}
	ts := c.live.tasks[:0]
	c.core.View().EachLive(func(id uint64, st engine.State, stage engine.Stage, m *message.Message, attempts int) {
		ts = append(ts, liveTask{id, st, stage, m, attempts})
	})
	if ts == nil {
		ts = []liveTask{}
	}
	c.live.tasks, c.live.core, c.live.at = ts, c.core, c.stepN
	return ts
}

// openGroups returns the core's open groups (engine.View.Groups), read
// once per core step.
func (c *cluster) openGroups() []engine.GroupView {
	if c.live.groupsCore == nil || !c.stillAt(c.live.groupsCore, c.live.groupsAt) {
		c.live.groups, c.live.groupsCore, c.live.groupsAt = c.core.View().Groups(), c.core, c.stepN
	}
	return c.live.groups
}

// unchangedSinceCheck reports whether the core is the one the checker last
// looked at whole, not stepped since (never for a driven core).
func (c *cluster) unchangedSinceCheck() bool { return c.stillAt(c.checkedCore, c.checkedN) }

// op is one action of the core being performed.
type op struct {
	gen int
	a   engine.Action
	// cancelled marks a callback attempt an operator cancelled: it
	// completes with its context's error.
	cancelled bool
}

const prefix = "walcast/"

var pchans = []message.PChannel{"wal-0", "wal-1", "wal-2", "wal-3"}

func newCluster(w *world, name string, lanes int) *cluster {
	c := &cluster{w: w, name: name, store: cmem.NewStore(), types: message.NewRegistry(), hasCB: map[message.Type]bool{},
		laneN: lanes, driver: w.cfg.Driver != nil && *w.cfg.Driver}
	c.lanes = wal.Lanes(lanes, pchans)
	c.log = wmem.New(c.lanes...)
	c.wal = wal.New(c.log, wal.WithLanes(lanes, pchans))
	for _, t := range types {
		c.types.MustRegister(message.TypeInfo{Type: t.typ, AckSyncUp: t.syncUp})
		c.hasCB[t.typ] = t.callback
	}
	c.types.MustRegister(message.TypeInfo{Type: engine.AlterReplicateConfig})
	ownerKey := func(p []byte) (string, error) { return string(p), nil }
	c.types.MustRegister(message.TypeInfo{Type: typOwner, Owner: &message.OwnerRole{Key: ownerKey}})
	c.types.MustRegister(message.TypeInfo{Type: typEnd, Owner: &message.OwnerRole{Key: ownerKey, Ends: message.GroupCommit}})
	c.types.MustRegister(message.TypeInfo{Type: typRoll, Owner: &message.OwnerRole{Key: ownerKey, Ends: message.GroupRollback}})
	for _, t := range []message.Type{typOwner, typEnd, typRoll} {
		c.hasCB[t] = true
	}
	c.cfg = engine.Config{
		ControlChannel: pchans[0].Control(), ClusterName: name, Prefix: prefix, Types: c.types,
		HasAckOnce: func(t message.Type) bool { return t == typOnce },
		Lane: func(p message.PChannel) message.PChannel {
			l, _ := c.wal.Lane(p)
			return l
		},
		MaxEntryBytes: wmem.DefaultMaxEntryBytes, Limits: cmem.DefaultLimits,
		AppendConcurrency: 2,
		Backoff:           retry.Policy{Initial: 10 * time.Millisecond, Multiplier: 2, Max: 200 * time.Millisecond},
		Classes: []engine.Class{
			{Name: "default", MaxCount: w.maxCount, MaxLifetime: time.Hour},
			{Name: "import", MaxCount: w.maxCount * 2, MaxLifetime: 3 * time.Hour},
		},
		ClassOf:       classOf,
		CheckInterval: 5 * time.Minute, MaxKeyLength: 64, MaxGroupMembers: map[bool]int{true: 4, false: 64}[w.maxCount == 3],
		Mutation: w.cfg.Mutation, IndexScopeBits: w.cfg.IndexScopeBits,
	}
	for _, p := range pchans {
		c.cfg.ControlTargets = append(c.cfg.ControlTargets, p.Control())
		c.nodes = append(c.nodes, &consumer{c: c, p: p, ln: c.cfg.Lane(p)})
	}
	return c
}

// classOf is the workload's retention class of a type: imports have one of
// their own.
func classOf(t message.Type) int {
	if t == typImport {
		return 1
	}
	return 0
}

// start recovers a core from the catalog (a new leadership term: the old
// handle is fenced).
func (c *cluster) start() error {
	c.cat = c.store.Open()
	c.gen++
	c.salt = fmt.Sprintf("%s-%d", c.name, c.gen)
	if c.driver {
		c.w.check.stepped()
		if err := c.startDriver(); err != nil {
			return err
		}
		c.down = false
		c.w.tracef("%s: broadcaster %d started", c.name, c.gen)
		c.w.check.restarted(c)
		c.w.check.windows(c)
		return nil
	}
	snap, err := c.snapshot()
	if err != nil {
		return err
	}
	c.w.check.stepped()
	core, err := engine.New(c.cfg, snap, c.w.now)
	if err != nil {
		return err
	}
	c.core, c.down = core, false
	c.stepN++
	c.w.tracef("%s: core %d started (%d records)", c.name, c.gen, len(snap.Tasks))
	c.w.check.restarted(c)
	c.w.check.windows(c)
	c.perform(core.Ready())
	return nil
}

// snapshot reads what recovery needs, as the driver does.
func (c *cluster) snapshot() (engine.Snapshot, error) {
	ctx := context.Background()
	s := engine.Snapshot{Promotes: map[uint64][]byte{}}
	err := c.cat.List(ctx, engine.TasksPrefix(prefix), func(k string, v []byte) error {
		id, _ := engine.ParseTaskKey(prefix, k)
		s.Tasks = append(s.Tasks, engine.RawRecord{ID: id, Raw: slices.Clone(v)})
		return nil
	})
	if err != nil {
		return s, err
	}
	if c.reverseSnapshot {
		slices.Reverse(s.Tasks)
	}
	if v, err := c.cat.Get(ctx, engine.IDsKey(prefix)); err == nil {
		s.IDFloor = beUint64(v)
	}
	if v, err := c.cat.Get(ctx, engine.ReplicateKey(prefix)); err == nil {
		if err := jsonUnmarshal(v, &s.Topology); err != nil {
			return s, err
		}
	}
	_ = c.cat.List(ctx, engine.PromotePrefix(prefix), func(k string, v []byte) error {
		id, _ := strconv.ParseUint(strings.TrimPrefix(k, engine.PromotePrefix(prefix)), 10, 64)
		s.Promotes[id] = slices.Clone(v)
		return nil
	})
	if v, err := c.cat.Get(ctx, engine.CollectedKey(prefix)); err == nil {
		s.Collected = slices.Clone(v)
	}
	return s, nil
}

// step gives the core one event at the world's time.
func (c *cluster) step(ev engine.Event) {
	if c.down {
		return
	}
	if c.driver {
		if _, ok := ev.(engine.Tick); !ok {
			panic(fmt.Sprintf("sim: %T stepped into a driven cluster", ev))
		}
		c.w.check.stepped()
		c.tickDriver()
		return
	}
	c.w.hashEvent(c, ev)
	c.w.check.stepped()
	c.stepN++
	c.core.Step(c.w.now, ev)
	c.perform(c.core.Ready())
	if c.core.View().Stopped() && !c.down {
		c.down = true
		c.w.tracef("%s: core %d stopped", c.name, c.gen)
	}
}

// perform queues the core's actions: replies go to their requests at once,
// everything else waits in ops until the world completes it.
func (c *cluster) perform(acts []engine.Action) {
	for i := range acts {
		a := &acts[i]
		c.w.hashAction(c, a)
		switch a.Kind {
		case engine.ActReply:
			a.Reply.To.(*request).deliver(a.Reply)
		case engine.ActRoleChanged, engine.ActFenced:
			// The core has stopped itself on Fenced; the world restarts it.
		case engine.ActCancelCallback:
			for _, o := range c.ops {
				if o.a.Kind == engine.ActCallback && o.a.Callback.Task == a.CancelCallback.Task && o.gen == c.gen {
					o.cancelled = true
				}
			}
		default:
			c.ops = append(c.ops, &op{gen: c.gen, a: *a})
			if a.Kind == engine.ActAppend {
				c.checkAppendBound()
			}
		}
	}
}

// checkAppendBound fails the world if the core has more appends in flight
// than its AppendConcurrency (R4.3): the core alone bounds them, since a
// driver may run an append on any of its workers.
func (c *cluster) checkAppendBound() {
	n := 0
	for _, o := range c.ops {
		if o.a.Kind == engine.ActAppend && o.gen == c.gen {
			n++
		}
	}
	if n > c.cfg.AppendConcurrency {
		c.w.fail("%s: %d appends in flight, AppendConcurrency %d (R4.3)", c.name, n, c.cfg.AppendConcurrency)
	}
}

// Fault injection: the share of completions that fail, per kind.
var (
	errDefinite = fmt.Errorf("sim: %w", catalog.ErrNotApplied)
	errTimeout  = errors.New("sim: timeout, nothing written")
	errLost     = errors.New("sim: answer lost, written")
	errAppend   = fmt.Errorf("sim: %w", wal.ErrNotApplied)
)

// complete performs op o (of this generation) with the faults the world's
// random source picks, and steps the result into the core.
func (c *cluster) complete(i int) {
	o := c.ops[i]
	c.ops = append(c.ops[:i], c.ops[i+1:]...)
	if o.gen != c.gen || c.down {
		return
	}
	w := c.w
	switch o.a.Kind {
	case engine.ActWrite:
		a := o.a.Write
		res := c.write(a)
		c.step(res)
		if res.Err == nil && a.Kind == engine.WriteTombstone {
			w.check.heardDurable(c, a)
		}
	case engine.ActAppend:
		c.step(c.append(o.a.Append))
	case engine.ActCallback:
		c.step(c.callback(o.a.Callback, o.cancelled))
	case engine.ActAckOnce:
		a := o.a.AckOnce
		var err error
		if w.fault(0.2) {
			err = errors.New("sim: ack-once callback failed")
		}
		c.step(engine.AckOnceDone{ID: a.ID, Err: err})
	case engine.ActScan:
		a := o.a.Scan
		var found []engine.Found
		var err error
		if w.fault(0.2) {
			err = errors.New("sim: pchannel unreadable")
		} else {
			err = c.wal.ReadToEnd(context.Background(), a.PChannel, a.From, func(cp wal.Copy) error {
				found = append(found, engine.Found{ID: cp.Message.Broadcast.ID, VChannel: cp.VChannel, Checkpoint: cp.Checkpoint})
				return nil
			})
		}
		if err != nil {
			found = nil
		}
		c.step(engine.Scanned{ID: a.ID, Found: found, Err: err})
	}
}

// write commits a Write, maybe with a fault.
func (c *cluster) write(a engine.Write) engine.Written {
	ops := a.Ops
	var rec, msg []byte
	if a.Record != nil {
		var err error
		if rec, msg, err = engine.EncodeRecord(a.Record); err != nil {
			return engine.Written{ID: a.ID, Err: fmt.Errorf("%w: %w", catalog.ErrInvalid, err)}
		}
		ops = append([]catalog.Op{catalog.Put(a.Record.Key, rec)}, ops...)
	}
	w := c.w
	switch {
	case w.fault(0.05):
		return engine.Written{ID: a.ID, Err: errDefinite}
	case w.fault(0.05):
		return engine.Written{ID: a.ID, Err: errTimeout}
	case w.fault(0.01) && c.w.fencings < 2:
		// Another coordinator's term began: this core's handle is fenced,
		// and this write and every later one fails (the core steps down).
		c.w.fencings++
		c.store.Open()
	}
	err := c.cat.Commit(context.Background(), ops...)
	if err == nil {
		w.check.committed(c, a, ops)
		if w.fault(0.05) {
			err = errLost
		}
	}
	return engine.Written{ID: a.ID, Err: err, Record: rec, Message: msg}
}

// append appends an Append, maybe with a fault.
func (c *cluster) append(a engine.Append) engine.Appended {
	w := c.w
	if w.fault(0.06) {
		return engine.Appended{ID: a.ID, Err: errAppend}
	}
	if w.fault(0.04) {
		return engine.Appended{ID: a.ID, Err: errTimeout}
	}
	w.check.beforeAppend(c, a)
	res, err := c.wal.AppendSalted(context.Background(), a.Lane, c.salt, a.Items)
	if err == nil && w.fault(0.04) {
		return engine.Appended{ID: a.ID, Err: errLost}
	}
	return engine.Appended{ID: a.ID, Results: res, Err: err}
}

// callback runs the application's callback: a read-modify-write of the
// task's effect counter, staged to commit with the TOMBSTONE (R5.3), so an
// effect applied twice shows as 2. Some tasks fail for a while.
func (c *cluster) callback(a engine.Callback, cancel bool) engine.CallbackDone {
	if cancel {
		return engine.CallbackDone{Task: a.Task, Attempt: a.Attempt, Err: context.Canceled}
	}
	if !c.hasCB[a.Msg.Type] {
		return engine.CallbackDone{Task: a.Task, Attempt: a.Attempt}
	}
	w := c.w
	switch string(a.Msg.Payload) {
	case poisonForever:
		return engine.CallbackDone{Task: a.Task, Attempt: a.Attempt, Err: errors.New("sim: poisoned callback failed")}
	case poisonPermanent:
		// The driver's answer to a broadcast.Permanent error (R11.6).
		return engine.CallbackDone{Task: a.Task, Attempt: a.Attempt, Outcome: engine.Outcome{Status: engine.Failed, Detail: "sim: poisoned"}}
	}
	if n := w.failing[a.Task]; n > 0 {
		w.failing[a.Task] = n - 1
		return engine.CallbackDone{Task: a.Task, Attempt: a.Attempt, Err: errors.New("sim: callback failed")}
	}
	if w.fault(0.1) {
		return engine.CallbackDone{Task: a.Task, Attempt: a.Attempt, Err: errors.New("sim: callback failed")}
	}
	key := effectKey(a.Task)
	n := uint64(0)
	if v, err := c.cat.Get(context.Background(), key); err == nil {
		n = beUint64(v)
	}
	return engine.CallbackDone{Task: a.Task, Attempt: a.Attempt, Ops: []catalog.Op{catalog.Put(key, beBytes(n+1))},
		Outcome: engine.Outcome{Status: engine.Succeeded, Detail: "sim"}}
}

func effectKey(id uint64) string { return fmt.Sprintf("effect/%d", id) }

// crash kills the coordinator at this step: writes and appends in flight
// land or not, everything else is lost; the next start recovers.
func (c *cluster) crash() {
	w := c.w
	for _, o := range c.ops {
		if o.gen != c.gen {
			continue
		}
		switch o.a.Kind {
		case engine.ActWrite:
			if w.rng.IntN(2) == 0 {
				c.write(o.a.Write) // landed; nobody hears
			}
		case engine.ActAppend:
			if w.rng.IntN(2) == 0 {
				c.append(o.a.Append)
			}
		}
	}
	c.ops = nil
	if c.driver {
		c.stopDriver()
	}
	c.down = true
	c.crashN++
	w.crashes++
	w.tracef("%s: crash of core %d", c.name, c.gen)
	for _, r := range w.requests {
		if r.c == c && !r.done {
			r.lost()
		}
	}
}
