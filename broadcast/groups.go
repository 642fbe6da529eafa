package broadcast

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// Groups (R13.1-R13.9) hold one set of resource keys across several
// broadcasts. A transaction is a Begin, bodies, and a Commit or Rollback
// that may span API calls and coordinator restarts (a two-phase import, a
// multi-step DDL); a resource-key owner is a broadcast of a type that
// acquires a long-lived ownership of its keys (an Import) and the
// broadcast of a type that ends it (its CommitImport or RollbackImport).
// See broadcast/internal/engine/groups.go for the rules.

// ErrTxnFull reports a transaction member beyond Config.Txn.MaxMembers: the
// last member is kept for the transaction's Commit or Rollback.
var ErrTxnFull = engine.ErrGroupFull

// TxnRequest opens a transaction.
type TxnRequest struct {
	// Keys are held from the Begin until the transaction's end (the
	// Cluster key is added as for any broadcast, R3.4).
	Keys []resource.Key
	// Idempotent, if set with a key, is the transaction's admission
	// identity: a retried Begin with it returns the same transaction,
	// without waiting for its keys (R13.2).
	Idempotent *Idempotent
	// NoWait fails at once with ErrBusy instead of queueing for the keys.
	NoWait bool
}

// Txn is one open (or resumed) transaction.
type Txn struct {
	b *Broadcaster
	// ID names the transaction: its Begin's broadcast id.
	ID uint64
	// Begin is the Begin's result; Duplicate says the Begin was a retry
	// answered by the transaction it had opened.
	Begin     *Result
	Duplicate bool
	// Ended says ResumeTxn found the transaction ended: only a retry of
	// its end is answered.
	Ended bool
}

// BeginTxn opens a transaction with begin as its first member: begin's
// targets become every member's targets; its type's callback runs first.
// The transaction holds req.Keys from then on, until its Commit or
// Rollback, whatever the Begin's callback reported (Txn.Begin.Outcome): a
// Begin whose callback reported a failure is the caller's to roll back.
func (b *Broadcaster) BeginTxn(ctx context.Context, req TxnRequest, begin *message.Message) (*Txn, error) {
	if begin == nil {
		return nil, fmt.Errorf("%w: nil message", ErrInvalidArgument)
	}
	if n := len(begin.Broadcast.VChannels) + 1; n > b.cfg.Txn.MaxVChannels {
		return nil, fmt.Errorf("%w: a transaction targets at most %d vchannels (the control channel included), not %d",
			ErrInvalidArgument, b.cfg.Txn.MaxVChannels, n)
	}
	if len(begin.Payload) > b.cfg.Txn.MaxMemberBytes {
		return nil, fmt.Errorf("%w: a transaction member carries at most %d bytes, not %d", ErrInvalidArgument, b.cfg.Txn.MaxMemberBytes,
			len(begin.Payload))
	}
	h, err := b.Acquire(ctx, AcquireRequest{Keys: req.Keys, Idempotent: req.Idempotent, NoWait: req.NoWait})
	if err != nil {
		return nil, err
	}
	defer h.Close()
	dup := h.Duplicate()
	h.txnBegin = true
	res, err := h.Broadcast(ctx, begin)
	if err != nil {
		return nil, err
	}
	return &Txn{b: b, ID: res.BroadcastID, Begin: res, Duplicate: dup}, nil
}

// ResumeTxn returns transaction id, open or ended, after any restart
// (R13.2). Of an ended one (while its tombstones are remembered; Ended is
// set), a Commit or Rollback of the kind it ended with gets that end's
// result and anything else fails with ErrFailedPrecondition. Any other
// broadcast is refused with ErrFailedPrecondition, an unknown id with
// ErrNotFound.
func (b *Broadcaster) ResumeTxn(id uint64) (*Txn, error) {
	g, err := b.openGroup(id)
	if errors.Is(err, ErrFailedPrecondition) {
		var owner string
		var ended bool
		b.d.inspect(func(c engine.View) { owner, ended = c.EndedGroup(id) })
		if ended && owner == "" {
			return &Txn{b: b, ID: id, Ended: true}, nil
		}
	}
	if err != nil {
		return nil, err
	}
	if g.OwnerKey != "" {
		return nil, fmt.Errorf("%w: group %d is the ownership %s, not a transaction", ErrFailedPrecondition, id, g.OwnerKey)
	}
	return &Txn{b: b, ID: id}, nil
}

