package engine

import (
	"slices"
	"time"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// Reads for the engine's introspection API. They run between two events
// (Inspect) and copy what they return.

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
	Outcome         Outcome
	Commits         int
	Window          Window
}

// CopyView is one copy of a live task.
type CopyView struct {
	VChannel   message.VChannel
	Appended   bool
	Acked      bool
	Checkpoint wal.Checkpoint
}

func (c *Core) view(t *task) TaskView {
	v := TaskView{ID: t.id, Msg: t.msg, State: t.state(), Stage: t.stage, Created: t.created,
		AppendAttempts: t.appendAttempts, AppendError: t.appendErr, Attempts: t.attempts, LastError: t.lastErr,
		LastAttemptAt: t.lastAt, NextAttemptAt: t.nextAt, CallbackStarted: t.attempts > 0,
		Running: t.stage == Calling, Outcome: t.outcome, Commits: t.commits,
		Window: c.window(t.class, t.id, t.created, time.Time{})}
	for i, vc := range t.msg.Broadcast.VChannels {
		cp := t.copies[i]
		v.Copies = append(v.Copies, CopyView{VChannel: vc, Appended: cp.appended, Acked: cp.acked, Checkpoint: cp.ackCP})
	}
	return v
}

// TaskByID returns live task id's view, or tombstone id's record.
func (c *Core) TaskByID(id uint64) (live *TaskView, record string, window Window, ok bool) {
	if t := c.tasks[id]; t != nil {
		v := c.view(t)
		return &v, "", Window{}, true
	}
	if tb, found := c.tombs.get(id); found {
		o := c.tombOriginal(tb)
		return nil, tb.raw, o.Window, true
	}
	return nil, "", Window{}, false
}

// LiveTasks returns the views of every live task, by id.
func (c *Core) LiveTasks() []TaskView {
	out := make([]TaskView, 0, len(c.tasks))
	for _, t := range c.tasks {
		out = append(out, c.view(t))
	}
	slices.SortFunc(out, func(a, b TaskView) int { return compareTicks(a.ID, b.ID, 0, 0) })
	return out
}

// EachLive calls fn for every live task, in id order, with its persisted
// state, stage, message and callback attempts, without building views.
func (c *Core) EachLive(fn func(id uint64, st State, stage Stage, m *message.Message, attempts int)) {
	ids := make([]uint64, 0, len(c.tasks))
	for id := range c.tasks {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		t := c.tasks[id]
		fn(id, t.state(), t.stage, t.msg, t.attempts)
	}
}

// TombRecord is a tombstone's id and record.
type TombRecord struct {
	ID     uint64
	Record string
}

// Tombstones returns every tombstone's record.
func (c *Core) Tombstones() []TombRecord {
	all := c.tombs.all()
	out := make([]TombRecord, len(all))
	for i, tb := range all {
		out[i] = TombRecord{ID: tb.id, Record: tb.raw}
	}
	return out
}

// Locks returns the issuance lock table (R3.7).
func (c *Core) Locks() []resource.KeyState { return c.locks.Snapshot() }

// Stats returns the counters.
func (c *Core) Stats() Stats { return c.stats }

// Counts returns the live task and tombstone counts.
func (c *Core) Counts() (live, tombstones int) { return len(c.tasks), c.tombs.count() }

// Role returns the cluster's role and topology.
func (c *Core) Role() (Role, ReplicateConfig) { return c.roles.role, c.roles.cfg }

// EarlyEvictions returns, per retention class, how many tombstones MaxCount
// evicted before their MaxLifetime.
func (c *Core) EarlyEvictions() map[string]int {
	out := make(map[string]int, len(c.tombs.classes))
	for i, cl := range c.tombs.classes {
		out[cl.cfg.Name] = c.tombs.early[i]
	}
	return out
}

// IDsUsed reports whether the cluster ever allocated or observed a
// broadcast id.
func (c *Core) IDsUsed() bool { return c.ids.used() }
