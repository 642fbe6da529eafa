package engine

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// View is a read-only view of a core, for the engine's introspection API
// (in the manner of etcd raft's Status): its reads run between two events
// (Inspect, or the driver's own loop) and copy what they return. It holds
// no state of its own; a View obtained from a core sees its later changes.
type View struct{ c *Core }

// View returns the core's read-only view.
func (c *Core) View() View { return View{c} }

// TaskView describes a live task.
type TaskView struct {
	ID             uint64
	Msg            *message.Message
	State          State
	Stage          Stage
	Created        time.Time
	Copies         []CopyView
	AppendAttempts int
	AppendError    string
	Attempts       int
	LastError      string
	LastAttemptAt  time.Time
	NextAttemptAt  time.Time
	// CallbackStarted says the callback ran at least once (an operator may
	// complete it).
	CallbackStarted bool
	Running         bool
	// History holds the latest callback attempts, oldest first (at most
	// MaxAttemptHistory).
	History []Attempt
	Outcome Outcome
	Commits int
	Window  Window
}

// CopyView is one copy of a live task.
type CopyView struct {
	VChannel   message.VChannel
	Appended   bool
	Acked      bool
	Checkpoint wal.Checkpoint
	// Extra is what the consumer returned with its ack (R13.12).
	Extra []byte
}

func (v View) taskView(t *task) TaskView {
	tv := TaskView{ID: t.id, Msg: t.msg, State: t.state(), Stage: t.stage, Created: t.created,
		AppendAttempts: t.appendAttempts, AppendError: t.appendErr, Attempts: t.attempts, LastError: t.lastErr,
		LastAttemptAt: t.lastAt, NextAttemptAt: t.nextAt, CallbackStarted: t.attempts > 0, History: slices.Clone(t.history),
		Running: t.stage == Calling, Outcome: t.outcome, Commits: t.commits,
		Window: v.c.tombs.window(t.class, t.id, t.created, time.Time{})}
	for i, vc := range t.msg.Broadcast.VChannels {
		cp := t.copies[i]
		tv.Copies = append(tv.Copies, CopyView{VChannel: vc, Appended: cp.appended, Acked: cp.acked, Checkpoint: cp.ackCP, Extra: cp.extra})
	}
	return tv
}

// TaskByID returns live task id's view, or tombstone id's record.
func (v View) TaskByID(id uint64) (live *TaskView, record string, window Window, ok bool) {
	if t := v.c.tasks[id]; t != nil {
		tv := v.taskView(t)
		return &tv, "", Window{}, true
	}
	if tb, found := v.c.tombs.get(id); found {
		o := v.c.tombs.original(tb)
		return nil, tb.raw(), o.Window, true
	}
	return nil, "", Window{}, false
}

// LiveTasks returns the views of every live task, by id.
func (v View) LiveTasks() []TaskView {
	out := make([]TaskView, 0, len(v.c.tasks))
	for _, t := range v.c.tasks {
		out = append(out, v.taskView(t))
	}
	slices.SortFunc(out, func(a, b TaskView) int { return compareTicks(a.ID, b.ID, 0, 0) })
	return out
}

// EachLive calls fn for every live task, in id order, with its persisted
// state, stage, message and callback attempts, without building views.
func (v View) EachLive(fn func(id uint64, st State, stage Stage, m *message.Message, attempts int)) {
	ids := make([]uint64, 0, len(v.c.tasks))
	for id := range v.c.tasks {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		t := v.c.tasks[id]
		fn(id, t.state(), t.stage, t.msg, t.attempts)
	}
}

// TombRecord is a tombstone's id and record.
type TombRecord struct {
	ID     uint64
	Record string
}

// Tombstones returns every tombstone's record.
func (v View) Tombstones() []TombRecord {
	all := v.c.tombs.all()
	out := make([]TombRecord, len(all))
	for i, tb := range all {
		out[i] = TombRecord{ID: tb.id, Record: tb.raw()}
	}
	return out
}

// Locks returns the issuance lock table (R3.7).
func (v View) Locks() []resource.KeyState { return v.c.locks.Snapshot() }

// Stats returns the counters.
func (v View) Stats() Stats { return v.c.stats }

// Counts returns the live task and tombstone counts.
func (v View) Counts() (live, tombstones int) { return len(v.c.tasks), v.c.tombs.count() }