// Body broadcasts a member of the transaction: msg's type and payload (and
// idempotency key, if any), to the transaction's targets (msg's targets,
// if given, must be those), stamped with its keys without locking them.
// Members are created one at a time and their callbacks take effect in
// order (R13.2).
func (x *Txn) Body(ctx context.Context, msg *message.Message) (*Result, error) {
	return x.b.member(ctx, x.ID, message.GroupBody, msg)
}

// Commit ends the transaction with msg: once its TOMBSTONE is durable the
// keys are released (R13.3). The first end wins: a concurrent Commit joins
// it, a Rollback after it fails with ErrFailedPrecondition; a Commit of a
// transaction that ended with a Commit gets that Commit's result.
func (x *Txn) Commit(ctx context.Context, msg *message.Message) (*Result, error) {
	return x.b.member(ctx, x.ID, message.GroupCommit, msg)
}

// Rollback ends the transaction with msg, as Commit does.
func (x *Txn) Rollback(ctx context.Context, msg *message.Message) (*Result, error) {
	return x.b.member(ctx, x.ID, message.GroupRollback, msg)
}

// EndOwnership broadcasts msg, of a type whose OwnerRole ends an ownership
// (a CommitImport), stamped with the keys of the broadcast that owns the
// key msg's payload names, without locking them (an exclusive DDL may
// already wait for them); once its TOMBSTONE is durable the owner's keys
// are released (R13.8). It waits for the owner's callback first. Once the
// ownership ended, an end of the same kind is answered by the first end's
// result (Result.Duplicated set) and one of the other kind fails with
// ErrFailedPrecondition, while the ended owner's tombstones are remembered.
// With no owner of the key, ever, it fails with ErrNotFound.
func (b *Broadcaster) EndOwnership(ctx context.Context, msg *message.Message) (*Result, error) {
	if msg == nil {
		return nil, fmt.Errorf("%w: nil message", ErrInvalidArgument)
	}
	info, ok := b.cfg.Types.Lookup(msg.Type)
	if !ok || info.Owner == nil || info.Owner.Ends == 0 {
		return nil, fmt.Errorf("%w: type %s does not end an ownership", ErrInvalidArgument, msg.Type)
	}
	key, err := info.Owner.Key(msg.Payload)
	if err != nil {
		return nil, fmt.Errorf("%w: owner key of %s: %w", ErrInvalidArgument, msg.Type, err)
	}
	var id uint64
	if !b.d.inspect(func(c engine.View) {
		if id = c.OwnerGroup(key); id == 0 {
			// Ended: a retried end of the same kind gets the end's
			// result, the other kind is refused (R13.3).
			id = c.EndedOwner(key)
		}
	}) {
		return nil, fmt.Errorf("%w: %w", ErrTaskNotCreated, b.closedErr())
	}
	if id == 0 {
		return nil, fmt.Errorf("%w: no broadcast owns %s", ErrNotFound, key)
	}
	return b.member(ctx, id, info.Owner.Ends, msg)
}

// WaitVChannelsAcked returns once every copy of broadcast id on vs is acked
// (R13.11): between a two-phase append's phases, or on any partial set. It
// returns at once for a finished broadcast, ErrVChannelNotInTask for a
// vchannel it does not target, ErrNotFound for an unknown one, ctx's
// error when ctx ends, and ErrClosed once the broadcaster is closed.
func (b *Broadcaster) WaitVChannelsAcked(ctx context.Context, id uint64, vs ...message.VChannel) error {
	if err := b.closedErr(); err != nil {
		return err
	}
	r, err := b.d.call(ctx, func(to engine.Target) engine.Event {
		return engine.WaitAcked{To: to, ID: id, VChannels: slices.Clone(vs)}
	})
	if err != nil {
		return err
	}
	return r.Err
}

