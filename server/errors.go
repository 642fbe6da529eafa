package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/auth"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// ErrNotPrimary refuses DDL/DCL on a secondary cluster (R8.1); it is the
// engine's error.
var ErrNotPrimary = broadcast.ErrNotPrimary

// LeaderHeader is the response header (gRPC: trailer) in which a coordinator
// that does not lead names the leader's API address.
const LeaderHeader = "walcast-leader"

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail attached to
// errors whose code alone does not say what a client should do.
const ErrorDomain = "walcast"

// Reasons of the ErrorInfo detail: a machine-readable refinement of the code.
const (
	// ReasonNotLeader (Unavailable): retry at the leader, named in the
	// detail's "leader" metadata and in LeaderHeader when known. Nothing was
	// done. A coordinator whose catalog write was fenced (a newer term
	// exists) answers so too.
	ReasonNotLeader = "NOT_LEADER"
	// ReasonTaskNotCreated (Unavailable): nothing was persisted or appended;
	// retrying is safe even without an idempotency key.
	ReasonTaskNotCreated = "TASK_NOT_CREATED"
	// ReasonBroadcasterClosed (Unavailable): the broadcaster stopped; a task
	// already created completes when the next leader recovers it. Only a
	// keyed request can be retried safely.
	ReasonBroadcasterClosed = "BROADCASTER_CLOSED"
	// ReasonNotPrimary (FailedPrecondition): the cluster is a secondary.
	ReasonNotPrimary = "NOT_PRIMARY"
	// ReasonNotSecondary: a force promote on a cluster that is not a
	// secondary.
	ReasonNotSecondary = "NOT_SECONDARY"
	// ReasonSuperseded (FailedPrecondition): the cluster was primary, and
	// another cluster's force promote superseded it (R8.5); the detail's
	// "primary" metadata names that cluster. Nothing was done: send DDL to
	// the new primary.
	ReasonSuperseded = "SUPERSEDED"
	// ReasonKeyReused (AlreadyExists): the idempotency key was accepted
	// for a different request; mint a new key.
	ReasonKeyReused = "KEY_REUSED"
	// ReasonAlreadyExists (AlreadyExists): the object exists already; the
	// idempotency key, if any, is new.
	ReasonAlreadyExists = "ALREADY_EXISTS"
	// ReasonQuotaExceeded (ResourceExhausted): an admission limit refused
	// new work; retry later, with the same idempotency key.
	ReasonQuotaExceeded = "QUOTA_EXCEEDED"
	// ReasonResourceBusy (Aborted): a no_wait request found a resource key
	// held in a conflicting mode (R13.15); the detail's "key" and "holder"
	// metadata name the key and who holds it ("transaction 12@X",
	// "broadcast 42@X"). Nothing was created: retry later, or without
	// no_wait to queue.
	ReasonResourceBusy = "RESOURCE_BUSY"
	// ReasonTxnFull (ResourceExhausted): the transaction has as many
	// members as the txn.max_members limit allows but its end (R13.4):
	// commit or roll it back.
	ReasonTxnFull = "TXN_FULL"
)

// codeOf maps an error of the engine or of request parsing to the status a
// client sees, with the ErrorInfo reason, if any, that refines it. It is the
// only place where that mapping is decided. Order matters where one error
// wraps several sentinels.
func codeOf(err error) (connect.Code, string) {
	switch {
	case err == nil:
		return 0, ""
	case errors.Is(err, auth.ErrUnauthenticated):
		return connect.CodeUnauthenticated, ""
	case errors.Is(err, auth.ErrPermissionDenied):
		return connect.CodePermissionDenied, ""
	case errors.Is(err, ErrNotLeader):
		return connect.CodeUnavailable, ReasonNotLeader
	case errors.Is(err, ErrSuperseded):
		return connect.CodeFailedPrecondition, ReasonSuperseded
	case errors.Is(err, ErrNotPrimary):
		return connect.CodeFailedPrecondition, ReasonNotPrimary
	case errors.Is(err, broadcast.ErrNotSecondary):
		return connect.CodeFailedPrecondition, ReasonNotSecondary
	// Corrupt catalog contents may wrap a message decoding error below; they
	// are the server's fault, not the request's.
	case errors.Is(err, broadcast.ErrCorruptCatalog):
		return connect.CodeInternal, ""
	case errors.Is(err, broadcast.ErrKeyReusedWithDifferentPayload):
		return connect.CodeAlreadyExists, ReasonKeyReused
	case errors.Is(err, app.ErrAlreadyExists):
		return connect.CodeAlreadyExists, ReasonAlreadyExists
	case errors.Is(err, app.ErrQuotaExceeded):
		return connect.CodeResourceExhausted, ReasonQuotaExceeded
	// Aborted, not FailedPrecondition: the request was fine and the state
	// it met is transient (someone holds the key); gRPC's guidance for
	// Aborted is "retry at a higher level", which is what a try-acquire's
	// caller decides to do.
	case errors.Is(err, broadcast.ErrBusy):
		return connect.CodeAborted, ReasonResourceBusy
	case errors.Is(err, broadcast.ErrTxnFull):
		return connect.CodeResourceExhausted, ReasonTxnFull
	case errors.Is(err, broadcast.ErrInvalidArgument),
		errors.Is(err, broadcast.ErrVChannelNotInTask),
		errors.Is(err, message.ErrInvalidChannel),
		errors.Is(err, message.ErrNoTargets),
		errors.Is(err, message.ErrDuplicateVChannel),
		errors.Is(err, message.ErrUnknownType),
		errors.Is(err, message.ErrInvalidPayload),
		errors.Is(err, message.ErrInvalidKey),
		errors.Is(err, message.ErrCorrupt),
		errors.Is(err, resource.ErrInvalidKey):
		return connect.CodeInvalidArgument, ""
	case errors.Is(err, broadcast.ErrNotFound):
		return connect.CodeNotFound, ""
	case errors.Is(err, broadcast.ErrFailedPrecondition):
		return connect.CodeFailedPrecondition, ""
	// ErrTaskNotCreated may wrap ErrClosed or a context error: it is checked
	// first because "nothing was created" is what the client needs to know.
	case errors.Is(err, broadcast.ErrTaskNotCreated):
		return connect.CodeUnavailable, ReasonTaskNotCreated
	case errors.Is(err, broadcast.ErrClosed):
		return connect.CodeUnavailable, ReasonBroadcasterClosed
	// A fenced catalog write did nothing, and another coordinator leads
	// now. Checked after ErrClosed: a task created before the fencing
	// completes only under the next leader.
	case errors.Is(err, catalog.ErrFenced):
		return connect.CodeUnavailable, ReasonNotLeader
	case errors.Is(err, context.DeadlineExceeded):
		return connect.CodeDeadlineExceeded, ""
	case errors.Is(err, context.Canceled):
		return connect.CodeCanceled, ""
	}
	return connect.CodeInternal, ""
}

