package engine

import (
	"encoding/json"
	"fmt"
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

// Role is a cluster's part in replication (SPEC §8).
type Role int32

// Roles.
const (
	Primary   Role = 1
	Secondary Role = 2
)

// String returns "primary", "secondary" or "unknown".
func (r Role) String() string {
	switch r {
	case Primary:
		return "primary"
	case Secondary:
		return "secondary"
	}
	return "unknown"
}

// ReplicateConfig is the replication topology: every cluster in it has the
// same view, and its role follows from its name.
type ReplicateConfig struct {
	// Primary names the primary cluster; "" means no replication: every
	// cluster is primary.
	Primary string `json:"primary"`
	// Secondaries are the clusters following the primary.
	Secondaries []SecondaryConfig `json:"secondaries,omitempty"`
	// ForcePromote marks the message of a force promote (never set in a
	// stored topology).
	ForcePromote bool `json:"force_promote,omitempty"`
	// Generation is the replication generation of the primary (R8.5): 0
	// for a cluster that was primary from the start, and for a promoted
	// one the id space of the force promote that made it primary, which is
	// above the space of every id it knew of, so each promote along a
	// chain of clusters raises it. A topology change the primary
	// broadcasts keeps it, so its secondaries learn it. A cluster whose
	// generation is below another primary's that replaced it is
	// superseded.
	Generation uint64 `json:"generation,omitempty"`
	// Replaced names the primary the force promote that set Generation
	// replaced ("" if none).
	Replaced string `json:"replaced,omitempty"`
}

// SecondaryConfig is one secondary cluster.
type SecondaryConfig struct {
	Name string `json:"name"`
	// Source is where the secondary's replicator reads the primary's WAL.
	Source string `json:"source,omitempty"`
}

// RoleOf returns the role the topology gives the cluster named name.
func (c ReplicateConfig) RoleOf(name string) Role {
	if c.Primary == "" || c.Primary == name {
		return Primary
	}
	return Secondary
}

// Secondary returns the settings of the secondary named name.
func (c ReplicateConfig) Secondary(name string) (SecondaryConfig, bool) {
	for _, s := range c.Secondaries {
		if s.Name == name {
			return s, true
		}
	}
	return SecondaryConfig{}, false
}

// AlterReplicateConfig is the built-in message type that changes the
// replication topology. The core runs its callback itself: it stores the
// topology (effect-once) and, once TOMBSTONE, applies the role it gives
// this cluster, before releasing the exclusive Cluster key it holds.
var AlterReplicateConfig = message.Type{Name: "AlterReplicateConfig", Version: 1}

// Reserved message properties (callers cannot set walcast.* properties).
const (
	ReservedPropertyPrefix = "walcast."
	// UnreplicableProperty marks a message the replicator must not copy.
	UnreplicableProperty = ReservedPropertyPrefix + "unreplicable"
	// ForcePromoteMark is UnreplicableProperty's value on a force promote.
	ForcePromoteMark = "force-promote"
	// LocalMark is UnreplicableProperty's value on a local-only broadcast
	// (R13.13): accepted on any role, never replicated.
	LocalMark = "local"
	// RequestDigestProperty carries the hex of the caller's request digest,
	// so that it replicates with the message (R7.6, R8.4).
	RequestDigestProperty = ReservedPropertyPrefix + "request-digest"
)

// roles is the cluster's replication state and its rules: the role a
// topology gives this cluster, what AlterReplicateConfig's callback stores
// (a replicated change a force promote overtook ignored, a promote's new
// generation, a primary's change keeping its generation), and applying a
// stored topology. The core runs the callback and applies its result once
// the task is TOMBSTONE.
type roles struct {
	role Role
	cfg  ReplicateConfig
	// fenced is set once a force promote has every pchannel's ack: no
	// replicated copy may create a task any more (R8.3).
	fenced bool

	// cluster is this cluster's name, prefix the catalog prefix.
	cluster, prefix string
	// What the roles use of their core: the actions out and a task's
	// logger (the core's for nil).
	out *outbox
	log func(*task) *slog.Logger
}

// set makes cfg the topology and applies the role it gives this cluster.
func (r *roles) set(cfg ReplicateConfig) {
	role := cfg.RoleOf(r.cluster)
	if old := r.role; old != role && old != 0 {
		r.log(nil).Warn("cluster role changed", "from", old.String(), "to", role.String(), "primary", cfg.Primary)
	}
	r.role, r.cfg = role, cfg
	if role == Primary {
		r.fenced = false
	}
	r.out.roleChanged(RoleChanged{Role: role, Config: cfg})
}

// callback is AlterReplicateConfig's callback. A replicated topology
// change that a force promote overtook is ignored, so an old configuration
// cannot overwrite the promoted one (R8.3).
func (r *roles) callback(t *task) ([]catalog.Op, Outcome, error) {
	var cfg ReplicateConfig
	if err := json.Unmarshal(t.msg.Payload, &cfg); err != nil {
		return nil, Outcome{}, fmt.Errorf("decode %s payload: %w", AlterReplicateConfig, err)
	}
	if t.msg.Replicate != nil && (r.fenced || r.role == Primary) {
		return nil, Outcome{Status: Ignored, Detail: "replicated configuration superseded by a force promote"}, nil
	}
	switch {
	case cfg.ForcePromote:
		// A new generation: the promote's id space (R8.5).
		cfg = ReplicateConfig{Primary: r.cluster, Generation: Space(t.id), Replaced: r.cfg.Primary}
	case t.msg.Replicate == nil && cfg.Generation < r.cfg.Generation:
		// A topology change of this primary keeps its generation.
		cfg.Generation, cfg.Replaced = r.cfg.Generation, r.cfg.Replaced
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, Outcome{}, err
	}
	detail := "cluster " + r.cluster + " is " + cfg.RoleOf(r.cluster).String()
	return []catalog.Op{catalog.Put(ReplicateKey(r.prefix), raw)}, Outcome{Status: Succeeded, Detail: detail, Data: raw}, nil
}

// apply applies the topology a finished AlterReplicateConfig task stored.
func (r *roles) apply(t *task) {
	if t.msg.Type != AlterReplicateConfig || t.outcome.Status != Succeeded || t.outcome.Data == nil {
		return
	}
	var cfg ReplicateConfig
	if err := json.Unmarshal(t.outcome.Data, &cfg); err != nil {
		r.log(t).Error("applied replication config does not decode", "broadcast", t.id, "err", err)
		return
	}
	r.set(cfg)
}

// follow makes the cluster a secondary under e.Config (R8.1), from a handle
// holding the exclusive Cluster key. A cluster joins empty, so the broadcast
// ids it will take from its primary cannot meet ids of its own (its nodes
// skip ids they applied): a primary that ever allocated or saw a broadcast
// id (the persisted id floor outlives its tombstones) is refused with
// ErrFailedPrecondition. A secondary may follow again (a new topology).
func (c *Core) follow(e Follow, h HandleID) {
	hd := c.handles.byID[h]
	if hd == nil || !hd.granted {
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: follow needs the exclusive Cluster key", ErrFailedPrecondition)})
		return
	}
	if c.roles.role == Primary && (c.ids.used() || len(c.tasks) > 0 || c.tombs.count() > 0) {
		c.handles.drop(hd)
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: cluster %s has broadcast before; a cluster joins as a secondary empty", ErrFailedPrecondition, c.cfg.ClusterName)})
		return
	}
	raw, err := json.Marshal(e.Config)
	if err != nil {
		c.handles.drop(hd)
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: %w", ErrInvalidArgument, err)})
		return
	}
	hd.busy = true
	c.writes.write(WriteTopology, nil, nil, []catalog.Op{catalog.Put(ReplicateKey(c.cfg.Prefix), raw)}, func(_ *Core, _ *writeOp, d Decision, err error) {
		hd.busy = false
		if d == Done {
			c.roles.set(e.Config)
		}
		c.handles.drop(hd)
		if d != Done {
			c.out.reply(e.To, Reply{Err: err})
			return
		}
		c.out.reply(e.To, Reply{})
	})
}

// check refuses what the cluster's role does not allow (R8.1, R8.3).
func (r *roles) check(need Role) error {
	switch {
	case need == Primary && r.role != Primary:
		return ErrNotPrimary
	case need == Secondary && r.role != Secondary:
		return ErrNotSecondary
	}
	return nil
}
