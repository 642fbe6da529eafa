package broadcast

import (
	"errors"

	"github.com/walcast/walcast/broadcast/internal/engine"
)

// Errors. Check them with errors.Is.
var (
	// ErrTaskNotCreated marks an error returned before the broadcast's task
	// was created: nothing was persisted or appended, and retrying is safe.
	// Compare ErrClosed, after which a created task completes on recovery.
	ErrTaskNotCreated = engine.ErrTaskNotCreated
	// ErrClosed reports a broadcaster that is closed (or was deposed).
	ErrClosed = engine.ErrClosed
	// ErrInvalidArgument reports bad input: the message, its targets, keys or
	// idempotency key. Nothing was persisted or appended.
	ErrInvalidArgument = engine.ErrInvalidArgument
	// ErrInvalidConfig reports a Config that New refuses, naming the setting.
	ErrInvalidConfig = errInvalidConfig
	// ErrHandleUsed reports a second Broadcast on a one-shot handle.
	ErrHandleUsed = errHandleUsed
	// ErrKeyReusedWithDifferentPayload reports an idempotency key already
	// accepted for a different request (R7.6).
	ErrKeyReusedWithDifferentPayload = engine.ErrKeyReusedWithDifferentPayload
	// ErrNotFound reports an unknown task id or idempotency key.
	ErrNotFound = engine.ErrNotFound
	// ErrVChannelNotInTask reports an ack for a vchannel the broadcast does
	// not target.
	ErrVChannelNotInTask = engine.ErrVChannelNotInTask
	// ErrCorruptCatalog reports catalog contents that break an invariant,
	// such as two recovered pending tasks holding conflicting keys.
	ErrCorruptCatalog = engine.ErrCorruptCatalog
	// ErrFailedPrecondition reports an operation that does not apply to the
	// task in its current state (e.g. completing a finished callback).
	ErrFailedPrecondition = engine.ErrFailedPrecondition
	// ErrNotPrimary refuses DDL/DCL on a secondary (R8.1).
	ErrNotPrimary = engine.ErrNotPrimary
	// ErrNotSecondary refuses a force promote on a primary (R8.3).
	ErrNotSecondary = engine.ErrNotSecondary
	// ErrBusy reports TryWithResourceKeys finding a key held in a
	// conflicting mode; the error names the holder and wraps
	// resource.ErrConflict.
	ErrBusy = engine.ErrBusy
	// ErrNotIssued reports an ack of a broadcast id this leader never
	// issued, above every id it reserved: a newer leader's (this one is
	// deposed; the error also wraps catalog.ErrFenced), or nobody's. A
	// server that can read the election tells the two apart.
	ErrNotIssued = engine.ErrNotIssued
)

// IsTaskNotCreated reports whether err says nothing was created.
func IsTaskNotCreated(err error) bool { return errorsIs(err, ErrTaskNotCreated) }

// Permanent marks err, returned by an ack callback, as one that no retry
// can fix (R11.6): the task then ends at once with a Failed outcome whose
// detail is err's text, no effect staged by the attempt applied, and its
// keys released, instead of being retried for ever. A callback that fails
// with any other error is retried with backoff: it holds only its own
// task's keys meanwhile, and shows in `walcast tasks hanging` until it
// succeeds or an operator completes it.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }
