package engine

import (
	"fmt"
	"log/slog"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/walcast/walcast/broadcast/internal/mutate"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// Groups (R13.1-R13.9): one set of resource keys held across several
// broadcasts. A group is opened by its Begin, an ordinary broadcast that
// takes the keys; once the Begin's TOMBSTONE (marked holds_keys) is
// durable — whatever its callback reported, so that a secondary opens the
// same groups as its primary — the Begin stays in stage Holding and
// keeps the keys but the shared Cluster key (so that a long-lived group
// does not hold up topology changes). Its members then come one at a time,
// each holding only the shared Cluster key of its own and stamped with the
// group's keys: they need no lock, since the group holds it, and a DDL
// already queued for one of the keys stays queued. The group ends with its
// first Commit or Rollback, whose TOMBSTONE transaction also rewrites the
// Begin's record as released; once durable, the keys are released and the
// group's tombstones join GC together (in the Begin's retention class), to
// be deleted in one transaction.
//
// Two kinds share the machinery:
//
//   - a transaction (R13.1-R13.5): a Begin, bodies, and a Commit or
//     Rollback, named by the Begin's id; every member keeps the Begin's
//     targets; a client may resume it by id after any restart;
//   - a resource-key owner (R13.7-R13.9): a broadcast of a type that
//     acquires an ownership under a stable owner key (an Import acquires
//     "import/<job>"), and the broadcast of a type that ends it (a
//     CommitImport), found by that key.
//
// Members' callbacks take effect in sequence order: on the primary a
// member is created only once the previous one finished, and on a
// secondary (whose REPLICATED members hold no keys) a member's callback
// waits for its predecessor's. A force promote refuses to start while a
// group misses a member, and hands the open groups' keys over to the
// promoted cluster before it releases the exclusive Cluster key.

// group is one open group.
type group struct {
	id  uint64
	key string // owner key; "" for a transaction
	txn bool
	// keys are the Begin's keys (the Cluster key included, as stamped on
	// every member); targets the Begin's targets (a transaction's members
	// keep them).
	keys    []resource.Key
	targets []message.VChannel
	// begin is the Begin task: live, then in stage Holding; nil on a
	// secondary until its copies arrive.
	begin *task
	// lock holds the group's keys once the Begin holds them; nil on a
	// secondary (replicated groups hold nothing until a promote hands them
	// over).
	lock *resource.Request
	// live are the live members but the Begin, by seq.
	live map[uint32]*task
	// done are the tombstones of finished members (the Begin first), kept
	// until the group ends; seqs their seqs.
	done []tomb
	seqs []uint32
	// doneSeq is the highest seq up to which every member finished, -1
	// before the Begin.
	doneSeq int
	// next is the seq of the next member; busy says one is being created.
	next uint32
	busy bool
	// ending is the first Commit or Rollback, once created.
	ending *task
	// queue are member submits waiting for the member in flight.
	queue []queuedMember
}

type queuedMember struct {
	h *handle
	e Submit
}

// label names the group in lock listings.
func (g *group) label() string {
	if g.txn {
		return fmt.Sprintf("transaction %d", g.id)
	}
	return fmt.Sprintf("owner %d (%s)", g.id, g.key)
}

// held reports whether the Begin holds the group's keys (its TOMBSTONE is
// durable).
func (g *group) held() bool { return g.begin != nil && g.begin.stage == Holding }

// groupTable holds the open groups by id and the owner keys (R13.1,
// R13.7): which owner key is taken, the group a member belongs to, the
// members a secondary never received (R13.5).
type groupTable struct {
	open map[uint64]*group
	// owners maps an owner key to its open group.
	owners map[string]uint64
	// endedOwners maps an owner key to the group that last held it, once
	// ended, while its tombstones are remembered: a retried end is answered
	// by the end's result (R13.3, R13.8).
	endedOwners map[string]uint64
	// maxMembers bounds a group's members (Config.MaxGroupMembers).
	maxMembers int

	// What the table uses of its core: the tombstones (an ended group's,
	// its members'), the role, the actions out, the handles and locks
	// (members' handles dropped, the group's keys kept, shrunk, released,
	// handed over), the logger, the catalog prefix, the planted bug;
	// whether a task is live, how a member is submitted again once its
	// turn comes and how a request joins a group's end, how a task is
	// scheduled and moved along the transition table.
	tombs    *tombstones
	roles    *roles
	out      *outbox
	handles  *handleTable
	locks    *resource.Table
	log      *slog.Logger
	prefix   string
	mutation mutate.Bug
	live     func(id uint64) bool
	submit   func(*handle, Submit)
	joinEnd  func(end *task, to Target)
	schedule func(*task)
	move     func(*task, Trigger, Stage)
}

func newGroupTable(maxMembers int) groupTable {
	if maxMembers <= 0 {
		maxMembers = 64
	}
	return groupTable{open: make(map[uint64]*group), owners: make(map[string]uint64), endedOwners: make(map[string]uint64),
		maxMembers: maxMembers}
}

// businessKeys are keys without the shared Cluster key, which is always
// last in normalised order: what a holding group keeps.
func businessKeys(keys []resource.Key) int {
	if n := len(keys); n > 0 && keys[n-1] == resource.SharedCluster() {
		return n - 1
	}
	return len(keys)
}

// groupHeaderField is the field number of the group header in the durable
// Message.
const groupHeaderField protowire.Number = 13

// appendGroupHeader appends a group header holding id and seq to an
// encoded message: it merges with a header the face encoded (kind, owner
// key), so the core completes the header without encoding again.
func appendGroupHeader(b []byte, id uint64, seq uint32) []byte {
	var h []byte
	if id != 0 {
		h = protowire.AppendTag(h, 1, protowire.VarintType)
		h = protowire.AppendVarint(h, id)
	}
	if seq != 0 {
		h = protowire.AppendTag(h, 2, protowire.VarintType)
		h = protowire.AppendVarint(h, uint64(seq))
	}
	b = protowire.AppendTag(b, groupHeaderField, protowire.BytesType)
	return protowire.AppendBytes(b, h)
}

// checkBegin refuses a Begin whose owner key is taken (R13.7).
func (gt *groupTable) checkBegin(m *message.Message) error {
	g := m.Group
	if g == nil || g.Kind != message.GroupBegin || g.OwnerKey == "" {
		return nil
	}
	if id, ok := gt.owners[g.OwnerKey]; ok {
		return fmt.Errorf("%w: %s is owned by broadcast %d", ErrFailedPrecondition, g.OwnerKey, id)
	}
	return nil
}

// openGroup registers the group a new Begin t opens.
func (gt *groupTable) openGroup(t *task) *group {
	g := &group{id: t.id, key: t.msg.Group.OwnerKey, txn: t.msg.Group.OwnerKey == "", keys: t.keys,
		targets: t.msg.Broadcast.VChannels, begin: t, live: map[uint32]*task{}, doneSeq: -1, next: 1}
	gt.open[g.id] = g
	if g.key != "" {
		gt.owners[g.key] = g.id
	}
	t.group = g
	return g
}

// groupOf returns the group a replicated member belongs to, registering a
// group whose Begin has not arrived yet.
func (gt *groupTable) groupOf(t *task) *group {
	h := t.msg.Group
	if t.gkind == message.GroupBegin {
		g := gt.open[t.id]
		if g == nil {
			g = gt.openGroup(t)
		}
		g.begin = t
		g.keys, g.targets = t.keys, t.msg.Broadcast.VChannels
		t.group = g
		return g
	}
	g := gt.open[h.ID]
	if g == nil {
		g = &group{id: h.ID, key: h.OwnerKey, txn: h.OwnerKey == "", keys: t.keys, targets: t.msg.Broadcast.VChannels,
			live: map[uint32]*task{}, doneSeq: -1, next: 1}
		gt.open[g.id] = g
		if g.key != "" {
			gt.owners[g.key] = g.id
		}
	}
	g.live[t.gseq] = t
	g.next = max(g.next, t.gseq+1)
	if t.gkind.Ends() && g.ending == nil {
		g.ending = t
	}
	t.group = g
	return g
}

// submitMember handles a Submit into an open group (R13.1, R13.7): it
// checks the member against the group, queues it behind the member in
// flight, joins a concurrent end of the same kind, or creates it.
func (c *Core) submitMember(h *handle, e Submit) {
	if c.groups.open[e.Group] == nil && e.Msg.Group != nil {
		if o := c.tombs.endedBy(e.Group, e.Msg.Group.Kind); o != nil {
			// The group ended with an end of this kind: a retried end gets
			// its result (R13.3).
			c.handles.drop(h)
			c.out.reply(e.To, Reply{Original: o})
			return
		}
	}
	if err := c.groups.memberError(e); err != nil {
		c.handles.drop(h)
		c.out.reply(e.To, Reply{Err: err})
		return
	}
	g := c.groups.open[e.Group]
	kind := e.Msg.Group.Kind
	if end := g.ending; end != nil {
		if kind == end.gkind {
			// The first end wins; a concurrent one of the same kind joins it
			// (R13.3).
			c.handles.drop(h)
			c.joinEnd(end, e.To)
			return
		}
		c.handles.drop(h)
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: %s %d is ending with %s broadcast %d", ErrFailedPrecondition, groupWord(g), g.id,
			end.gkind, end.id)})
		return
	}
	if !g.held() || g.busy || len(g.live) > 0 {
		// One member at a time, once the Begin holds the keys: members are
		// created, and take effect, in sequence order.
		h.busy = true
		h.to = e.To
		g.queue = append(g.queue, queuedMember{h, e})
		return
	}
	if kind == message.GroupBody && int(g.next) >= c.groups.maxMembers-1 {
		c.handles.drop(h)
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: transaction %d has %d members; the last of %d is kept for its Commit or Rollback",
			ErrGroupFull, g.id, g.next, c.groups.maxMembers)})
		return
	}
	g.busy = true
	h.busy = true
	h.to = e.To
	c.allocFor(h, e)
}

