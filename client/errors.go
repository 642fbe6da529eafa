package client

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
)

// Errors a call can end with. Check them with errors.Is; every error of this
// package is an *Error, which also unwraps to the last attempt's
// *connect.Error and, when the caller's context ended the retries, to the
// context's error.
var (
	// ErrInvalidArgument: the request is malformed or too large. Retrying
	// it unchanged fails again.
	ErrInvalidArgument = errors.New("walcast: invalid argument")
	// ErrNotFound: no such task or idempotency key.
	ErrNotFound = errors.New("walcast: not found")
	// ErrKeyReused: the idempotency key was accepted for a different
	// request; mint a new key for a new operation.
	ErrKeyReused = errors.New("walcast: idempotency key reused with a different request")
	// ErrAlreadyExists: the object the request would create exists already
	// (a metadata name taken). It does not match ErrKeyReused.
	ErrAlreadyExists = errors.New("walcast: already exists")
	// ErrQuotaExceeded: an admission limit refused new work (too many
	// unfinished import jobs); retry later with the same key. It does not
	// match ErrInvalidArgument.
	ErrQuotaExceeded = errors.New("walcast: quota exceeded")
	// ErrFailedPrecondition: the operation does not apply in the current
	// state (e.g. completing a finished callback), including ErrNotPrimary.
	ErrFailedPrecondition = errors.New("walcast: failed precondition")
	// ErrNotPrimary: the cluster is a secondary and refuses DDL/DCL (R8.1).
	// It also matches ErrFailedPrecondition.
	ErrNotPrimary = errors.New("walcast: cluster is not primary")
	// ErrUnavailable: no coordinator could serve the call before the
	// retries ended.
	ErrUnavailable = errors.New("walcast: unavailable")
	// ErrTaskNotCreated: the server certainly did nothing (it refused before
	// creating a task, did not lead, or was never reached), so the call can
	// be repeated safely, keyed or not.
	ErrTaskNotCreated = errors.New("walcast: task not created")
)

// LeaderHeader is the response header in which a coordinator that does not
// lead names the leader (the server's server.LeaderHeader).
const LeaderHeader = "walcast-leader"

// errorDomain and the reasons are those of the google.rpc.ErrorInfo detail
// the server attaches to errors (server.ErrorDomain, server.Reason*).
const errorDomain = "walcast"

// Reasons an *Error may carry (the server's ErrorInfo reason), refining its
// code.
const (
	// ReasonNotLeader: the coordinator does not lead; nothing was done.
	ReasonNotLeader = "NOT_LEADER"
	// ReasonTaskNotCreated: refused before anything was persisted.
	ReasonTaskNotCreated = "TASK_NOT_CREATED"
	// ReasonBroadcasterClosed: the coordinator stopped; a task it had
	// created completes under the next leader.
	ReasonBroadcasterClosed = "BROADCASTER_CLOSED"
	// ReasonNotPrimary: the cluster is a secondary.
	ReasonNotPrimary = "NOT_PRIMARY"
	// ReasonKeyReused: the idempotency key belongs to another request.
	ReasonKeyReused = "KEY_REUSED"
	// ReasonAlreadyExists: the object exists already.
	ReasonAlreadyExists = "ALREADY_EXISTS"
	// ReasonQuotaExceeded: an admission limit refused new work.
	ReasonQuotaExceeded = "QUOTA_EXCEEDED"
)

// Error is a failed call, after any retries.
type Error struct {
	// Code is the status of the last attempt.
	Code connect.Code
	// Reason is the server's machine-readable reason, "" if none.
	Reason string
	// Attempts counts the attempts made (0 if the request was refused
	// before any was sent).
	Attempts int

	err     error // the last attempt's error
	ctxErr  error // the caller's context error, if it ended the retries
	notSent bool  // the last attempt never reached a server
}

