package broadcast

import (
	"context"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/tracing"
)

// Handle is a one-shot right to broadcast while holding resource keys. Get
// one from WithResourceKeys, TryWithResourceKeys or
// WithIdempotentResourceKeys; always Close it.
type Handle struct {
	b  *Broadcaster
	id engine.HandleID

	mu      sync.Mutex
	used    bool
	locked  bool // the core holds locks (or an admission) for the handle
	keys    []resource.Key
	idem    *Idempotent
	orig    *engine.Original
	promote bool // a force promote's handle (see ForcePromote)
	local   bool // an unreplicable handle (WithUnreplicableResourceKeys)
	// txnBegin marks a transaction's Begin; member a group member's handle
	// (groups.go).
	txnBegin bool
	member   *memberOf
}

// WithResourceKeys blocks until the keys, plus the shared Cluster key unless
// the exclusive Cluster key is given (R3.4), are held, and returns a handle
// owning them. The caller validates under the locks, then calls Broadcast;
// if it does not, Close releases them (R3.6).
func (b *Broadcaster) WithResourceKeys(ctx context.Context, keys ...resource.Key) (*Handle, error) {
	return b.Acquire(ctx, AcquireRequest{Keys: keys})
}

// TryWithResourceKeys is WithResourceKeys without waiting: if a key is held
// in a conflicting mode it fails at once with an error wrapping ErrBusy
// (and resource.ErrConflict) that names the holder. Queued waiters do not
// make it fail (R13.15).
func (b *Broadcaster) TryWithResourceKeys(ctx context.Context, keys ...resource.Key) (*Handle, error) {
	return b.Acquire(ctx, AcquireRequest{Keys: keys, NoWait: true})
}

// WithUnreplicableResourceKeys is WithResourceKeys for local-only
// broadcasts (R13.13): the handle is granted on any role, a secondary's
// included, and every message it broadcasts is marked unreplicable, so it
// goes to this cluster's WAL only and no replicator copies it. Use it for
// what belongs to one cluster alone: its own topology, its resource groups.
func (b *Broadcaster) WithUnreplicableResourceKeys(ctx context.Context, keys ...resource.Key) (*Handle, error) {
	return b.Acquire(ctx, AcquireRequest{Keys: keys, Unreplicable: true})
}

// AcquireRequest says how to get a handle; WithResourceKeys,
// TryWithResourceKeys, WithIdempotentResourceKeys and
// WithUnreplicableResourceKeys are its common forms.
type AcquireRequest struct {
	// Keys are the resource keys to hold (the Cluster key is added, R3.4).
	Keys []resource.Key
	// Idempotent, if set with a key, resolves the key before any lock
	// (see WithIdempotentResourceKeys).
	Idempotent *Idempotent
	// NoWait fails at once with ErrBusy, naming the holder, instead of
	// queueing for a key held in a conflicting mode (R13.15).
	NoWait bool
	// Unreplicable makes the handle's broadcasts local-only, accepted on any
	// role (see WithUnreplicableResourceKeys).
	Unreplicable bool
}

func (b *Broadcaster) newHandle(idem *Idempotent) *Handle {
	return &Handle{b: b, id: engine.HandleID(b.handles.Add(1)), idem: idem}
}