// Role returns the cluster's role and topology.
func (v View) Role() (Role, ReplicateConfig) { return v.c.roles.role, v.c.roles.cfg }

// EarlyEvictions returns, per retention class, how many tombstones MaxCount
// evicted before their MaxLifetime.
func (v View) EarlyEvictions() map[string]int {
	out := make(map[string]int, len(v.c.tombs.classes))
	for i, cl := range v.c.tombs.classes {
		out[cl.cfg.Name] = v.c.tombs.early[i]
	}
	return out
}

// IDsUsed reports whether the cluster ever allocated or observed a
// broadcast id.
func (v View) IDsUsed() bool { return v.c.ids.used() }

// GroupView describes an open group (R13.1, R13.7).
type GroupView struct {
	ID uint64
	// OwnerKey names a resource-key owner's ownership; "" for a
	// transaction.
	OwnerKey string
	Keys     []resource.Key
	Targets  []message.VChannel
	// Holding says the Begin's TOMBSTONE is durable and the group holds its
	// keys here (HoldsHere: in this cluster's lock table; a secondary's
	// groups hold nothing until a promote).
	Holding, HoldsHere bool
	// Members are the group's members known here, in seq order.
	Members []MemberView
	// Ending is the id of its first Commit or Rollback, 0 if none yet.
	Ending     uint64
	EndingKind message.GroupKind
	// Queued counts members waiting to be created.
	Queued int
}

// MemberView is one member of a group.
type MemberView struct {
	ID   uint64
	Seq  uint32
	Kind message.GroupKind
	// Stage is the member's stage; Tombstoned once finished.
	Stage Stage
}

// Groups returns every open group, in id order.
func (v View) Groups() []GroupView {
	out := make([]GroupView, 0, len(v.c.groups.open))
	for _, id := range sortedKeys(v.c.groups.open) {
		out = append(out, groupView(v.c.groups.open[id]))
	}
	return out
}

// Group returns open group id's view.
func (v View) Group(id uint64) (GroupView, bool) {
	g := v.c.groups.open[id]
	if g == nil {
		return GroupView{}, false
	}
	return groupView(g), true
}

// OwnerGroup returns the id of the group that owns key, 0 if none.
func (v View) OwnerGroup(key string) uint64 { return v.c.groups.owners[key] }

// EndedOwner returns the id of the ended group that last owned key, while
// its tombstones are remembered; 0 if none.
func (v View) EndedOwner(key string) uint64 { return v.c.groups.endedOwners[key] }

// EndedGroup reports whether id is a group that has ended (its Begin's
// tombstone, released, is still remembered), and its owner key ("" for a
// transaction).
func (v View) EndedGroup(id uint64) (ownerKey string, ended bool) {
	tb, ok := v.c.tombs.get(id)
	if !ok {
		return "", false
	}
	r, err := DecodeRecord(rawBytes(tb.raw()))
	if err != nil || !r.HoldsKeys || r.ReleasedBy == 0 || r.Msg.Group == nil {
		return "", false
	}
	return r.Msg.Group.OwnerKey, true
}

// GroupError explains why id names no open group: ended, never opened, or
// unknown.
func (v View) GroupError(id uint64) error { return v.c.groups.endedError(id) }

func groupView(g *group) GroupView {
	v := GroupView{ID: g.id, OwnerKey: g.key, Keys: slices.Clone(g.keys), Targets: slices.Clone(g.targets),
		Holding: g.held(), HoldsHere: g.lock != nil, Queued: len(g.queue)}
	if g.begin != nil {
		v.Members = append(v.Members, MemberView{ID: g.id, Seq: 0, Kind: message.GroupBegin, Stage: g.begin.stage})
	}
	for i, tb := range g.done {
		if g.seqs[i] == 0 {
			continue
		}
		kind := message.GroupBody
		if r, err := DecodeRecord(rawBytes(tb.raw())); err == nil && r.Msg.Group != nil {
			kind = r.Msg.Group.Kind
		}
		v.Members = append(v.Members, MemberView{ID: tb.id, Seq: g.seqs[i], Kind: kind, Stage: Tombstoned})
	}
	for s, t := range g.live {
		v.Members = append(v.Members, MemberView{ID: t.id, Seq: s, Kind: t.gkind, Stage: t.stage})
	}
	slices.SortFunc(v.Members, func(a, b MemberView) int { return int(a.Seq) - int(b.Seq) })
	if g.ending != nil {
		v.Ending, v.EndingKind = g.ending.id, g.ending.gkind
	}
	return v
}

