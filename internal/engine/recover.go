package engine

import (
	"fmt"
	"slices"
	"time"

	"github.com/walcast/walcast/internal/idset"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// recover rebuilds the core from the catalog (R4.8): PENDING tasks re-take
// their resource keys (a conflict is corrupt metadata) and resume
// appending; REPLICATED tasks wait for acks, those whose control copy is
// acked enrolled in control-channel order; tombstones re-enter GC with
// their persisted completion time (R6.3); the idempotency index is rebuilt
// for every state; the id floor stays above every id seen.
func (c *Core) recover(s Snapshot) error {
	c.setTopology(s.Topology)
	if s.Collected != nil {
		set, err := idset.Decode(s.Collected)
		if err != nil {
			return fmt.Errorf("%w: collected replicated ids: %w", ErrCorruptCatalog, err)
		}
		c.collected = set
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
			c.promotesOld[id] = true
		}
		c.promotes[id] = copies
	}
	var pending, replicated []*task
	perClass := make([][]tomb, len(c.tombs.classes))
	maxID := uint64(0)
	fail := func(err error) error {
		for _, t := range pending {
			c.locks.Release(t.lock)
		}
		return err
	}
	for _, r := range s.Tasks {
		rec, err := DecodeRecord(r.Raw)
		if err != nil {
			return fail(fmt.Errorf("%w: task record %d: %w", ErrCorruptCatalog, r.ID, err))
		}
		if rec.Msg.Broadcast.ID != r.ID {
			return fail(fmt.Errorf("%w: record %d holds broadcast %d", ErrCorruptCatalog, r.ID, rec.Msg.Broadcast.ID))
		}
		maxID = max(maxID, r.ID)
		cls := c.cfg.ClassOf(rec.Msg.Type)
		if rec.State == Tombstone {
			tb := tomb{id: r.ID, raw: c.tombs.keep(r.Raw), created: rec.Created.UnixNano(), completed: rec.Completed.UnixNano(),
				cls: uint16(cls), replicated: rec.Msg.Replicate != nil}
			perClass[cls] = append(perClass[cls], tb)
			if tb.replicated {
				c.indexReplicated(ScopeOf(rec.Msg.Type, rec.Msg.IdempotencyKey), r.ID)
			} else {
				c.indexScope(ScopeOf(rec.Msg.Type, rec.Msg.IdempotencyKey), r.ID)
			}
			c.obs.TaskState(rec.Msg.Type, 0, Tombstone)
			continue
		}
		info, _ := c.cfg.Types.Lookup(rec.Msg.Type)
		t := newTask(rec.Msg, rec.Message, info, rec.Created)
		t.digest, t.request = rec.PayloadDigest, rec.RequestDigest
		t.class = cls
		t.replicated = rec.State == Replicated
		for i := range t.copies {
			if rec.Acked[i] {
				t.copies[i].acked, t.copies[i].ackCP = true, rec.Checkpoints[i]
				t.nacked++
			}
		}
		t.persistedAcks = t.nacked
		if t.replicated {
			c.ids.observe(t.id)
			replicated = append(replicated, t)
		} else {
			r, err := c.locks.NewRequest(t.keys)
			if err == nil {
				err = c.locks.TryAcquire(r)
			}
			if err != nil {
				return fail(fmt.Errorf("%w: recovered pending task %d cannot take its resource keys: %w", ErrCorruptCatalog, t.id, err))
			}
			r.Ref, r.Owner = t, fmt.Sprintf("broadcast %d", t.id)
			t.lock = r
			pending = append(pending, t)
		}
		c.tasks[t.id] = t
		c.indexTask(t)
		c.obs.TaskState(t.msg.Type, 0, rec.State)
	}
	for cls, tombs := range perClass {
		slices.SortFunc(tombs, func(x, y tomb) int { return compareTicks(uint64(x.completed), uint64(y.completed), x.id, y.id) })
		c.tombs.load(cls, slices.Clip(tombs))
	}
	c.ids.start(s.IDFloor, maxID)
	c.stats.Recovered = len(pending) + len(replicated) + c.tombs.count()
	slices.SortFunc(pending, func(x, y *task) int { return compareTicks(x.id, y.id, 0, 0) })
	for _, t := range pending {
		if t.promote {
			c.recoverPromote(t)
			continue
		}
		c.move(t, OnRecoverPending, Appending)
	}
	// Replicated tasks whose control channel copy is acked are scheduled in
	// control-channel order (R5.4); the rest enrol when it is acked.
	slices.SortFunc(replicated, func(x, y *task) int { return compareTicks(x.controlTick(), y.controlTick(), x.id, y.id) })
	for _, t := range replicated {
		if t.controlTick() != 0 || t.control < 0 && t.allAcked() {
			c.move(t, OnRecoverReplicated, Queued)
		} else {
			c.move(t, OnRecoverReplicated, Collecting)
		}
	}
	c.log.Info("broadcaster recovered", "pending", len(pending), "replicated", len(replicated),
		"tombstones", c.tombs.count(), "next_id", c.ids.next)
	return nil
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
	c.scanAll(from, func(found []Found) {
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
