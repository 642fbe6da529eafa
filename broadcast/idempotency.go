package broadcast

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// scope is the deduplication scope of a keyed broadcast: its message type and
// its scoped idempotency key (R7.2), the zero scope when the broadcast has no
// key. Two types never share a scope, so CreateIndex and DropIndex with one
// key do not collide.
//
// A scope is a 128-bit digest of (type, key) rather than the strings: the
// index holds one per remembered key (up to MaxCount tombstones), and SPEC B6
// bounds a tombstone's memory. Two different scopes collide with probability
// 2^-128 per pair, as content-addressed stores accept.
type scope [16]byte

func scopeOf(t message.Type, k message.IdempotencyKey) scope {
	if k == "" {
		return scope{}
	}
	h := sha256.New()
	h.Write([]byte(t.Name))
	h.Write([]byte{'.'})
	h.Write([]byte(strconv.FormatUint(uint64(t.Version), 10)))
	h.Write([]byte{'/'})
	h.Write([]byte(k))
	var s scope
	copy(s[:], h.Sum(nil))
	return s
}

// payloadDigest is what R7.6 compares: a 128-bit digest of the payload.
func payloadDigest(p []byte) []byte {
	sum := sha256.Sum256(p)
	return sum[:16]
}

// Idempotent names the request a keyed broadcast answers.
type Idempotent struct {
	Type message.Type
	Key  message.IdempotencyKey
	// Digest, if set, identifies the client's request (a hash of its
	// parameters). A retry with the same key but another digest fails with
	// ErrKeyReusedWithDifferentPayload. Without it, payloads are compared
	// when the retry broadcasts one (R7.6). Give a digest when the payload
	// holds values allocated per attempt (new ids), which would differ.
	Digest []byte
}

// admission reserves a scope while its first request takes its locks, so a
// concurrent request with the same key waits for it instead of taking locks
// of its own (R7.3, R7.5).
type admission struct {
	scope scope
	done  chan struct{}
	once  sync.Once
}

// original is the task (live or tombstoned) that owns a scope, as one
// request sees it.
type original struct {
	t  *task // live task, or nil
	tb *tomb // copy of the tombstone, or nil
	// dec is tb's record, decoded once per request (decoded).
	dec    decoded
	decErr error
}

// WithIdempotentResourceKeys is WithResourceKeys for a keyed request. It
// resolves the key first, before taking any lock or running any admission
// check of the caller's (R7.5): if the scope already has an original, the
// handle is a duplicate (Duplicate reports true), holds no keys, and its
// Broadcast returns the original's result once the original's callback has
// finished, appending nothing (R7.4). Concurrent first requests with one key
// are serialised here, so exactly one becomes the original (R7.3). A new key
// longer than MaxKeyLength is refused here, before any lock (R7.1).
func (b *Broadcaster) WithIdempotentResourceKeys(ctx context.Context, req Idempotent, keys ...resource.Key) (*Handle, error) {
	if req.Key == "" {
		return b.begin(ctx, nil, keys)
	}
	if err := req.Key.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return b.begin(ctx, &req, keys)
}

// Duplicate reports whether the handle resolved to an earlier broadcast.
func (h *Handle) Duplicate() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.orig != nil
}