// Acquire returns a handle holding req's keys (see AcquireRequest).
func (b *Broadcaster) Acquire(ctx context.Context, req AcquireRequest) (*Handle, error) {
	idem := req.Idempotent
	if idem != nil && idem.Key == "" {
		idem = nil
	}
	if idem != nil {
		if err := idem.Key.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
		}
		cp := *idem
		idem = &cp
	}
	if err := b.closedErr(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTaskNotCreated, err)
	}
	norm, err := resource.WithClusterKey(req.Keys)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	need := Primary
	if req.Unreplicable {
		need = 0
	} else if b.Role() != Primary {
		return nil, ErrNotPrimary
	}
	if b.cfg.CheckRole != nil && !req.Unreplicable {
		if err := b.cfg.CheckRole(ctx); err != nil {
			return nil, err
		}
	}
	h := b.newHandle(idem)
	h.local = req.Unreplicable
	if idem != nil {
		r, err := b.d.call(ctx, func(to engine.Target) engine.Event {
			return engine.Resolve{To: to, Handle: h.id, Scope: engine.ScopeOf(idem.Type, idem.Key), Key: idem.Key,
				Digest: idem.Digest, CheckNew: true}
		})
		if err == nil {
			err = r.Err
		}
		if err != nil {
			h.release()
			return nil, b.notCreated(err)
		}
		if r.Original != nil {
			h.orig = r.Original
			return h, nil
		}
		h.locked = true // the admission slot
	}
	// Admission applies to new work only: a retry resolved above is answered
	// even while a quota is full (R7.5).
	if b.cfg.Admit != nil {
		if err := b.cfg.Admit(ctx); err != nil {
			h.release()
			return nil, err
		}
	}
	start := time.Now()
	if err := h.lock(ctx, norm, req.NoWait, need); err != nil {
		return nil, err
	}
	b.obs.LockWait(norm, time.Since(start))
	return h, nil
}

// lock takes the handle's keys in the core.
func (h *Handle) lock(ctx context.Context, keys []resource.Key, try bool, need Role) error {
	b := h.b
	h.locked = true
	r, err := b.d.call(ctx, func(to engine.Target) engine.Event {
		return engine.Lock{To: to, Handle: h.id, Keys: keys, Try: try, Need: need}
	})
	if err == nil {
		err = r.Err
	}
	if err != nil {
		// Withdraw the request: a grant that raced the cancellation is
		// given back.
		h.release()
		return b.notCreated(err)
	}
	h.keys = keys
	return nil
}

// notCreated wraps an error the broadcaster's shutdown caused as "task not
// created" (R4.7).
func (b *Broadcaster) notCreated(err error) error {
	if cerr := b.closedErr(); cerr != nil && !IsTaskNotCreated(err) {
		return fmt.Errorf("%w: %w", ErrTaskNotCreated, cerr)
	}
	return err
}

// release gives back whatever the core holds for the handle.
func (h *Handle) release() {
	if h.locked {
		h.locked = false
		h.b.d.request(engine.Close{Handle: h.id})
	}
}

// Keys returns the normalised keys the handle holds; nil for a duplicate.
func (h *Handle) Keys() []resource.Key {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.orig != nil || h.used {
		return nil
	}
	return append([]resource.Key(nil), h.keys...)
}

// Close releases the keys if Broadcast was never called; after Broadcast it
// does nothing, on every path (R3.6).
func (h *Handle) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.used {
		return
	}
	h.used = true
	h.release()
}

// Duplicate reports whether the handle resolved to an earlier broadcast.
func (h *Handle) Duplicate() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.orig != nil
}

// Broadcast persists the message as a task, appends a copy to every target
// vchannel and the control channel, and returns once the ack callback has run
// and the TOMBSTONE is durable (R4.2-R4.6). The task owns the handle's keys
// from this call until its callback finishes.
//
// Invalid input returns an error wrapping ErrInvalidArgument and creates
// nothing. If ctx ends after the task was created, Broadcast returns ctx's
// error and the task completes in the background, still owning its keys.
//
// Broadcast traces the call as span "walcast.broadcast" from ctx and, unless
// msg already carries a trace context, persists that span's context with the
// task, so every later step of the task joins the caller's trace (R9.6).
func (h *Handle) Broadcast(ctx context.Context, msg *message.Message) (res *Result, err error) {
	h.mu.Lock()
	if h.used {
		h.mu.Unlock()
		return nil, ErrHandleUsed
	}
	h.used = true
	h.mu.Unlock()
	b := h.b
	ctx, span := b.startBroadcastSpan(ctx, msg, h.orig != nil)
	defer func() { endBroadcastSpan(span, res, err) }()
	if h.orig != nil {
		if msg != nil {
			if msg, err = h.keyed(msg); err != nil {
				return nil, err
			}
		}
		return b.answerDuplicate(ctx, h.orig, msg, h.idem)
	}
	stamped, raw, err := h.prepare(ctx, msg)
	if err != nil {
		h.release()
		return nil, err
	}
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrVChannels.Int(len(stamped.Broadcast.VChannels)))
	}
	var request []byte
	if h.idem != nil {
		request = h.idem.Digest
	}
	h.locked = false // the task owns the keys from here (R3.6)
	var group uint64
	if h.member != nil {
		group = h.member.id
	}
	r, err := b.d.call(ctx, func(to engine.Target) engine.Event {
		return engine.Submit{To: to, Handle: h.id, Msg: stamped, Bytes: raw, Request: request, Group: group}
	})
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Errorf("broadcast continues in the background: %w", err)
	case err != nil:
		return nil, b.notCreated(err)
	case r.Err != nil:
		return nil, r.Err
	case r.Original != nil:
		// Another request owned the scope: this one is a duplicate; its
		// keys went back first, since the original may need them.
		if span.IsRecording() {
			span.SetAttributes(tracing.AttrDuplicate.Bool(true))
		}
		return b.answerDuplicate(ctx, r.Original, msg, h.idem)
	}
	return resultOf(r.Result, nil), nil
}