// Waiters returns how many requests wait for live task id's result.
func (v View) Waiters(id uint64) int {
	if t := v.c.tasks[id]; t != nil {
		return len(t.waiters)
	}
	return 0
}

// MaxAttemptHistory is how many of a task's latest callback attempts its
// view keeps.
const MaxAttemptHistory = 16

// Attempt is one attempt of a task's callback: its number (from 1), when
// it started and ended (zero while it runs) and its error ("" if it
// succeeded or runs).
type Attempt struct {
	N              int
	Started, Ended time.Time
	Err            string
}

// Outstanding counts what requests hold or wait for in the core. Once
// every caller has returned, whether answered or given up (R11.5), a core
// with no live task has none of it.
type Outstanding struct {
	// Admissions are the idempotency keys' admission slots held, Resolving
	// the Resolves waiting for one.
	Admissions, Resolving int
	// Handles are the handles holding or waiting for locks, or submitting.
	Handles int
	// TaskWaiters are the requests waiting for a live task: its result,
	// its acks, its callback completed.
	TaskWaiters int
}

// Outstanding returns what requests hold or wait for in the core.
func (v View) Outstanding() Outstanding {
	o := Outstanding{Admissions: len(v.c.idem.admits), Handles: len(v.c.handles.byID), Resolving: v.c.idem.waiting()}
	for _, t := range v.c.tasks {
		o.TaskWaiters += len(t.waiters) + len(t.completeWaits) + len(t.ackWaiters) + len(t.ackWaits)
		for i := range t.copies {
			o.TaskWaiters += len(t.copies[i].ackOnceWaiters)
		}
	}
	return o
}

// Requests lists what callers' requests hold or wait for in the core, in
// handle id order: a handle's admission slot, the Resolves that wait for
// it, its lock request. A core with no request in flight has none; one
// left behind is a leak (the simulator's liveness check, R11.3).
func (v View) Requests() []RequestView {
	var out []RequestView
	for _, id := range slices.Sorted(maps.Keys(v.c.handles.byID)) {
		h := v.c.handles.byID[id]
		v := RequestView{Handle: id, Granted: h.granted, Waiting: h.lock != nil && !h.granted, Busy: h.busy}
		if h.adm != nil {
			v.Admission, v.Scope = true, h.scope
		}
		out = append(out, v)
	}
	for sc, a := range v.c.idem.admits {
		for _, r := range a.waiters {
			out = append(out, RequestView{Handle: r.Handle, Scope: sc, Resolving: true})
		}
	}
	slices.SortFunc(out, func(a, b RequestView) int { return cmp.Compare(a.Handle, b.Handle) })
	return out
}

// RequestView is one handle's hold on the core, or one Resolve waiting for
// another handle's admission slot (Resolving).
type RequestView struct {
	Handle HandleID
	// Scope is the admission slot's (Admission) or the one a Resolving
	// request waits for.
	Scope                  Scope
	Admission, Resolving   bool
	Granted, Waiting, Busy bool
}

// Promoting reports whether a force promote is under way.
func (v View) Promoting() bool {
	for _, t := range v.c.tasks {
		if t.promote {
			return true
		}
	}
	return false
}

// PromoteTask returns the id of the force promote under way, 0 if none.
func (v View) PromoteTask() uint64 {
	for _, t := range v.c.tasks {
		if t.promote {
			return t.id
		}
	}
	return 0
}

// RecentTimeline returns the timeline of id, a live task or one of the
// MaxTimelines tasks that finished last here.
func (v View) RecentTimeline(id uint64) (Timeline, bool) {
	if t := v.c.tasks[id]; t != nil {
		return t.timeline(), true
	}
	return v.c.timelines.get(id)
}

// Lookup returns the original of scope sc, or nil (R7.5). It may drop the
// index's entry for an owner that vanished, which changes no answer.
func (v View) Lookup(sc Scope) *Original { return v.c.original(sc) }

// Now returns the time of the core's last Step.
func (v View) Now() time.Time { return v.c.now }

// Stopped reports whether the core was stopped.
func (v View) Stopped() bool { return v.c.stopped }
