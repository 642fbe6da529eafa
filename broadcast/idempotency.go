package broadcast

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

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

// WithIdempotentResourceKeys is WithResourceKeys for a keyed request: the
// handle's Broadcast takes req's key (a message without an idempotency key
// gets it; one with another key or type is refused). It
// resolves the key first, before taking any lock or running any admission
// check of the caller's (R7.5): if the scope already has an original, the
// handle is a duplicate (Duplicate reports true), holds no keys, and its
// Broadcast returns the original's result once the original's callback has
// finished, appending nothing (R7.4). Concurrent first requests with one key
// are serialised here, so exactly one becomes the original (R7.3). A new key
// longer than MaxKeyLength is refused here, before any lock (R7.1).
func (b *Broadcaster) WithIdempotentResourceKeys(ctx context.Context, req Idempotent, keys ...resource.Key) (*Handle, error) {
	return b.Acquire(ctx, AcquireRequest{Keys: keys, Idempotent: &req})
}

// answerDuplicate waits for the original's callback to finish (bounded by
// ctx) and returns its result (R7.4). msg, if given, is the retry's message:
// a payload different from the original's is refused (R7.6).
func (b *Broadcaster) answerDuplicate(ctx context.Context, o *engine.Original, msg *message.Message, req *Idempotent) (*Result, error) {
	key := message.IdempotencyKey("")
	var rec *engine.Record
	if !o.Live {
		var err error
		if rec, err = engine.DecodeRecord([]byte(o.Record)); err != nil {
			return nil, fmt.Errorf("%w: tombstone %d: %w", ErrCorruptCatalog, o.ID, err)
		}
	}
	if msg != nil {
		key = msg.IdempotencyKey
		if req == nil || req.Digest == nil {
			have := o.Digest
			if rec != nil {
				have = rec.PayloadDigest
			}
			if have != nil && !bytes.Equal(have, engine.PayloadDigest(msg.Payload)) {
				return nil, b.reused(key)
			}
		}
	} else if req != nil {
		key = req.Key
	}
	b.duplicates.Add(1)
	if o.Live {
		b.obs.Duplicate(o.Msg.Type)
		b.logDuplicate(key, o.ID, "running")
		r, err := b.d.call(ctx, func(to engine.Target) engine.Event { return engine.Wait{To: to, ID: o.ID} })
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, fmt.Errorf("broadcast %d continues in the background: %w", o.ID, err)
		case err != nil:
			return nil, fmt.Errorf("broadcast %d was created and completes after recovery: %w", o.ID, err)
		case r.Err != nil:
			return nil, r.Err
		case r.Original != nil:
			// Tombstoned meanwhile.
			return tombResult(r.Original)
		}
		return resultOf(r.Result, o.Msg), nil
	}
	b.obs.Duplicate(rec.Msg.Type)
	b.logDuplicate(key, o.ID, rec.Outcome.Status.String())
	return tombResultOf(o, rec), nil
}

// tombResult is the result a tombstoned original gives a duplicate.
func tombResult(o *engine.Original) (*Result, error) {
	rec, err := engine.DecodeRecord([]byte(o.Record))
	if err != nil {
		return nil, fmt.Errorf("%w: tombstone %d: %w", ErrCorruptCatalog, o.ID, err)
	}
	return tombResultOf(o, rec), nil
}

func tombResultOf(o *engine.Original, rec *engine.Record) *Result {
	w := windowOf(o.Window)
	return &Result{BroadcastID: o.ID, Appends: rec.Results(), Deduplicated: true, Duplicated: rec.Msg, Outcome: rec.Outcome, Window: &w, Extras: rec.ExtrasByVChannel()}
}

func (b *Broadcaster) reused(k message.IdempotencyKey) error {
	b.log.Warn("idempotency key reused with a different payload", "key_fp", k.Fingerprint())
	return fmt.Errorf("%w (key fingerprint %s)", ErrKeyReusedWithDifferentPayload, k.Fingerprint())
}

// logDuplicate logs a hit with the original's status; the key only as a
// fingerprint (R7.7, R7.9).
func (b *Broadcaster) logDuplicate(k message.IdempotencyKey, id uint64, status string) {
	if !b.log.Enabled(context.Background(), slog.LevelInfo) {
		return // the fingerprint is a SHA-256: not for a line nobody reads
	}
	b.log.Info("duplicate request answered by its original", "key_fp", k.Fingerprint(), "original", id, "original_status", status)
}