// keyed gives msg the handle's idempotency key if it has none (a keyed
// broadcast need not repeat its key on its message; the caller's message is
// left as it is) and refuses a message whose type or key is not the
// handle's: an idempotent handle answers only the request it was made for,
// whether it runs it or an original answers it.
func (h *Handle) keyed(msg *message.Message) (*message.Message, error) {
	if h.idem == nil {
		return msg, nil
	}
	if msg.IdempotencyKey == "" && msg.Type == h.idem.Type {
		keyed := *msg
		keyed.IdempotencyKey = h.idem.Key
		msg = &keyed
	}
	if msg.Type != h.idem.Type || msg.IdempotencyKey != h.idem.Key {
		return nil, fmt.Errorf("%w: message type %s / key fingerprint %s differ from the handle's %s / %s",
			ErrInvalidArgument, msg.Type, msg.IdempotencyKey.Fingerprint(), h.idem.Type, h.idem.Key.Fingerprint())
	}
	return msg, nil
}

// prepare validates msg and stamps it with the handle's id and keys: the
// control channel added (R2.2), the targets checked (R2.3), AckSyncUp from
// the type, the request digest and the caller's trace context carried, the
// encoded size bounded.
func (h *Handle) prepare(ctx context.Context, msg *message.Message) (*message.Message, []byte, error) {
	b := h.b
	if msg == nil {
		return nil, nil, fmt.Errorf("%w: nil message", ErrInvalidArgument)
	}
	msg, err := h.keyed(msg)
	if err != nil {
		return nil, nil, err
	}
	info, err := b.check(msg)
	if err != nil {
		return nil, nil, err
	}
	if err := b.closedErr(); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrTaskNotCreated, err)
	}
	// The handle's keys include the Cluster key, so the role cannot have
	// changed since its locks were granted, unless this is a force promote
	// queued behind another one (R8.1, R8.3).
	if !h.local {
		if err := b.checkRole(h.promote); err != nil {
			return nil, nil, err
		}
	}
	msg, keys, err := h.stampGroup(msg, info)
	if err != nil {
		return nil, nil, err
	}
	// Stamped with the widest id to validate the targets (R2.3) and bound
	// the encoded size; the core allocates the real one.
	stamped, err := msg.Stamp(math.MaxUint64, b.cfg.ControlChannel, keys)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	if err := b.checkPChannels(stamped.Broadcast.VChannels); err != nil {
		return nil, nil, err
	}
	if info.AckSyncUp {
		stamped.Broadcast.AckSyncUp = true
	}
	switch {
	case h.promote:
		setProperty(stamped, engine.UnreplicableProperty, engine.ForcePromoteMark)
	case h.local:
		setProperty(stamped, engine.UnreplicableProperty, engine.LocalMark)
	}
	if h.idem != nil && h.idem.Digest != nil {
		// Carried in the message so that it replicates: a promoted secondary
		// compares retries' digests too (R7.6, R8.4).
		setProperty(stamped, engine.RequestDigestProperty, hex.EncodeToString(h.idem.Digest))
	}
	// The trace context is persisted with the task (R9.6); a caller's own
	// is kept.
	tracing.Inject(ctx, stamped)
	stamped.Broadcast.ID = 0
	raw, err := message.Marshal(stamped)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: encode: %w", ErrInvalidArgument, err)
	}
	if n := len(raw) + maxIDField; n > b.cfg.MaxMessageBytes {
		return nil, nil, fmt.Errorf("%w: message is %d bytes encoded, limit %d", ErrInvalidArgument, n, b.cfg.MaxMessageBytes)
	}
	// Room for the id the core appends.
	return stamped, slices.Grow(raw, maxIDField), nil
}