// serverCancels answers Unavailable, not Canceled, for a unary call that
// ended canceled while its client still waited for the answer. Canceled
// tells a client that it gave up itself, and the Go client never retries
// it; a cancellation the client did not ask for came from this server
// (shutting down, a term ending under the call), which may or may not have
// done the work, like any lost answer: Unavailable, which a keyed request
// retries. It is the innermost interceptor of every service, so that the
// audit log records the code the client gets.
var serverCancels = connect.WithInterceptors(connect.UnaryInterceptorFunc(serverCancelsFunc))

// serverCancelsFunc is serverCancels' interceptor.
func serverCancelsFunc(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		res, err := next(ctx, req)
		// A handler's plain context.Canceled (not a connect.Error) is
		// what connect answers as Canceled too.
		code := connect.CodeOf(err)
		if err != nil && ctx.Err() == nil && (code == connect.CodeCanceled || code == connect.CodeUnknown && errors.Is(err, context.Canceled)) {
			return nil, connect.NewError(connect.CodeUnavailable,
				fmt.Errorf("the coordinator canceled the call, not the client (it may be shutting down or changing leaders): %w; retrying is safe with an idempotency key", err))
		}
		return res, err
	}
}

// failed converts err for the client of procedure, logging what only an
// operator can fix (code Internal). Every API handler returns its errors
// through it.
func failed(log *slog.Logger, procedure string, err error) error {
	ce := toConnectError(err)
	if ce.Code() == connect.CodeInternal {
		log.Error("API request failed", "procedure", procedure, "err", err)
	}
	return ce
}

// toConnectError turns err into the error the client receives: the code and
// reason of codeOf, a message that says what to do, and for ErrNotLeader the
// leader's address in LeaderHeader. Messages come from errors that never
// hold raw idempotency keys, only their fingerprints (R7.7).
func toConnectError(err error) *connect.Error {
	code, reason := codeOf(err)
	msg := err
	var leader string
	if code == connect.CodeUnauthenticated || code == connect.CodePermissionDenied {
		msg = errors.New(auth.Message(err)) // the code says it already
	}
	switch reason {
	case ReasonTaskNotCreated:
		msg = fmt.Errorf("%w (nothing was persisted or appended; retrying is safe)", err)
	case ReasonBroadcasterClosed:
		msg = fmt.Errorf("%w (a task already created completes after the next leader recovers it; retry with the same idempotency key to get its result)", err)
	case ReasonNotLeader:
		var nl *NotLeaderError
		if errors.As(err, &nl) {
			leader = nl.Leader
		} else {
			msg = fmt.Errorf("%w (this coordinator no longer leads; retry at the leader)", err)
		}
	}
	ce := connect.NewError(code, msg)
	if leader != "" {
		ce.Meta().Set(LeaderHeader, leader)
	}
	if reason != "" {
		info := &errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}
		if leader != "" {
			info.Metadata = map[string]string{"leader": leader}
		}
		if reason == ReasonResourceBusy {
			if key, holder, ok := busyHolder(err); ok {
				info.Metadata = map[string]string{"key": key, "holder": holder}
			}
		}
		var se *SupersededError
		if reason == ReasonSuperseded && errors.As(err, &se) {
			info.Metadata = map[string]string{"primary": se.By}
		}
		if d, derr := connect.NewErrorDetail(info); derr == nil {
			ce.AddDetail(d)
		}
	}
	return ce
}

// busyHolder returns the key and its holder that a try-acquire's ErrBusy
// names ("Collection:db:c@X", "transaction 12@X"), from the
// resource.ConflictError it wraps; ok is false if it wraps none.
func busyHolder(err error) (key, holder string, ok bool) {
	var ce *resource.ConflictError
	if !errors.As(err, &ce) || ce.Holders == "" {
		return "", "", false
	}
	return ce.Key.String(), ce.Holders, true
}