func groupWord(g *group) string {
	if g.txn {
		return "transaction"
	}
	return "owner"
}

// memberError checks a member against its group.
func (gt *groupTable) memberError(e Submit) error {
	hd := e.Msg.Group
	if hd == nil || hd.ID != e.Group || hd.Kind == message.GroupBegin {
		return fmt.Errorf("%w: a member of group %d needs its group header", ErrInvalidArgument, e.Group)
	}
	g := gt.open[e.Group]
	if g == nil || g.begin == nil && gt.roles.role == Primary {
		return gt.endedError(e.Group)
	}
	return g.fits(e.Msg)
}

// fits checks that member m carries group g's owner key, keys and (a
// transaction's) targets, and that an owner gets no body.
func (g *group) fits(m *message.Message) error {
	hd := m.Group
	if g.txn != (hd.OwnerKey == "") || hd.OwnerKey != g.key {
		return fmt.Errorf("%w: group %d is %s, the member says owner key %q", ErrInvalidArgument, g.id, g.label(), hd.OwnerKey)
	}
	if !g.txn && hd.Kind == message.GroupBody {
		return fmt.Errorf("%w: owner %s takes no bodies, only its end", ErrInvalidArgument, g.key)
	}
	if !slices.Equal(m.Broadcast.ResourceKeys, g.keys) {
		return fmt.Errorf("%w: member keys %v differ from the group's %v", ErrInvalidArgument, m.Broadcast.ResourceKeys, g.keys)
	}
	if g.txn && !slices.Equal(m.Broadcast.VChannels, g.targets) {
		return fmt.Errorf("%w: a transaction's members keep its targets %v, not %v", ErrInvalidArgument, g.targets, m.Broadcast.VChannels)
	}
	return nil
}