// Window is the idempotency window of a key (R7.7). A key is remembered from
// FirstSeen until its original's tombstone is deleted: at the latest at
// ExpiresLatest (its class's MaxLifetime after completion, from the
// persisted time, so restarts do not move it), and earlier if CountHeadroom
// more tombstones of its retention class are created first (MaxCount
// pressure, R6.4).
type Window struct {
	FirstSeen time.Time
	// CompletedAt is zero while the original is still running; the window
	// does not start expiring before it completes.
	CompletedAt   time.Time
	ExpiresLatest time.Time
	// CountHeadroom is how many newer tombstones of the class may be
	// created before MaxCount evicts this one; -1 while the original is
	// running.
	CountHeadroom int
	// Class is the key's retention class (R6.4). ClassEarlyEvicted counts
	// the tombstones of the class that MaxCount evicted before their
	// MaxLifetime since the broadcaster started: when it is not zero, windows
	// of this class were cut short, and this one may be.
	Class             string
	ClassEarlyEvicted int
}

func windowOf(w engine.Window) Window {
	return Window{FirstSeen: w.FirstSeen, CompletedAt: w.CompletedAt, ExpiresLatest: w.ExpiresLatest,
		CountHeadroom: w.CountHeadroom, Class: w.Class, ClassEarlyEvicted: w.ClassEarlyEvicted}
}

// KeyStatus is what Lookup knows about an idempotency key.
type KeyStatus struct {
	BroadcastID uint64
	State       State
	// Outcome is set once the original finished.
	Outcome Outcome
	Window  Window
	Message *message.Message
	// Persisting says the original is PENDING but its record is not
	// durable yet: BroadcastID is not final until it is (a crash now may
	// forget the original, and a retry with the key would then be new
	// work with another id). Ask again, or retry with the key.
	Persisting bool
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
	if err := b.closedErr(); err != nil {
		return nil, err
	}
	var o *engine.Original
	sc := engine.ScopeOf(t, k)
	if !b.d.inspect(func(c engine.View) { o = c.Lookup(sc) }) {
		return nil, b.closedErr()
	}
	if o == nil {
		return nil, fmt.Errorf("%w: no broadcast of %s with key fingerprint %s", ErrNotFound, t, k.Fingerprint())
	}
	return keyStatus(o)
}

// keysScanBudget bounds the tasks and tombstones one call of Keys looks at
// while the engine waits, so that a page of keys among a million
// tombstones without keys costs a bounded pause: such a page may hold
// fewer keys than asked for, and its cursor says where to go on. A
// variable for the tests.
var keysScanBudget = 4096

// Keys lists the remembered idempotency keys (R7.5): the originals of the
// scopes in the index, live or tombstoned, in the order of their broadcast
// ids, from the first id above after on, at most limit of them (limit must
// be positive). Each is reported as Lookup reports it; its Message tells
// the type and the key. next is the cursor of the rest (the highest id
// this page went past; 0 once there is nothing more), which may come with
// fewer than limit keys (a call looks at a bounded number of tasks
// and tombstones, 4,096, while the engine waits). An original that exists
// throughout a walk is listed once, live or tombstoned, whenever it
// finishes; a key taken meanwhile may come or not.
func (b *Broadcaster) Keys(_ context.Context, after uint64, limit int) (keys []*KeyStatus, next uint64, err error) {
	if limit <= 0 {
		return nil, 0, fmt.Errorf("%w: limit %d is not positive", ErrInvalidArgument, limit)
	}
	if err := b.closedErr(); err != nil {
		return nil, 0, err
	}
	var found []engine.Original
	var resume uint64
	var more bool
	if !b.d.inspect(func(c engine.View) {
		resume, more = c.Originals(after, keysScanBudget, func(o engine.Original) bool {
			if len(found) == limit {
				return false
			}
			found = append(found, o)
			return true
		})
	}) {
		return nil, 0, b.closedErr()
	}
	keys = make([]*KeyStatus, 0, len(found))
	for i := range found {
		ks, err := keyStatus(&found[i])
		if err != nil {
			return nil, 0, err
		}
		keys = append(keys, ks)
	}
	if !more {
		resume = 0
	}
	return keys, resume, nil
}

// keyStatus is the status of original o, as Lookup reports it.
func keyStatus(o *engine.Original) (*KeyStatus, error) {
	if o.Live {
		st := Pending
		if o.Msg.Replicate != nil {
			st = Replicated
		}
		return &KeyStatus{BroadcastID: o.ID, State: st, Message: o.Msg, Window: windowOf(o.Window), Persisting: o.Persisting}, nil
	}
	rec, err := engine.DecodeRecord([]byte(o.Record))
	if err != nil {
		return nil, fmt.Errorf("%w: tombstone %d: %w", ErrCorruptCatalog, o.ID, err)
	}
	return &KeyStatus{BroadcastID: o.ID, State: Tombstone, Outcome: rec.Outcome, Message: rec.Msg, Window: windowOf(o.Window)}, nil
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