// GroupInfo describes an open group: a transaction or a resource-key
// owner (R13.6).
type GroupInfo = engine.GroupView

// Groups lists the open groups, in id order.
func (b *Broadcaster) Groups() ([]GroupInfo, error) {
	var out []GroupInfo
	if !b.d.inspect(func(c engine.View) { out = c.Groups() }) {
		return nil, b.closedErr()
	}
	return out, nil
}

// Group returns open group id (a transaction or an owner); one that ended
// is refused with ErrFailedPrecondition, an unknown one with ErrNotFound.
func (b *Broadcaster) Group(id uint64) (GroupInfo, error) { return b.openGroup(id) }

func (b *Broadcaster) openGroup(id uint64) (GroupInfo, error) {
	var g GroupInfo
	var ok bool
	var gerr error
	if !b.d.inspect(func(c engine.View) {
		if g, ok = c.Group(id); !ok {
			gerr = c.GroupError(id)
		}
	}) {
		return g, b.closedErr()
	}
	return g, gerr
}

// member broadcasts msg into group id as kind: it holds the shared Cluster
// key of its own and carries the group's keys (R13.1, R13.8).
func (b *Broadcaster) member(ctx context.Context, id uint64, kind message.GroupKind, msg *message.Message) (*Result, error) {
	if msg == nil {
		return nil, fmt.Errorf("%w: nil message", ErrInvalidArgument)
	}
	g, err := b.openGroup(id)
	if err != nil {
		if errors.Is(err, ErrFailedPrecondition) && !kind.Ends() {
			return b.retriedBody(ctx, id, msg, err)
		}
		if !errors.Is(err, ErrFailedPrecondition) {
			return nil, err
		}
		// An ended group: a retried end of the same kind gets the end's
		// result from the core.
		g = GroupInfo{ID: id}
	}
	if g.OwnerKey == "" && len(msg.Payload) > b.cfg.Txn.MaxMemberBytes {
		return nil, fmt.Errorf("%w: a transaction member carries at most %d bytes, not %d", ErrInvalidArgument, b.cfg.Txn.MaxMemberBytes,
			len(msg.Payload))
	}
	var idem *Idempotent
	if msg.IdempotencyKey != "" {
		idem = &Idempotent{Type: msg.Type, Key: msg.IdempotencyKey}
	}
	h, err := b.Acquire(ctx, AcquireRequest{Idempotent: idem})
	if err != nil {
		return nil, err
	}
	defer h.Close()
	h.member = &memberOf{id: id, kind: kind, key: g.OwnerKey, keys: g.Keys, targets: g.Targets, ended: g.Keys == nil}
	res, err := h.Broadcast(ctx, msg)
	if err != nil {
		return nil, err
	}
	if d := res.Duplicated; d != nil && (d.Group == nil || d.Group.ID != id || d.Group.Kind != kind) {
		// The key answered for a broadcast that is not this member.
		return nil, fmt.Errorf("%w: the idempotency key belongs to broadcast %d, not to a %s of group %d",
			ErrKeyReusedWithDifferentPayload, res.BroadcastID, kind, id)
	}
	return res, nil
}

// retriedBody answers a body of transaction id, which has ended (gerr
// says so): a retry with the idempotency key of one of its bodies gets that
// body's result; anything else gets gerr.
func (b *Broadcaster) retriedBody(ctx context.Context, id uint64, msg *message.Message, gerr error) (*Result, error) {
	if msg.IdempotencyKey == "" {
		return nil, gerr
	}
	h, err := b.Acquire(ctx, AcquireRequest{Idempotent: &Idempotent{Type: msg.Type, Key: msg.IdempotencyKey}})
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if !h.Duplicate() {
		return nil, gerr
	}
	res, err := h.Broadcast(ctx, msg)
	if err != nil {
		return nil, err
	}
	if g := res.Duplicated.Group; g == nil || g.ID != id || g.Kind != message.GroupBody {
		return nil, fmt.Errorf("%w: the idempotency key belongs to broadcast %d, not to a body of transaction %d",
			ErrKeyReusedWithDifferentPayload, res.BroadcastID, id)
	}
	return res, nil
}

