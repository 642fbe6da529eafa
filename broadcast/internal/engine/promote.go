package engine

import (
	"encoding/json"
	"log/slog"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/walcast/walcast/broadcast/internal/mutate"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// Force promote (R8.3) makes a secondary the primary after its primary was
// lost. Its task is an AlterReplicateConfig to every pchannel's control
// channel, AckSyncUp, holding the exclusive Cluster key. It runs:
//
//  1. Persisting, Appending as any task; once its copies are appended, it
//     records where they landed (WritePromote) before anything else, so
//     that a run after a crash neither appends them again nor scans from
//     the wrong place (#36).
//  2. Acking: it waits for the streaming nodes' acks, each made durable
//     before the node is answered (a PENDING record with checkpoints), so
//     that no ack is lost to a crash.
//  3. Promoting (the promoter): replication is fenced (later replicated
//     copies create no task); every pchannel is read from the promote's
//     copy to the end, so that copies an earlier run appended are found
//     and acked instead of appended again; then every incomplete task is
//     finished in broadcast-id order — its missing copies appended without
//     the replicate header, its callback run and its TOMBSTONE durable
//     before the next starts (stale AlterReplicateConfig tasks are
//     ignored by their callback).
//  4. Queued, Calling: its own callback stores this cluster as the primary;
//     once TOMBSTONE, the role is applied and the Cluster key released.
//
// The promoter talks to the rest of the core through a few calls: the
// live tasks (incomplete), the groups' unordered members, queueing a
// task's missing copies, fast acks, moves along the transition table, and
// finished (called when any task is Done).

// promoter owns step 3: the incomplete tasks finished one at a time in id
// order, each given its missing copies — acked where an earlier run
// appended them (the scan found them), appended otherwise —, then the
// promote itself moved on.
type promoter struct {
	t       *task
	from    map[message.PChannel]uint64
	found   map[copyKey]wal.Checkpoint
	todo    []*task // incomplete tasks, in id order
	current *task

	// What the promoter uses of its core: the live tasks and whether one
	// still is, the groups' members that can never run in order marked
	// ignored, a copy fast-acked, a task's missing copies appended
	// (supplementMissing), a move along the transition table, the logger,
	// the planted bug, and done, called once the promote moves on.
	tasks             func() []*task
	live              func(*task) bool
	ignoreUnordered   func()
	fastAck           func(*task, int)
	supplementMissing func(*task)
	move              func(*task, Trigger, Stage)
	log               *slog.Logger
	mutation          mutate.Bug
	done              func()
}

type copyKey struct {
	id uint64
	v  message.VChannel
}

// scanOp reads one pchannel; done gets its copies once the whole read
// succeeded.
type scanOp struct {
	p    message.PChannel
	from uint64
	bo   *backoff.ExponentialBackOff
	done func(found []Found)
}

// recordPromote records where t's copies landed, then moves it on to wait
// for its acks.
func (c *Core) recordPromote(t *task) {
	if t.recording {
		return // the positions are being written
	}
	pos := map[message.VChannel]uint64{}
	for i, v := range t.msg.Broadcast.VChannels {
		cp := t.copies[i].appendCP
		if !t.copies[i].appended {
			cp = t.copies[i].ackCP
		}
		if cp.MessageID != 0 {
			pos[v] = cp.MessageID
		}
	}
	if old := c.promotes[t.id]; old != nil {
		// Recovered: the first run recorded them.
		c.move(t, OnAppended, Acking)
		return
	}
	raw, _ := json.Marshal(promoteRecord{Copies: pos})
	t.recording = true
	c.writes.write(WritePromote, t, nil, []catalog.Op{catalog.Put(PromoteKey(c.cfg.Prefix, t.id), raw)}, func(_ *Core, _ *writeOp, d Decision, _ error) {
		t.recording = false
		if d == Done {
			c.promotes[t.id] = pos
			c.move(t, OnAppended, Acking)
			c.afterWrite(t) // acks that came meanwhile
		}
	})
}

// promoteRecord is what WritePromote stores: the message id of each of the
// promote's copies.
type promoteRecord struct {
	Copies map[message.VChannel]uint64 `json:"copies"`
}

// decodePromote reads a promote record; a record of the first format (the
// entry offset per pchannel) is read as positions of index 0.
func decodePromote(raw []byte) (map[message.VChannel]uint64, map[message.PChannel]uint64, error) {
	var r promoteRecord
	if err := json.Unmarshal(raw, &r); err == nil && r.Copies != nil {
		return r.Copies, nil, nil
	}
	old := map[message.PChannel]uint64{}
	if err := json.Unmarshal(raw, &old); err != nil {
		return nil, nil, err
	}
	return nil, old, nil
}

// startPromote runs step 3 once every ack of the promote is durable.
func (c *Core) startPromote(t *task) {
	c.roles.fenced = true
	p := &promoter{t: t, from: map[message.PChannel]uint64{}, found: map[copyKey]wal.Checkpoint{},
		tasks: func() []*task {
			xs := make([]*task, 0, len(c.tasks))
			for _, x := range c.tasks {
				xs = append(xs, x)
			}
			return xs
		},
		live:              func(x *task) bool { return c.tasks[x.id] == x },
		ignoreUnordered:   func() { c.groups.ignoreUnordered(c.log) },
		fastAck:           c.acks.fastAck,
		supplementMissing: c.supplementMissing,
		move:              c.move,
		log:               c.log,
		mutation:          c.cfg.Mutation,
		done:              func() { c.prom = nil },
	}
	c.prom = p
	for v, pos := range c.promotes[t.id] {
		pc := v.PChannel()
		if off, ok := p.from[pc]; !ok || wal.EntryOffset(pos) < off {
			p.from[pc] = wal.EntryOffset(pos)
		}
	}
	for i, v := range t.msg.Broadcast.VChannels {
		if _, ok := p.from[v.PChannel()]; !ok && t.copies[i].ackCP.MessageID != 0 {
			p.from[v.PChannel()] = wal.EntryOffset(t.copies[i].ackCP.MessageID)
		}
	}
	c.scans.all(p.from, func(found []Found) {
		for _, f := range found {
			p.found[copyKey{f.ID, f.VChannel}] = f.Checkpoint
		}
		p.finishAll()
	})
}

// scanner owns the WAL reads that a force promote and its id floor need
// (Scan actions): every pchannel read from an entry offset to the end, a
// read that failed read again whole with backoff (a partial read could
// append a copy twice), and done called once with every copy found when
// all reads succeeded.
type scanner struct {
	ops map[uint64]*scanOp

	// What the scanner uses of its core: ids, the actions out, its
	// logger, timers and the retry schedule.
	nextID  func() uint64
	out     *outbox
	log     *slog.Logger
	after   func(time.Duration, func()) *deadline
	backoff func() *backoff.ExponentialBackOff
}

// all reads every pchannel of from (from its entry offset to the end)
// and calls done with every copy found once all reads succeeded.
func (sc *scanner) all(from map[message.PChannel]uint64, done func([]Found)) {
	pcs := make([]message.PChannel, 0, len(from))
	for pc := range from {
		pcs = append(pcs, pc)
	}
	slices.Sort(pcs)
	if len(pcs) == 0 {
		done(nil)
		return
	}
	left := len(pcs)
	var all []Found
	for _, pc := range pcs {
		sc.scan(&scanOp{p: pc, from: from[pc], done: func(found []Found) {
			all = append(all, found...)
			left--
			if left == 0 {
				done(all)
			}
		}})
	}
}

func (sc *scanner) scan(s *scanOp) {
	id := sc.nextID()
	sc.ops[id] = s
	sc.out.scan(Scan{ID: id, PChannel: s.p, From: s.from})
}

// scanned collects one pchannel's copies; a pchannel that cannot be read is
// read again with backoff (a partial scan could append a copy twice).
func (sc *scanner) scanned(e Scanned) {
	s := sc.ops[e.ID]
	if s == nil {
		return
	}
	delete(sc.ops, e.ID)
	if e.Err != nil {
		// Copies found before the failure are real; the next read finds
		// them again.
		sc.log.Warn("force promote: cannot scan pchannel; retrying", "pchannel", s.p, "err", e.Err)
		if s.bo == nil {
			s.bo = sc.backoff()
		}
		sc.after(s.bo.NextBackOff(), func() { sc.scan(s) })
		return
	}
	s.done(e.Found)
}

// replicatedHighest returns, per pchannel, the highest position of a
// replicated copy acked here (live tasks and tombstones): a node acks a
// pchannel's copies in WAL order, so every copy before it was acked and its
// id is known (seen, or below the id floor GC raised).
func (c *Core) replicatedHighest() map[message.PChannel]uint64 {
	highest := map[message.PChannel]uint64{}
	note := func(vs []message.VChannel, acked func(int) (bool, wal.Checkpoint)) {
		for i, v := range vs {
			if ok, cp := acked(i); ok && cp.MessageID > highest[v.PChannel()] {
				highest[v.PChannel()] = cp.MessageID
			}
		}
	}
	for _, t := range c.tasks {
		if t.replicated {
			note(t.msg.Broadcast.VChannels, func(i int) (bool, wal.Checkpoint) { return t.copies[i].acked, t.copies[i].ackCP })
		}
	}
	for _, tb := range c.tombs.all() {
		if !tb.replicated() {
			continue
		}
		if rec, err := DecodeRecord(rawBytes(tb.raw())); err == nil {
			note(rec.Msg.Broadcast.VChannels, func(i int) (bool, wal.Checkpoint) { return rec.Acked[i], rec.Checkpoints[i] })
		}
	}
	return highest
}

// finishAll lists the incomplete tasks and finishes them in id order.
func (p *promoter) finishAll() {
	p.ignoreUnordered()
	for _, x := range p.tasks() {
		if x != p.t {
			p.todo = append(p.todo, x)
		}
	}
	slices.SortFunc(p.todo, func(a, b *task) int { return compareTicks(a.id, b.id, 0, 0) })
	p.log.Warn("force promote: finishing incomplete tasks", "count", len(p.todo), "promote", p.t.id)
	p.next()
}

// next finishes the next incomplete task, or the promote itself.
func (p *promoter) next() {
	for len(p.todo) > 0 {
		x := p.todo[0]
		p.todo = p.todo[1:]
		if !p.live(x) {
			continue // finished meanwhile
		}
		p.current = x
		p.supplement(x)
		return
	}
	p.current = nil
	t := p.t
	p.done()
	p.move(t, OnPromoted, Queued)
}

// supplement gives x every missing copy: acked where an earlier run
// appended it (unless AckSyncUp, or a two-phase append's first copy: its
// consumer acks it), appended now without the replicate header otherwise. An
// AckSyncUp task's copies count only once consumers ack them (R4.4); a
// two-phase append's first copies are appended, and acked by their
// consumers, before the rest (R13.11).
func (p *promoter) supplement(x *task) {
	syncUp := x.msg.Broadcast.AckSyncUp
	for i, v := range x.msg.Broadcast.VChannels {
		if x.copies[i].acked {
			continue
		}
		if cp, ok := p.found[copyKey{x.id, v}]; ok && !p.mutation.Is(mutate.SupplementTwice) {
			x.copies[i].appended, x.copies[i].appendCP = true, cp
			if !syncUp && !x.first(i) {
				p.fastAck(x, i)
			}
		}
	}
	x.supplementing = true
	p.supplementMissing(x)
	switch x.stage {
	case Collecting:
		p.move(x, OnSupplement, Queued)
	case Queued:
		p.move(x, OnSupplement, Queued)
	}
}

// supplementMissing appends x's copies that are neither acked nor in the
// WAL: a two-phase append's first copies alone while they are not all
// acked (checkAcked calls it again once they are).
func (c *Core) supplementMissing(x *task) {
	var missing []int
	for i := range x.copies {
		if cp := x.copies[i]; !cp.acked && !cp.queued && !cp.appended {
			missing = append(missing, i)
		}
	}
	x.supplementRest = false
	if first := firstPhaseOf(x, missing); first != nil {
		missing, x.supplementRest = first, true
		c.log.Warn("force promote: appending a two-phase broadcast's first copies first", "broadcast", x.id,
			"vchannels", vchannelsOf(x, first))
	} else if len(x.msg.Broadcast.AppendFirst) > 0 && !x.firstAcked() {
		x.supplementRest = true // the first copies are in the WAL: wait for their acks
		return
	}
	if len(missing) == 0 {
		return
	}
	if x.replicated && x.wire == nil {
		wire, err := message.Marshal(x.msg.WithoutReplicateHeader())
		if err != nil {
			// The message was encoded when its task was created: this
			// cannot fail.
			c.log.Error("force promote: encode", "broadcast", x.id, "err", err)
			return
		}
		x.wire = wire
	}
	want := map[int]bool{}
	for _, i := range missing {
		want[i] = true
	}
	c.lanes.queueCopies(x, func(i int) bool { return want[i] })
}

// finished is called whenever a task is Done.
func (p *promoter) finished(t *task) {
	if p.current == t {
		p.next()
	}
}
