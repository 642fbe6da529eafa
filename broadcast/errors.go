package broadcast

import (
	"errors"
)

// Errors. Check them with errors.Is.
var (
	// ErrTaskNotCreated marks an error returned before the broadcast's task
	// was created: nothing was persisted or appended, and retrying is safe.
	// Compare ErrClosed, after which a created task completes on recovery.
	ErrTaskNotCreated = errors.New("broadcast task not created")
	// ErrClosed reports a broadcaster that is closed (or was deposed).
	ErrClosed = errors.New("broadcaster closed")
	// ErrInvalidArgument reports bad input: the message, its targets, keys or
	// idempotency key. Nothing was persisted or appended.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrInvalidConfig reports a Config that New refuses, naming the setting.
	ErrInvalidConfig = errors.New("invalid broadcaster config")
	// ErrHandleUsed reports a second Broadcast on a one-shot handle.
	ErrHandleUsed = errors.New("broadcast handle already used")
	// ErrKeyReusedWithDifferentPayload reports an idempotency key already
	// accepted for a different request (R7.6).
	ErrKeyReusedWithDifferentPayload = errors.New("idempotency key reused with a different payload")
	// ErrNotFound reports an unknown task id or idempotency key.
	ErrNotFound = errors.New("not found")
	// ErrVChannelNotInTask reports an ack for a vchannel the broadcast does
	// not target.
	ErrVChannelNotInTask = errors.New("vchannel is not a target of the broadcast")
	// ErrCorruptCatalog reports catalog contents that break an invariant,
	// such as two recovered pending tasks holding conflicting keys.
	ErrCorruptCatalog = errors.New("corrupt catalog")
	// ErrFailedPrecondition reports an operation that does not apply to the
	// task in its current state (e.g. completing a finished callback).
	ErrFailedPrecondition = errors.New("failed precondition")
)

// IsTaskNotCreated reports whether err says nothing was created.
func IsTaskNotCreated(err error) bool { return errors.Is(err, ErrTaskNotCreated) }