// replicatedError checks a replicated broadcast's group header before
// a secondary creates its task (R13.1, R13.2): a Begin at seq 0 naming
// no group or itself; a member naming another broadcast's group, at seq 1
// or more, and fitting the group known here (its Begin's, or its first
// member's). A malformed one is refused before anything is written: a
// member recovery would find off its group would make the catalog corrupt.
func (gt *groupTable) replicatedError(m *message.Message) error {
	hd, id := m.Group, m.Broadcast.ID
	switch {
	case hd.Kind == message.GroupBegin:
		if hd.Seq != 0 || hd.ID != 0 && hd.ID != id {
			return fmt.Errorf("%w: replicated Begin %d has group %d seq %d", ErrInvalidArgument, id, hd.ID, hd.Seq)
		}
		return nil
	case hd.Kind != message.GroupBody && !hd.Kind.Ends():
		return fmt.Errorf("%w: replicated broadcast %d has group kind %d", ErrInvalidArgument, id, hd.Kind)
	case hd.ID == 0 || hd.ID == id || hd.Seq == 0:
		return fmt.Errorf("%w: replicated member %d has group %d seq %d", ErrInvalidArgument, id, hd.ID, hd.Seq)
	}
	if g := gt.open[hd.ID]; g != nil {
		if err := g.fits(m); err != nil {
			return fmt.Errorf("replicated member %d: %w", id, err)
		}
	}
	return nil
}

