package engine

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

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

func (c *Core) handle(id HandleID) *handle {
	h := c.handles[id]
	if h == nil {
		h = &handle{id: id}
		c.handles[id] = h
	}
	return h
}

// resolve answers a keyed request before any lock: its original, or an
// admission for it as the scope's first (R7.3-R7.5).
func (c *Core) resolve(e Resolve) {
	if o := c.original(e.Scope); o != nil {
		if e.Digest != nil {
			if have := o.requestDigest(); have != nil && !bytes.Equal(have, e.Digest) {
				c.out.reply(e.To, Reply{Err: c.reused(e.Key)})
				return
			}
		}
		c.out.reply(e.To, Reply{Original: o})
		return
	}
	if c.idem.queue(e.Scope, e) {
		return
	}
	// A new key: the length limit applies to new keys only, so lowering it
	// never breaks a retry of a key already accepted (R7.1).
	if e.CheckNew {
		if err := e.Key.CheckLength(c.cfg.MaxKeyLength); err != nil {
			c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: %w", ErrInvalidArgument, err)})
			return
		}
	}
	h := c.handle(e.Handle)
	h.adm, h.scope = c.idem.admit(e.Scope, e.Handle), e.Scope
	c.out.reply(e.To, Reply{Admitted: true})
}

func (c *Core) reused(k message.IdempotencyKey) error {
	c.log.Warn("idempotency key reused with a different payload", "key_fp", k.Fingerprint())
	return fmt.Errorf("%w (key fingerprint %s)", ErrKeyReusedWithDifferentPayload, k.Fingerprint())
}

// releaseAdmission frees h's scope reservation and resolves its waiters
// again.
func (c *Core) releaseAdmission(h *handle) {
	a := h.adm
	h.adm = nil
	for _, r := range c.idem.release(h.scope, a) {
		c.resolve(r)
	}
}

// lock asks for a handle's issuance locks.
func (c *Core) lock(e Lock) {
	h := c.handle(e.Handle)
	if err := c.checkRole(e.Need); err != nil {
		c.dropHandle(h)
		c.out.reply(e.To, Reply{Err: err})
		return
	}
	var r *resource.Request
	var err error
	if !h.reqUsed && h.lock == nil {
		// The handle's one lock request, in the handle's allocation.
		h.reqUsed = true
		r, err = &h.req, c.locks.InitRequest(&h.req, e.Keys)
	} else {
		r, err = c.locks.NewRequest(e.Keys)
	}
	if err != nil {
		c.dropHandle(h)
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: %w", ErrInvalidArgument, err)})
		return
	}
	r.Ref = h // labelled by LockOwner
	h.lock, h.need, h.to = r, e.Need, e.To
	h.lockAsked = c.now.UnixNano()
	if e.Try {
		if err := c.locks.TryAcquire(r); err != nil {
			h.lock = nil
			c.dropHandle(h)
			c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: %w", ErrBusy, err)})
			return
		}
		c.granted(h)
		return
	}
	if c.locks.Acquire(r) {
		c.granted(h)
	}
}

// checkRole refuses what the cluster's role does not allow (R8.1, R8.3).
func (c *Core) checkRole(need Role) error {
	switch {
	case need == Primary && c.roles.role != Primary:
		return ErrNotPrimary
	case need == Secondary && c.roles.role != Secondary:
		return ErrNotSecondary
	}
	return nil
}

// granted continues a handle whose locks are all held: the role is checked
// again (a request queued behind a demotion sees the role it left, R8.1).
func (c *Core) granted(h *handle) {
	to := h.to
	h.to = nil
	if err := c.checkRole(h.need); err != nil {
		c.dropHandle(h)
		c.out.reply(to, Reply{Err: err})
		return
	}
	h.granted = true
	h.lockGranted = c.now.UnixNano()
	c.out.reply(to, Reply{Granted: true})
}

// grantedAll continues every request a lock release granted.
func (c *Core) grantedAll(rs []*resource.Request) {
	for _, r := range rs {
		switch x := r.Ref.(type) {
		case *handle:
			c.granted(x)
		}
	}
}

