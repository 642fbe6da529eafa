package engine

import (
	"bytes"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/walcast/walcast/broadcast/internal/mutate"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// handle is one right to broadcast while holding resource keys (R3.6):
// from Resolve/Lock to Submit or Close.
type handle struct {
	id HandleID
	// to is where the pending Lock's reply goes (nil once answered).
	to Target
	// adm is the admission slot the handle holds for its scope, nil if none.
	adm   *admission
	scope Scope
	// lock is the issuance lock request; granted once it holds every key.
	lock    *resource.Request
	need    Role
	granted bool
	// lockAsked and lockGranted bound the wait for the lock (unix
	// nanoseconds), for the task's timeline.
	lockAsked, lockGranted int64
	// busy is set while the handle's Follow write is in flight, or its
	// Submit waits for an id: Close then does nothing.
	busy bool
	// withdrawn says the caller of the busy handle's Submit gave up
	// (Withdraw): the Submit goes on unanswered.
	withdrawn bool
	// req is the room for the handle's first lock request (reqUsed once
	// taken): a handle usually asks for its locks once.
	req     resource.Request
	reqUsed bool
}

// LockOwner labels the handle's lock request ("handle 7"), when the lock
// table describes it.
func (h *handle) LockOwner() string { return "handle " + strconv.FormatUint(uint64(h.id), 10) }

// admission reserves a scope while its first request takes its locks, so a
// concurrent request with the same key waits for it instead of taking
// locks of its own (R7.3, R7.5).
type admission struct {
	owner   HandleID
	waiters []Resolve
}

// handleTable owns the handles (R3.6) and their bookkeeping: a keyed
// request resolved before any lock — its original, or the scope's
// admission slot, or a wait behind the request that holds it (R7.3-R7.5)
// —, the issuance locks a handle asks for, granted once the cluster's role
// allows them (R8.1), and what a handle gives back when it is dropped (its
// lock request, its slot: the requests they held up go on). It answers
// into the core's outbox.
type handleTable struct {
	byID map[HandleID]*handle

	// What the table uses of its core: the lock table and the idempotency
	// index it books into, the role, the actions out, the time, a scope's
	// original, the logger, the key length limit (Config.MaxKeyLength) and
	// the planted bug.
	locks        *resource.Table
	idem         *idemIndex
	roles        *roles
	out          *outbox
	now          func() time.Time
	original     func(Scope) *Original
	log          *slog.Logger
	maxKeyLength int
	mutation     mutate.Bug
}

func (ht *handleTable) get(id HandleID) *handle {
	h := ht.byID[id]
	if h == nil {
		h = &handle{id: id}
		ht.byID[id] = h
	}
	return h
}

// resolve answers a keyed request before any lock: its original, or an
// admission for it as the scope's first (R7.3-R7.5).
func (ht *handleTable) resolve(e Resolve) {
	if o := ht.original(e.Scope); o != nil {
		if e.Digest != nil {
			if have := o.requestDigest(); have != nil && !bytes.Equal(have, e.Digest) {
				ht.out.reply(e.To, Reply{Err: ht.reused(e.Key)})
				return
			}
		}
		ht.out.reply(e.To, Reply{Original: o})
		return
	}
	if ht.idem.queue(e.Scope, e) {
		return
	}
	// A new key: the length limit applies to new keys only, so lowering it
	// never breaks a retry of a key already accepted (R7.1).
	if e.CheckNew {
		if err := e.Key.CheckLength(ht.maxKeyLength); err != nil {
			ht.out.reply(e.To, Reply{Err: fmt.Errorf("%w: %w", ErrInvalidArgument, err)})
			return
		}
	}
	h := ht.get(e.Handle)
	h.adm, h.scope = ht.idem.admit(e.Scope, e.Handle), e.Scope
	ht.out.reply(e.To, Reply{Admitted: true})
}

func (ht *handleTable) reused(k message.IdempotencyKey) error {
	ht.log.Warn("idempotency key reused with a different payload", "key_fp", k.Fingerprint())
	return fmt.Errorf("%w (key fingerprint %s)", ErrKeyReusedWithDifferentPayload, k.Fingerprint())
}

// releaseAdmission frees h's scope reservation and resolves its waiters
// again.
func (ht *handleTable) releaseAdmission(h *handle) {
	a := h.adm
	h.adm = nil
	for _, r := range ht.idem.release(h.scope, a) {
		ht.resolve(r)
	}
}

// lock asks for a handle's issuance locks.
func (ht *handleTable) lock(e Lock) {
	h := ht.get(e.Handle)
	if err := ht.roles.check(e.Need); err != nil {
		ht.drop(h)
		ht.out.reply(e.To, Reply{Err: err})
		return
	}
	var r *resource.Request
	var err error
	if !h.reqUsed && h.lock == nil {
		// The handle's one lock request, in the handle's allocation.
		h.reqUsed = true
		r, err = &h.req, ht.locks.InitRequest(&h.req, e.Keys)
	} else {
		r, err = ht.locks.NewRequest(e.Keys)
	}
	if err != nil {
		ht.drop(h)
		ht.out.reply(e.To, Reply{Err: fmt.Errorf("%w: %w", ErrInvalidArgument, err)})
		return
	}
	r.Ref = h // labelled by LockOwner
	h.lock, h.need, h.to = r, e.Need, e.To
	h.lockAsked = ht.now().UnixNano()
	if e.Try {
		if err := ht.locks.TryAcquire(r); err != nil {
			h.lock = nil
			ht.drop(h)
			ht.out.reply(e.To, Reply{Err: fmt.Errorf("%w: %w", ErrBusy, err)})
			return
		}
		ht.granted(h)
		return
	}
	if ht.locks.Acquire(r) {
		ht.granted(h)
	}
}

// granted continues a handle whose locks are all held: the role is checked
// again (a request queued behind a demotion sees the role it left, R8.1).
func (ht *handleTable) granted(h *handle) {
	to := h.to
	h.to = nil
	if err := ht.roles.check(h.need); err != nil {
		ht.drop(h)
		ht.out.reply(to, Reply{Err: err})
		return
	}
	h.granted = true
	h.lockGranted = ht.now().UnixNano()
	ht.out.reply(to, Reply{Granted: true})
}

// grantedAll continues every request a lock release granted.
func (ht *handleTable) grantedAll(rs []*resource.Request) {
	for _, r := range rs {
		switch x := r.Ref.(type) {
		case *handle:
			ht.granted(x)
		}
	}
}

// close ends a handle that did not broadcast (R3.6).
func (ht *handleTable) close(id HandleID) {
	if h := ht.byID[id]; h != nil && !h.busy {
		ht.drop(h)
	}
	// A Resolve still waiting for another request's admission is
	// withdrawn too.
	if ht.mutation.Is(mutate.WaiterNotWithdrawn) {
		return
	}
	ht.idem.forget(id)
}

// drop releases everything a handle holds.
func (ht *handleTable) drop(h *handle) {
	delete(ht.byID, h.id)
	if h.lock != nil {
		ht.grantedAll(ht.locks.Release(h.lock))
		h.lock = nil
	}
	ht.releaseAdmission(h)
}

// submit creates a task from a granted handle (R4.2, R7.3): once an id is
// allocated (a block may have to be reserved first), the task and its scope
// are registered together and the PENDING record written.
func (c *Core) submit(e Submit) {
	h := c.handles.byID[e.Handle]
	if h == nil || !h.granted || h.busy {
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: handle %d holds no granted locks", ErrFailedPrecondition, e.Handle)})
		return
	}
	if e.Msg.Broadcast.ID != 0 {
		c.handles.drop(h)
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: message already stamped with broadcast %d", ErrInvalidArgument, e.Msg.Broadcast.ID)})
		return
	}
	if err := c.roles.check(h.need); err != nil {
		c.handles.drop(h)
		c.out.reply(e.To, Reply{Err: err})
		return
	}
	if sc := ScopeOf(e.Msg.Type, e.Msg.IdempotencyKey); sc != (Scope{}) {
		if o := c.original(sc); o != nil {
			// Another request owns the scope: this one is a duplicate. The
			// keys go back first, since the original may need them.
			c.handles.drop(h)
			c.out.reply(e.To, Reply{Original: o})
			return
		}
		if h.adm == nil {
			// Not checked by Resolve: a keyed message on a plain handle.
			if err := e.Msg.IdempotencyKey.CheckLength(c.cfg.MaxKeyLength); err != nil {
				c.handles.drop(h)
				c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: %w", ErrInvalidArgument, err)})
				return
			}
		}
	}
	if e.Group != 0 {
		c.submitMember(h, e)
		return
	}
	if e.Msg.Group != nil && e.Msg.Group.Kind != message.GroupBegin {
		c.handles.drop(h)
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: a group member needs its group's id", ErrInvalidArgument)})
		return
	}
	if err := c.groups.checkBegin(e.Msg); err != nil {
		c.handles.drop(h)
		c.out.reply(e.To, Reply{Err: err})
		return
	}
	h.busy = true
	h.to = e.To // answered by Stop if it comes first
	c.allocFor(h, e)
}

// allocFor allocates the id of a submitted task and creates it.
func (c *Core) allocFor(h *handle, e Submit) {
	if c.stopped {
		return // Stop answered it
	}
	if id, ok := c.ids.now(c); ok {
		// Without a closure: most ids come from the reserved block.
		c.allocated(h, &e, id, nil)
		return
	}
	waiting := e // only a waiting submit moves to the heap
	c.ids.alloc(c, func(id uint64, err error) { c.allocated(h, &waiting, id, err) })
}

// allocated creates the task of a submitted one given its id, or fails it.
func (c *Core) allocated(h *handle, e *Submit, id uint64, err error) {
	h.busy = false
	h.to = nil
	if h.withdrawn {
		e.To = nil
	}
	if c.stopped {
		return
	}
	if err != nil {
		c.handles.drop(h)
		c.out.reply(e.To, Reply{Err: err})
		if g := c.groups.open[e.Group]; g != nil && e.Group != 0 {
			c.groups.memberFailed(g)
		}
		return
	}
	e.Msg.Broadcast.ID = id
	e.Bytes = protowire.AppendVarint(protowire.AppendTag(e.Bytes, broadcastIDField, protowire.VarintType), id)
	c.create(h, *e)
}

// broadcastIDField is the field number of the broadcast id in the durable
// Message (proto/walcast/durable/v1/durable.proto).
const broadcastIDField protowire.Number = 8

// create registers a submitted task with its id and persists it.
func (c *Core) create(h *handle, e Submit) {
	promote := h.need == Secondary
	info, _ := c.cfg.Types.Lookup(e.Msg.Type)
	t := newTask(e.Msg, e.Bytes, info, c.now)
	t.request = e.Request
	t.class = c.cfg.ClassOf(e.Msg.Type)
	var g *group
	if e.Group != 0 {
		g = c.groups.open[e.Group]
	}
	refuse := func(r Reply) {
		c.handles.drop(h)
		c.out.reply(e.To, r)
		if g != nil {
			c.groups.memberFailed(g)
		}
	}
	if e.Group != 0 && g == nil {
		refuse(Reply{Err: c.groups.endedError(e.Group)})
		return
	}
	if t.promote != promote {
		refuse(Reply{Err: fmt.Errorf("%w: a force promote needs the promote handle", ErrInvalidArgument)})
		return
	}
	if t.promote {
		if gaps := c.groups.gaps(); len(gaps) > 0 {
			// A group missing a member cannot be finished in order (R13.5).
			refuse(Reply{Err: fmt.Errorf("%w: cannot promote while a group misses a member: %s", ErrFailedPrecondition, strings.Join(gaps, "; "))})
			return
		}
	}
	if err := c.groups.checkBegin(e.Msg); err != nil {
		refuse(Reply{Err: err})
		return
	}
	if h.need == 0 && c.roles.role != Primary && !t.local() {
		// Only local-only broadcasts are created on a secondary (R13.13).
		refuse(Reply{Err: ErrNotPrimary})
		return
	}
	if t.scope != (Scope{}) {
		if o := c.original(t.scope); o != nil {
			// A keyed broadcast on a plain handle got there first while
			// this one waited for its id.
			refuse(Reply{Original: o})
			return
		}
	}
	switch {
	case g != nil:
		g.createMember(t, &e)
	case t.gkind == message.GroupBegin:
		e.Msg.Group.ID = t.id
		t.bytes = appendGroupHeader(t.bytes, t.id, 0)
		c.groups.openGroup(t)
	}
	t.lock = h.lock
	t.lock.Ref = t // labelled by LockOwner
	t.lockAsked, t.lockGranted = h.lockAsked, h.lockGranted
	h.lock = nil
	delete(c.handles.byID, h.id)
	c.tasks[t.id] = t
	c.idem.register(t.scope, t.id, t.replicated)
	// The requests waiting for the scope's slot resolve again now that
	// the task is indexed: they get it as their original (R7.3), never the
	// slot of a scope that has one.
	c.handles.releaseAdmission(h)
	c.stats.Broadcasts++
	if e.To != nil {
		t.waiters = append(t.waiters, e.To)
	}
	c.obs.TaskState(t.msg.Type, 0, Pending)
	c.move(t, OnSubmit, Persisting)
}

// persistPending writes the PENDING record (R4.2): the task is created once
// it is durable; definitely not written, it never was.
func (c *Core) persistPending(t *task) {
	if c.cfg.Mutation.Is(mutate.AppendBeforePersist) {
		c.lanes.queueCopies(t, func(int) bool { return true })
	}
	w := c.writes.write(WritePending, t, t.record(Pending), nil, pendingWritten)
	w.failed = pendingFailed
}

func pendingWritten(c *Core, w *writeOp, d Decision, err error) {
	t := w.task
	switch d {
	case Done:
		t.persisted = c.now.UnixNano()
		c.move(t, OnPersisted, t.afterPersist())
	case Abort:
		c.abort(t, fmt.Errorf("%w: persist: %w", ErrTaskNotCreated, err))
	case StepDown:
		if !t.maybePersisted {
			c.abort(t, fmt.Errorf("%w: %w", ErrTaskNotCreated, err))
		}
	}
}

func pendingFailed(_ *Core, w *writeOp, err error) {
	if MayHaveApplied(Classify(err)) {
		w.task.maybePersisted = true
	}
}

// abort ends a task that was never created: it leaves the tables and gives
// its keys back (R4.7).
func (c *Core) abort(t *task, err error) {
	c.move(t, OnNotCreated, Aborted)
	delete(c.tasks, t.id)
	c.idem.del(t.scope, t.id)
	c.stats.Broadcasts--
	if t.lock != nil && !c.cfg.Mutation.Is(mutate.AbortKeepsKeys) {
		c.handles.grantedAll(c.locks.Release(t.lock))
		t.lock = nil
	}
	if g := t.group; g != nil {
		if t.gkind == message.GroupBegin {
			c.groups.dissolve(g, fmt.Errorf("%w: %s %d: its Begin was not created: %w", ErrTaskNotCreated, groupWord(g), g.id, err))
		} else {
			// Never created: its seq goes to the next member.
			delete(g.live, t.gseq)
			if g.ending == t {
				g.ending = nil
			}
			g.next = t.gseq
			c.groups.memberFailed(g)
		}
	}
	for _, to := range t.waiters {
		c.out.reply(to, Reply{Err: err})
	}
	t.waiters = nil
	// A wait for its acks, or for an operator's completion, ends too: it
	// was never created, so nothing of it will be acked (R11.5).
	for _, a := range t.ackWaits {
		c.out.reply(a.to, Reply{Err: err})
	}
	t.ackWaits = nil
	for _, to := range t.completeWaits {
		c.out.reply(to, Reply{Err: err})
	}
	t.completeWaits = nil
	c.obs.TaskState(t.msg.Type, Pending, 0)
}

// wait answers with live task id's result once it is done (a duplicate
// waiting for its original, R7.4).
func (c *Core) wait(e Wait) {
	if t := c.tasks[e.ID]; t != nil {
		t.waiters = append(t.waiters, e.To)
		return
	}
	if tb, ok := c.tombs.get(e.ID); ok {
		c.out.reply(e.To, Reply{Original: c.tombs.original(tb)})
		return
	}
	c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: broadcast %d is no longer remembered", ErrNotFound, e.ID)})
}

// withdraw takes back the request answered at to, whose caller gave up
// waiting (R11.5), and returns what it waited for (nil: no task, or no
// request); Step answers the Withdraw's Done with it. What the
// request left in the core goes with it, so that nothing outlives its
// caller:
//
//   - a Resolve waiting for another request's admission slot leaves the
//     slot's waiters: were it still there when the slot frees, it would be
//     resolved again and admitted as the scope's first, holding the slot
//     for a caller that is gone, and every later request with its key
//     would wait behind it forever (R7.3);
//   - a Lock waiting for its keys drops its handle: the queued lock
//     request and the admission slot the handle holds go back (R3.6);
//   - a Submit waiting for its id or, as a group member, for its turn is
//     not answered any more, but goes on: once submitted, the broadcast is
//     the task's, which completes in the background (R4.6);
//   - a request waiting for a task (its Submit's or its original's result,
//     acks, a callback completed by an operator) leaves the task's waiters.
//
// A request already answered, or one the core does not know, is not
// found: Done is answered all the same.
func (c *Core) withdraw(to Target) *Waited {
	if to == nil {
		return nil
	}
	if !c.cfg.Mutation.Is(mutate.WaiterNotWithdrawn) && c.idem.withdraw(func(r Resolve) bool { return r.To == to }) {
		return nil
	}
	for _, h := range c.handles.byID {
		if h.to != to {
			continue
		}
		if !h.busy {
			c.handles.drop(h) // waiting for its locks
			return nil
		}
		h.to, h.withdrawn = nil, true
		for _, g := range c.groups.open {
			for i := range g.queue {
				if g.queue[i].h == h {
					g.queue[i].e.To = nil
					return &Waited{Group: g.id}
				}
			}
		}
		return &Waited{Stage: StageNone}
	}
	for _, t := range c.tasks {
		if c.cfg.Mutation.Is(mutate.WithdrawnStillAnswered) && slices.Contains(t.waiters, to) {
			return &Waited{ID: t.id, Stage: t.stage}
		}
		if t.withdraw(to) {
			return &Waited{ID: t.id, Stage: t.stage}
		}
	}
	return nil
}

// withdraw removes to from t's waiters of every kind; false if it was in
// none.
func (t *task) withdraw(to Target) bool {
	if i := slices.Index(t.waiters, to); i >= 0 {
		t.waiters = slices.Delete(t.waiters, i, i+1)
		return true
	}
	if i := slices.Index(t.completeWaits, to); i >= 0 {
		t.completeWaits = slices.Delete(t.completeWaits, i, i+1)
		return true
	}
	if i := slices.IndexFunc(t.ackWaiters, func(a ackWaiter) bool { return a.to == to }); i >= 0 {
		t.ackWaiters = slices.Delete(t.ackWaiters, i, i+1)
		return true
	}
	if i := slices.IndexFunc(t.ackWaits, func(a ackWait) bool { return a.to == to }); i >= 0 {
		t.ackWaits = slices.Delete(t.ackWaits, i, i+1)
		return true
	}
	for j := range t.copies {
		ws := t.copies[j].ackOnceWaiters
		if i := slices.Index(ws, to); i >= 0 {
			t.copies[j].ackOnceWaiters = slices.Delete(ws, i, i+1)
			return true
		}
	}
	return false
}