// endedError explains a member for a group that is not open.
func (gt *groupTable) endedError(id uint64) error {
	if tb, ok := gt.tombs.get(id); ok {
		if r, err := DecodeRecord(rawBytes(tb.raw())); err == nil && r.HoldsKeys {
			return fmt.Errorf("%w: group %d has ended (released by broadcast %d)", ErrFailedPrecondition, id, r.ReleasedBy)
		}
		return fmt.Errorf("%w: broadcast %d does not hold a group open (its callback did not succeed, or it is no group's Begin)",
			ErrFailedPrecondition, id)
	}
	if gt.live(id) {
		return fmt.Errorf("%w: broadcast %d is no group's Begin", ErrFailedPrecondition, id)
	}
	return fmt.Errorf("%w: no open group %d", ErrNotFound, id)
}

// endedBy returns the end of ended group id if it is of kind and still
// remembered.
func (ts *tombstones) endedBy(id uint64, kind message.GroupKind) *Original {
	tb, ok := ts.get(id)
	if !ok || !kind.Ends() {
		return nil
	}
	r, err := DecodeRecord(rawBytes(tb.raw()))
	if err != nil || !r.HoldsKeys || r.ReleasedBy == 0 {
		return nil
	}
	end, ok := ts.get(r.ReleasedBy)
	if !ok {
		return nil
	}
	er, err := DecodeRecord(rawBytes(end.raw()))
	if err != nil || er.Msg.Group == nil || er.Msg.Group.Kind != kind {
		return nil
	}
	return ts.original(end)
}

// joinEnd makes to wait for the group's end.
func (c *Core) joinEnd(end *task, to Target) {
	if to == nil {
		return // withdrawn
	}
	if c.tasks[end.id] == end {
		end.waiters = append(end.waiters, to)
		return
	}
	c.wait(Wait{To: to, ID: end.id})
}

// createMember completes a member's creation: its seq, appended to its
// encoding with the group header.
func (g *group) createMember(t *task, e *Submit) {
	t.gseq = g.next
	g.next++
	e.Msg.Group.Seq = t.gseq
	t.bytes = appendGroupHeader(t.bytes, 0, t.gseq)
	g.live[t.gseq] = t
	if t.gkind.Ends() {
		g.ending = t
	}
	t.group = g
}

// memberFailed continues a group whose member was not created.
func (gt *groupTable) memberFailed(g *group) {
	g.busy = false
	gt.nextMember(g)
}

// nextMember creates the next queued member, if the group is free for it.
func (gt *groupTable) nextMember(g *group) {
	for len(g.queue) > 0 && gt.open[g.id] == g && !g.busy && len(g.live) == 0 && g.held() {
		q := g.queue[0]
		g.queue = g.queue[1:]
		q.h.busy, q.h.to = false, nil
		gt.submit(q.h, q.e)
	}
}

// groupRunnable reports whether t's callback may run as far as its group
// is concerned: its predecessor finished (R13.2).
func (t *task) groupRunnable() bool {
	g := t.group
	return g == nil || t.gkind == message.GroupBegin || t.ignore != nil || int(t.gseq) == g.doneSeq+1
}