// admit resolves req's scope: it returns the original if there is one, or
// an admission reserving the scope for this request.
func (b *Broadcaster) admit(ctx context.Context, req *Idempotent) (*original, *admission, error) {
	sc := scopeOf(req.Type, req.Key)
	for {
		b.mu.Lock()
		if o := b.originalLocked(sc); o != nil {
			b.mu.Unlock()
			if req.Digest != nil {
				if have := o.requestDigest(); have != nil && !bytes.Equal(have, req.Digest) {
					return nil, nil, b.reused(req.Key)
				}
			}
			return o, nil, nil
		}
		adm := b.admissions[sc]
		if adm == nil {
			// A new key: the length limit applies to new keys only, so
			// lowering it never breaks a retry of a key already accepted.
			if err := req.Key.CheckLength(b.cfg.MaxKeyLength); err != nil {
				b.mu.Unlock()
				return nil, nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
			}
			adm = &admission{scope: sc, done: make(chan struct{})}
			b.admissions[sc] = adm
			b.mu.Unlock()
			return nil, adm, nil
		}
		b.mu.Unlock()
		select {
		case <-adm.done:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

func (b *Broadcaster) reused(k message.IdempotencyKey) error {
	b.log.Warn("idempotency key reused with a different payload", "key_fp", k.Fingerprint())
	return fmt.Errorf("%w (key fingerprint %s)", ErrKeyReusedWithDifferentPayload, k.Fingerprint())
}

// releaseAdmission frees a scope reservation and wakes its waiters. It is
// safe to call more than once and with nil.
func (b *Broadcaster) releaseAdmission(adm *admission) {
	if adm == nil {
		return
	}
	adm.once.Do(func() {
		b.mu.Lock()
		if b.admissions[adm.scope] == adm {
			delete(b.admissions, adm.scope)
		}
		b.mu.Unlock()
		close(adm.done)
	})
}

// indexLocked registers id as the owner of sc unless sc already has one:
// the first owner wins (R7.3). Caller holds b.mu.
func (b *Broadcaster) indexLocked(sc scope, id uint64) {
	if sc == (scope{}) {
		return
	}
	if _, ok := b.index[sc]; !ok {
		b.index[sc] = id
	}
}

// originalLocked returns the owner of sc, or nil. Caller holds b.mu.
func (b *Broadcaster) originalLocked(sc scope) *original {
	if sc == (scope{}) {
		return nil
	}
	id, ok := b.index[sc]
	if !ok {
		return nil
	}
	if t := b.tasks[id]; t != nil {
		return &original{t: t}
	}
	if tb, ok := b.gc.getLocked(id); ok {
		return &original{tb: &tb}
	}
	// The owner vanished (aborted): the scope is free again.
	delete(b.index, sc)
	return nil
}

// decoded returns the tombstone's record, decoding it on first use.
func (o *original) decoded() (decoded, error) {
	if o.dec.pb == nil && o.decErr == nil {
		o.dec, o.decErr = o.tb.decode()
	}
	return o.dec, o.decErr
}

func (o *original) requestDigest() []byte {
	if o.t != nil {
		return o.t.request
	}
	d, err := o.decoded()
	if err != nil {
		return nil
	}
	return d.pb.RequestDigest
}

func (o *original) payloadDigest() []byte {
	if o.t != nil {
		return o.t.digest
	}
	d, err := o.decoded()
	if err != nil {
		return nil
	}
	return d.pb.PayloadDigest
}

// answerDuplicate waits for the original's callback to finish (bounded by
// ctx) and returns its result (R7.4). msg, if given, is the retry's message:
// a payload different from the original's is refused (R7.6).
func (b *Broadcaster) answerDuplicate(ctx context.Context, o *original, msg *message.Message, req *Idempotent) (*Result, error) {
	key := message.IdempotencyKey("")
	if msg != nil {
		key = msg.IdempotencyKey
		if req == nil || req.Digest == nil {
			if have := o.payloadDigest(); have != nil && !bytes.Equal(have, payloadDigest(msg.Payload)) {
				return nil, b.reused(key)
			}
		}
	} else if req != nil {
		key = req.Key
	}
	b.mu.Lock()
	b.stats.Duplicates++
	b.mu.Unlock()
	if o.t != nil {
		b.obs.Duplicate(o.t.msg.Type)
		b.logDuplicate(key, o.t.id, "running")
		return b.wait(ctx, o.t, o.t.msg)
	}
	d, err := o.decoded()
	if err != nil {
		return nil, err
	}
	b.obs.Duplicate(d.msg.Type)
	out := d.outcome()
	b.logDuplicate(key, o.tb.id, out.Status.String())
	r := &Result{BroadcastID: o.tb.id, Appends: d.checkpoints(), Duplicated: d.msg, Outcome: out}
	b.mu.Lock()
	r.Window = b.windowLocked(o.tb.id, d.created(), o.tb.completedAt())
	b.mu.Unlock()
	return r, nil
}

// logDuplicate logs a hit with the original's status; the key only as a
// fingerprint (R7.7, R7.9).
func (b *Broadcaster) logDuplicate(k message.IdempotencyKey, id uint64, status string) {
	b.log.Info("duplicate request answered by its original", "key_fp", k.Fingerprint(), "original", id, "original_status", status)
}

// Window is the idempotency window of a key (R7.7). A key is remembered from
// FirstSeen until its original's tombstone is deleted: at the latest at
// ExpiresLatest (MaxLifetime after completion, from the persisted time, so
// restarts do not move it), and earlier if CountHeadroom more tombstones are
// created first (MaxCount pressure).
type Window struct {
	FirstSeen time.Time
	// CompletedAt is zero while the original is still running; the window
	// does not start expiring before it completes.
	CompletedAt   time.Time
	ExpiresLatest time.Time
	// CountHeadroom is how many newer tombstones may be created before
	// MaxCount evicts this one; -1 while the original is running.
	CountHeadroom int
}

// windowLocked computes the window of the original id. Caller holds b.mu.
func (b *Broadcaster) windowLocked(id uint64, created, completed time.Time) *Window {
	w := &Window{FirstSeen: created, CountHeadroom: -1}
	if completed.IsZero() || completed.Unix() == 0 && completed.UnixNano() == 0 {
		return w
	}
	w.CompletedAt = completed
	w.ExpiresLatest = completed.Add(b.cfg.Tombstone.MaxLifetime)
	if _, ok := b.tombs[id]; ok {
		w.CountHeadroom = b.gc.headroomLocked(id)
	}
	return w
}

// KeyStatus is what Lookup knows about an idempotency key.
type KeyStatus struct {
	BroadcastID uint64
	State       State
	// Outcome is set once the original finished.
	Outcome Outcome
	Window  Window
	Message *message.Message
}

// Lookup reports the original of a keyed request without waiting or taking
// any lock, so callers can answer retries before their own admission checks
// (R7.5). It returns ErrNotFound if no original is remembered.
func (b *Broadcaster) Lookup(_ context.Context, t message.Type, k message.IdempotencyKey) (*KeyStatus, error) {
	if k == "" {
		return nil, fmt.Errorf("%w: idempotency key is empty", ErrInvalidArgument)
	}
	if err := k.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	b.mu.Lock()
	o := b.originalLocked(scopeOf(t, k))
	if o == nil {
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: no broadcast of %s with key fingerprint %s", ErrNotFound, t, k.Fingerprint())
	}
	if o.t != nil {
		defer b.mu.Unlock()
		o.t.mu.Lock()
		defer o.t.mu.Unlock()
		return &KeyStatus{BroadcastID: o.t.id, State: o.t.state, Outcome: o.t.outcome, Message: o.t.msg,
			Window: *b.windowLocked(o.t.id, o.t.created, o.t.completed)}, nil
	}
	b.mu.Unlock()
	// The tombstone is a copy: decode it without holding b.mu.
	d, err := o.decoded()
	if err != nil {
		return nil, err
	}
	ks := &KeyStatus{BroadcastID: o.tb.id, State: Tombstone, Outcome: d.outcome(), Message: d.msg}
	b.mu.Lock()
	ks.Window = *b.windowLocked(o.tb.id, d.created(), o.tb.completedAt())
	b.mu.Unlock()
	return ks, nil
}

// Original waits for the original of a duplicate handle and returns its
// result, like Broadcast on the handle but without a message to compare.
func (h *Handle) Original(ctx context.Context) (*Result, error) {
	h.mu.Lock()
	o, used := h.orig, h.used
	h.used = true
	h.mu.Unlock()
	if o == nil {
		return nil, fmt.Errorf("%w: the handle is not a duplicate", ErrFailedPrecondition)
	}
	if used {
		return nil, ErrHandleUsed
	}
	return h.b.answerDuplicate(ctx, o, nil, h.idem)
}