// memberOf is what a group member's handle stamps.
type memberOf struct {
	id      uint64
	kind    message.GroupKind
	key     string
	keys    []resource.Key
	targets []message.VChannel
	// ended says the group was not open when the member was prepared: the
	// core answers a retried end, or refuses.
	ended bool
}

// stampGroup sets msg's group header before it is stamped: a Begin's (a
// transaction's, or an owner type's), or a member's, whose keys and
// targets come from its group.
func (h *Handle) stampGroup(msg *message.Message, info message.TypeInfo) (*message.Message, []resource.Key, error) {
	keys := h.keys
	owner := info.Owner
	switch m := h.member; {
	case m != nil:
		if owner != nil && owner.Ends == 0 {
			return nil, nil, fmt.Errorf("%w: %s acquires an ownership: it cannot be a group's member", ErrInvalidArgument, msg.Type)
		}
		if m.key != "" && (owner == nil || owner.Ends != m.kind) {
			return nil, nil, fmt.Errorf("%w: %s does not end ownerships", ErrInvalidArgument, msg.Type)
		}
		c := msg.Clone()
		if m.ended {
			// Anything will do for the core to answer with the end's result
			// or refuse: the shared Cluster key and the control channel.
			if len(c.Broadcast.VChannels) == 0 {
				c.Broadcast.VChannels = []message.VChannel{h.b.cfg.ControlChannel}
			}
			keys = h.keys
		} else {
			keys = m.keys
			if m.key == "" {
				if len(c.Broadcast.VChannels) > 0 && !sameTargets(c.Broadcast.VChannels, m.targets, h.b.cfg.ControlChannel) {
					return nil, nil, fmt.Errorf("%w: a transaction's members keep its targets %v", ErrInvalidArgument, m.targets)
				}
				c.Broadcast.VChannels = slices.Clone(m.targets)
			} else if len(c.Broadcast.VChannels) == 0 {
				c.Broadcast.VChannels = slices.Clone(m.targets)
			}
		}
		c.Group = &message.GroupHeader{ID: m.id, Kind: m.kind, OwnerKey: m.key}
		return c, keys, nil
	case h.txnBegin:
		if owner != nil {
			return nil, nil, fmt.Errorf("%w: %s is an owner type: it cannot begin a transaction", ErrInvalidArgument, msg.Type)
		}
		c := msg.Clone()
		c.Group = &message.GroupHeader{Kind: message.GroupBegin}
		return c, keys, nil
	case owner != nil && owner.Ends != 0:
		return nil, nil, fmt.Errorf("%w: %s ends an ownership: broadcast it with EndOwnership", ErrInvalidArgument, msg.Type)
	case owner != nil:
		key, err := owner.Key(msg.Payload)
		if err != nil || key == "" {
			return nil, nil, fmt.Errorf("%w: owner key of %s: %v", ErrInvalidArgument, msg.Type, err)
		}
		c := msg.Clone()
		c.Group = &message.GroupHeader{Kind: message.GroupBegin, OwnerKey: key}
		return c, keys, nil
	}
	if msg.Group != nil {
		return nil, nil, fmt.Errorf("%w: the group header is the broadcaster's to set", ErrInvalidArgument)
	}
	return msg, keys, nil
}

// sameTargets reports whether got names the targets of want, which has the
// control channel too.
func sameTargets(got, want []message.VChannel, control message.VChannel) bool {
	if !slices.Contains(got, control) {
		got = append(slices.Clone(got), control)
	}
	return slices.Equal(got, want)
}
