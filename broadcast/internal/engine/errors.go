package engine

import "errors"

// Errors the core reports; package broadcast exports them under the same
// names (they are the same values, so errors.Is works on both).
var (
	ErrTaskNotCreated                = errors.New("broadcast task not created")
	ErrClosed                        = errors.New("broadcaster closed")
	ErrInvalidArgument               = errors.New("invalid argument")
	ErrKeyReusedWithDifferentPayload = errors.New("idempotency key reused with a different payload")
	ErrNotFound                      = errors.New("not found")
	ErrVChannelNotInTask             = errors.New("vchannel is not a target of the broadcast")
	ErrCorruptCatalog                = errors.New("corrupt catalog")
	ErrFailedPrecondition            = errors.New("failed precondition")
	ErrNotPrimary                    = errors.New("cluster is not primary, cannot do any DDL/DCL")
	ErrNotSecondary                  = errors.New("cluster is not secondary, cannot perform force promote")
	// ErrBusy reports a try-acquire that found a key held (it wraps
	// resource.ErrConflict's message naming the holder).
	ErrBusy = errors.New("resource keys busy")
	// ErrNotIssued marks an ack of a broadcast id at or above the ids this
	// leader reserved, that it never saw: a newer leader issued it (this
	// one is deposed and has not noticed), or nobody did. It comes with
	// catalog.ErrFenced; the caller that can read the election tells the
	// two apart.
	ErrNotIssued = errors.New("broadcast id not issued by this coordinator")
	// ErrGroupFull reports a transaction member beyond the group's limit
	// (R13.4): the last slot is kept for its Commit or Rollback.
	ErrGroupFull = errors.New("transaction is full")
)