// holdsKeys reports whether t's TOMBSTONE keeps its keys: a group's
// Begin. The group opens with its Begin whatever the Begin's callback
// reported (a failure is the application's to answer with a Rollback):
// a secondary, which runs its own callbacks, must open and end the same
// groups as its primary, from the broadcasts alone.
func (t *task) holdsKeys() bool {
	return t.group != nil && t.gkind == message.GroupBegin
}

// endOp returns the op that releases the group t ends, in t's TOMBSTONE
// transaction: the Begin's record rewritten as released.
func (gt *groupTable) endOp(t *task) (key string, val []byte, ok bool) {
	g := t.group
	if g == nil || !t.gkind.Ends() || len(g.done) == 0 || g.done[0].id != g.id {
		return "", nil, false
	}
	return TaskKey(gt.prefix, g.id), releasedRecord(rawBytes(g.done[0].raw()), t.completed, t.id), true
}

// finishMember is finish's part for a group member whose TOMBSTONE is
// durable: it reports whether the tombstone stays with the group (true) or
// joins GC now (false). A holding Begin keeps its keys but the shared
// Cluster key.
func (gt *groupTable) finishMember(t *task, tb tomb) bool {
	g := t.group
	switch {
	case t.gkind == message.GroupBegin:
		if gt.mutation.Is(mutate.GroupKeysReleasedAtBegin) && t.lock != nil {
			gt.handles.grantedAll(gt.locks.Release(t.lock))
			t.lock = nil
		}
		if t.lock != nil {
			gt.handles.grantedAll(gt.locks.Shrink(t.lock, businessKeys(t.lock.Keys())))
			g.lock, t.lock = t.lock, nil
			g.lock.Ref, g.lock.Owner = g, g.label()
		}
		g.keep(tb, 0)
		g.doneSeq = 0
		gt.tombs.hold(tb)
		gt.progress(g)
		return true
	case t.gkind.Ends():
		gt.endGroup(g, t, tb)
		return true
	default:
		delete(g.live, t.gseq)
		g.keep(tb, t.gseq)
		if int(t.gseq) == g.doneSeq+1 {
			g.doneSeq = int(t.gseq)
		}
		gt.tombs.hold(tb)
		g.busy = false
		gt.progress(g)
		return true
	}
}

// keep keeps a finished member's tombstone with the group.
func (g *group) keep(tb tomb, seq uint32) {
	g.done = append(g.done, tb)
	g.seqs = append(g.seqs, seq)
}

// progress continues a group after a member finished: the next live
// member may run (a secondary's), the next queued one may be created.
func (gt *groupTable) progress(g *group) {
	if x := g.live[uint32(g.doneSeq+1)]; x != nil {
		gt.schedule(x)
	}
	gt.nextMember(g)
}

// endGroup releases a group whose end's TOMBSTONE is durable (R13.3):
// the keys go back, the group's tombstones join GC together.
func (gt *groupTable) endGroup(g *group, end *task, tb tomb) {
	delete(g.live, end.gseq)
	if g.lock != nil && !gt.mutation.Is(mutate.GroupKeysKeptAfterEnd) {
		gt.handles.grantedAll(gt.locks.Release(g.lock))
		g.lock = nil
	}
	if b := g.begin; b != nil && b.stage == Holding {
		gt.move(b, OnGroupEnded, Tombstoned)
	}
	run := append(g.done, tb)
	cls := g.class(end)
	for i := range run {
		gt.tombs.unhold(run[i].id)
		run[i].completed = end.completed.UnixNano()
		run[i].setClass(cls)
	}
	if _, val, ok := gt.endOp(end); ok {
		// The Begin's record as the end's transaction rewrote it.
		run[0].setRaw(gt.tombs.keep(val))
	}
	run[0].run = uint16(len(run))
	for _, x := range run {
		gt.tombs.push(x)
	}
	g.done, g.seqs = nil, nil
	gt.closeGroup(g, nil, end)
}

