package engine

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/walcast/walcast/broadcast/internal/mutate"
	"github.com/walcast/walcast/internal/idset"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

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