// closeHandle ends a handle that did not broadcast (R3.6).
func (c *Core) closeHandle(id HandleID) {
	if h := c.handles[id]; h != nil && !h.busy {
		c.dropHandle(h)
	}
	// A Resolve still waiting for another request's admission is
	// withdrawn too.
	if c.cfg.Mutation.Is(mutate.WaiterNotWithdrawn) {
		return
	}
	c.idem.forget(id)
}

// dropHandle releases everything a handle holds.
func (c *Core) dropHandle(h *handle) {
	delete(c.handles, h.id)
	if h.lock != nil {
		c.grantedAll(c.locks.Release(h.lock))
		h.lock = nil
	}
	c.releaseAdmission(h)
}

// submit creates a task from a granted handle (R4.2, R7.3): once an id is
// allocated (a block may have to be reserved first), the task and its scope
// are registered together and the PENDING record written.
func (c *Core) submit(e Submit) {
	h := c.handles[e.Handle]
	if h == nil || !h.granted || h.busy {
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: handle %d holds no granted locks", ErrFailedPrecondition, e.Handle)})
		return
	}
	if e.Msg.Broadcast.ID != 0 {
		c.dropHandle(h)
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: message already stamped with broadcast %d", ErrInvalidArgument, e.Msg.Broadcast.ID)})
		return
	}
	if err := c.checkRole(h.need); err != nil {
		c.dropHandle(h)
		c.out.reply(e.To, Reply{Err: err})
		return
	}
	if sc := ScopeOf(e.Msg.Type, e.Msg.IdempotencyKey); sc != (Scope{}) {
		if o := c.original(sc); o != nil {
			// Another request owns the scope: this one is a duplicate. The
			// keys go back first, since the original may need them.
			c.dropHandle(h)
			c.out.reply(e.To, Reply{Original: o})
			return
		}
		if h.adm == nil {
			// Not checked by Resolve: a keyed message on a plain handle.
			if err := e.Msg.IdempotencyKey.CheckLength(c.cfg.MaxKeyLength); err != nil {
				c.dropHandle(h)
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
		c.dropHandle(h)
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: a group member needs its group's id", ErrInvalidArgument)})
		return
	}
	if err := c.groups.checkBegin(e.Msg); err != nil {
		c.dropHandle(h)
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
		c.dropHandle(h)
		c.out.reply(e.To, Reply{Err: err})
		if g := c.groups.open[e.Group]; g != nil && e.Group != 0 {
			c.memberFailed(g)
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
		c.dropHandle(h)
		c.out.reply(e.To, r)
		if g != nil {
			c.memberFailed(g)
		}
	}
	if e.Group != 0 && g == nil {
		refuse(Reply{Err: c.endedError(e.Group)})
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
		c.createMember(g, t, &e)
	case t.gkind == message.GroupBegin:
		e.Msg.Group.ID = t.id
		t.bytes = appendGroupHeader(t.bytes, t.id, 0)
		c.groups.openGroup(t)
	}
	t.lock = h.lock
	t.lock.Ref = t // labelled by LockOwner
	t.lockAsked, t.lockGranted = h.lockAsked, h.lockGranted
	h.lock = nil
	delete(c.handles, h.id)
	c.tasks[t.id] = t
	c.idem.register(t.scope, t.id, t.replicated)
	// The requests waiting for the scope's slot resolve again now that
	// the task is indexed: they get it as their original (R7.3), never the
	// slot of a scope that has one.
	c.releaseAdmission(h)
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
		c.queueCopies(t, func(int) bool { return true })
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
		c.grantedAll(c.locks.Release(t.lock))
		t.lock = nil
	}
	if g := t.group; g != nil {
		if t.gkind == message.GroupBegin {
			c.dissolve(g, fmt.Errorf("%w: %s %d: its Begin was not created: %w", ErrTaskNotCreated, groupWord(g), g.id, err))
		} else {
			// Never created: its seq goes to the next member.
			delete(g.live, t.gseq)
			if g.ending == t {
				g.ending = nil
			}
			g.next = t.gseq
			c.memberFailed(g)
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