// class is the retention class of a group's tombstones: its Begin's.
func (g *group) class(end *task) int {
	if g.begin != nil {
		return g.begin.class
	}
	return end.class
}

// dissolve forgets a group that never held its keys; queued members get
// err.
func (gt *groupTable) dissolve(g *group, err error) {
	gt.closeGroup(g, err, nil)
}

// closeGroup forgets g and answers its queued members: an end of the same
// kind as the group's end gets its result, everything else err (or an
// explanation).
func (gt *groupTable) closeGroup(g *group, err error, end *task) {
	delete(gt.open, g.id)
	if g.key != "" && gt.owners[g.key] == g.id {
		delete(gt.owners, g.key)
	}
	if g.key != "" && end != nil && g.id > gt.endedOwners[g.key] {
		gt.endedOwners[g.key] = g.id
	}
	for _, q := range g.queue {
		q.h.busy, q.h.to = false, nil
		gt.handles.drop(q.h)
		switch {
		case end != nil && q.e.Msg.Group.Kind == end.gkind:
			gt.joinEnd(end, q.e.To)
		case end != nil:
			gt.out.reply(q.e.To, Reply{Err: fmt.Errorf("%w: %s %d ended with %s broadcast %d", ErrFailedPrecondition, groupWord(g), g.id, end.gkind, end.id)})
		default:
			gt.out.reply(q.e.To, Reply{Err: err})
		}
	}
	g.queue = nil
}

// gaps returns, per group, the first missing member (a secondary that
// did not receive every member): a force promote refuses to start then
// (R13.5).
func (gt *groupTable) gaps() []string {
	var out []string
	for _, id := range sortedKeys(gt.open) {
		g := gt.open[id]
		if miss, ok := g.missing(); ok {
			out = append(out, fmt.Sprintf("%s %d lacks member %d", groupWord(g), g.id, miss))
		}
	}
	return out
}

// missing returns the first seq below the group's highest that neither
// finished nor is live.
func (g *group) missing() (uint32, bool) {
	have := map[uint32]bool{}
	for _, s := range g.seqs {
		have[s] = true
	}
	if g.begin != nil {
		have[0] = true
	}
	top := uint32(0)
	for s := range g.live {
		have[s] = true
		top = max(top, s)
	}
	for s := range have {
		top = max(top, s)
	}
	for s := uint32(0); s <= top; s++ {
		if !have[s] {
			return s, true
		}
	}
	return 0, false
}

// ignoreUnordered marks, once a force promote fenced replication, the
// members that can never run in order because an earlier one never came:
// they complete Ignored, without their callbacks (R13.5).
func (gt *groupTable) ignoreUnordered(log *slog.Logger) {
	for _, id := range sortedKeys(gt.open) {
		g := gt.open[id]
		miss, ok := g.missing()
		if !ok {
			continue
		}
		for s, x := range g.live {
			if s > miss && x.ignore == nil {
				x.ignore = &Outcome{Status: Ignored, Detail: fmt.Sprintf("member %d of %s %d never reached this cluster", miss, groupWord(g), g.id)}
				log.Error("force promote: group member ignored, an earlier member is missing", "group", g.id, "member", x.id,
					"seq", s, "missing_seq", miss)
			}
		}
	}
}

// handOver gives the promoted cluster the keys of its open groups, before
// the force promote releases the exclusive Cluster key (R13.5).
func (gt *groupTable) handOver() {
	for _, id := range sortedKeys(gt.open) {
		g := gt.open[id]
		if g.lock != nil || !g.held() {
			continue
		}
		r, err := gt.locks.NewRequest(g.keys[:businessKeys(g.keys)])
		if err != nil {
			gt.log.Error("force promote: group keys do not validate", "group", g.id, "err", err)
			continue
		}
		r.Ref, r.Owner = g, g.label()
		if err := gt.locks.TryAcquire(r); err != nil {
			gt.log.Error("force promote: an open group's keys are held; it waits for them", "group", g.id, "err", err)
			gt.locks.Acquire(r)
		}
		g.lock = r
	}
}

func sortedKeys[V any](m map[uint64]V) []uint64 {
	ks := make([]uint64, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