// Error describes the last attempt's failure; raw idempotency keys never
// appear in it, only fingerprints.
func (e *Error) Error() string {
	s := "walcast: " + e.err.Error()
	if e.Attempts > 1 {
		s += fmt.Sprintf(" (after %d attempts)", e.Attempts)
	}
	if e.ctxErr != nil {
		s += "; gave up: " + e.ctxErr.Error()
	}
	return s
}

// Unwrap returns the last attempt's error and, if the caller's context ended
// the retries, the context's error.
func (e *Error) Unwrap() []error {
	if e.ctxErr != nil {
		return []error{e.err, e.ctxErr}
	}
	return []error{e.err}
}

// Is matches the sentinel errors of this package by code and reason.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrInvalidArgument:
		return e.Code == connect.CodeInvalidArgument || e.Code == connect.CodeOutOfRange ||
			e.Code == connect.CodeResourceExhausted && e.Reason != ReasonQuotaExceeded
	case ErrNotFound:
		return e.Code == connect.CodeNotFound
	case ErrKeyReused:
		return e.Code == connect.CodeAlreadyExists && e.Reason != ReasonAlreadyExists
	case ErrAlreadyExists:
		return e.Code == connect.CodeAlreadyExists && e.Reason == ReasonAlreadyExists
	case ErrQuotaExceeded:
		return e.Code == connect.CodeResourceExhausted && e.Reason == ReasonQuotaExceeded
	case ErrFailedPrecondition:
		return e.Code == connect.CodeFailedPrecondition
	case ErrNotPrimary:
		return e.Code == connect.CodeFailedPrecondition && e.Reason == ReasonNotPrimary
	case ErrUnavailable:
		return e.Code == connect.CodeUnavailable
	case ErrTaskNotCreated:
		return e.notSent || e.Reason == ReasonTaskNotCreated || e.Reason == ReasonNotLeader
	}
	return false
}

// failure is what the retry loop learns from one failed attempt.
type failure struct {
	err     error
	code    connect.Code
	reason  string
	leader  string
	notSent bool // the connection was never made: no server saw the request
}

func inspect(err error) failure {
	f := failure{err: err, code: connect.CodeOf(err)}
	var ce *connect.Error
	if errors.As(err, &ce) {
		f.leader = ce.Meta().Get(LeaderHeader)
		for _, d := range ce.Details() {
			v, verr := d.Value()
			if info, ok := v.(*errdetails.ErrorInfo); ok && verr == nil && info.GetDomain() == errorDomain {
				f.reason = info.GetReason()
				if f.leader == "" {
					f.leader = info.GetMetadata()["leader"]
				}
			}
		}
	}
	var op *net.OpError
	f.notSent = errors.As(err, &op) && op.Op == "dial"
	if f.code == connect.CodeCanceled && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		// connect-go reports a connection the server reset (it crashed or
		// was killed mid-call) as Canceled, a code meant for the caller's
		// own cancellation, which call checks on its context. The server
		// went away: it may have run the call, like any lost answer.
		f.code = connect.CodeUnavailable
	}
	return f
}

// retryable reports whether another attempt may succeed and is safe under p.
func (f failure) retryable(p policy) bool {
	if f.code != connect.CodeUnavailable && f.code != connect.CodeDeadlineExceeded {
		return false // the server decided; asking again gets the same answer
	}
	if p == anyTransient {
		return true
	}
	// Not idempotent: repeat only what certainly did not run.
	return f.notSent || f.reason == ReasonNotLeader || f.reason == ReasonTaskNotCreated
}

func (f failure) toError(attempts int, ctxErr error) *Error {
	return &Error{Code: f.code, Reason: f.reason, Attempts: attempts, err: f.err, ctxErr: ctxErr, notSent: f.notSent}
}

// invalidRequest is a request refused before any attempt.
func invalidRequest(format string, args ...any) *Error {
	return &Error{Code: connect.CodeInvalidArgument, err: connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))}
}