// maxIDField is the most bytes the core appends to an encoded message for
// its broadcast id: a one-byte tag and a varint of at most 10 bytes.
const maxIDField = 11

// resultOf turns the core's result into Broadcast's.
func resultOf(r *engine.Result, dup *message.Message) *Result {
	res := &Result{BroadcastID: r.ID, Appends: r.Appends, Outcome: r.Outcome, Deduplicated: dup != nil, Duplicated: dup, Extras: r.Extras}
	if r.Window != nil {
		w := windowOf(*r.Window)
		res.Window = &w
	}
	return res
}

// Check validates a message as Broadcast would, without taking locks or
// creating anything: callers (the API) can refuse bad input before waiting
// for resource keys. It returns an error wrapping ErrInvalidArgument.
func (b *Broadcaster) Check(msg *message.Message) error {
	if msg == nil {
		return fmt.Errorf("%w: nil message", ErrInvalidArgument)
	}
	if _, err := b.check(msg); err != nil {
		return err
	}
	if err := engine.CheckTargets(msg.Broadcast.VChannels); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return b.checkPChannels(msg.Broadcast.VChannels)
}

// check validates a message before anything is created, but for its
// targets: Broadcast has Stamp check those (and Check CheckTargets), then
// checkPChannels.
func (b *Broadcaster) check(msg *message.Message) (message.TypeInfo, error) {
	info, err := b.cfg.Types.Check(msg)
	if err != nil {
		return info, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	if msg.Broadcast.ID != 0 {
		return info, fmt.Errorf("%w: message already stamped with broadcast %d", ErrInvalidArgument, msg.Broadcast.ID)
	}
	if err := msg.IdempotencyKey.Validate(); err != nil {
		return info, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	if msg.Replicate != nil {
		return info, fmt.Errorf("%w: a new broadcast cannot carry a replicate header", ErrInvalidArgument)
	}
	if err := msg.CheckCopies(); err != nil {
		return info, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	for k := range msg.Properties {
		if strings.HasPrefix(k, ReservedPropertyPrefix) {
			return info, fmt.Errorf("%w: property %q: the prefix %q is reserved for walcast", ErrInvalidArgument, k, ReservedPropertyPrefix)
		}
	}
	if len(msg.Payload) > b.cfg.MaxMessageBytes {
		return info, fmt.Errorf("%w: payload is %d bytes, limit %d", ErrInvalidArgument, len(msg.Payload), b.cfg.MaxMessageBytes)
	}
	return info, nil
}

// checkPChannels refuses valid vchannels on pchannels the cluster does not
// have: persisting such a task would leave copies that can never be
// appended, holding their keys forever.
func (b *Broadcaster) checkPChannels(vs []message.VChannel) error {
	if b.pchans == nil {
		return nil
	}
	for _, v := range vs {
		if !b.pchans[v.PChannel()] {
			return fmt.Errorf("%w: vchannel %s is on pchannel %s, which this cluster does not have", ErrInvalidArgument, v, v.PChannel())
		}
	}
	return nil
}

// checkRole refuses a broadcast the cluster's role does not allow: any but
// a force promote needs the primary role, a force promote the secondary one.
func (b *Broadcaster) checkRole(promote bool) error {
	switch r := b.Role(); {
	case promote && r != Secondary:
		return ErrNotSecondary
	case !promote && r != Primary:
		return ErrNotPrimary
	}
	return nil
}

// setProperty sets a property of a message the broadcaster owns (a stamped
// copy).
func setProperty(m *message.Message, k, v string) {
	if m.Properties == nil {
		m.Properties = make(map[string]string, 1)
	}
	m.Properties[k] = v
}

func errorfInvalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}
