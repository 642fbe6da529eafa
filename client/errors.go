package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"

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
	// ErrNotPrimary: the cluster is a secondary and refuses DDL/DCL (R8.1),
	// or a primary another cluster's force promote superseded (R8.5). It
	// also matches ErrFailedPrecondition.
	ErrNotPrimary = errors.New("walcast: cluster is not primary")
	// ErrSuperseded: the cluster was primary, and another cluster's force
	// promote superseded it (R8.5); Error.Primary names that cluster. It
	// also matches ErrNotPrimary and ErrFailedPrecondition. A client
	// configured with the new primary's address too moves there by itself.
	ErrSuperseded = errors.New("walcast: cluster superseded by another cluster's force promote")
	// ErrUnavailable: no coordinator could serve the call before the
	// retries ended.
	ErrUnavailable = errors.New("walcast: unavailable")
	// ErrUnreachable: no coordinator could be connected to (connection
	// refused, no route, no such host), for the time WithUnreachable
	// allows: probably none runs at the addresses. Nothing was sent. It
	// also matches ErrUnavailable and ErrTaskNotCreated.
	ErrUnreachable = errors.New("walcast: unreachable")
	// ErrUnauthenticated: the server needs credentials and got none or
	// bad ones (no token, a malformed, unknown, expired or revoked token,
	// a client certificate no trusted CA signed). Nothing was done.
	ErrUnauthenticated = errors.New("walcast: unauthenticated")
	// ErrPermissionDenied: the caller's role (or metadata privileges) do
	// not allow the call. Nothing was done.
	ErrPermissionDenied = errors.New("walcast: permission denied")
	// ErrTLS: the TLS connection could not be made (the server's
	// certificate is not trusted or not valid for the address, one side
	// does not speak TLS, the server refused the client's certificate).
	// Retrying does not help; the error says what to change.
	ErrTLS = errors.New("walcast: TLS handshake failed")
	// ErrBusy: a NoWait request found a resource key held in a
	// conflicting mode (R13.15; code Aborted). Nothing was created;
	// Error.Holder names who holds the key. It does not match
	// ErrFailedPrecondition.
	ErrBusy = errors.New("walcast: resource keys busy")
	// ErrTxnFull: the transaction has as many members as the server's
	// txn.max_members allows but its end (R13.4): commit or roll it back.
	// It does not match ErrInvalidArgument.
	ErrTxnFull = errors.New("walcast: transaction is full")
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
	// ReasonSuperseded: the cluster was superseded by another cluster's
	// force promote.
	ReasonSuperseded = "SUPERSEDED"
	// ReasonKeyReused: the idempotency key belongs to another request.
	ReasonKeyReused = "KEY_REUSED"
	// ReasonAlreadyExists: the object exists already.
	ReasonAlreadyExists = "ALREADY_EXISTS"
	// ReasonQuotaExceeded: an admission limit refused new work.
	ReasonQuotaExceeded = "QUOTA_EXCEEDED"
	// ReasonResourceBusy: a NoWait request found a key held (ErrBusy).
	ReasonResourceBusy = "RESOURCE_BUSY"
	// ReasonTxnFull: a transaction reached its member limit (ErrTxnFull).
	ReasonTxnFull = "TXN_FULL"
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
	// Holder and Key are, for ErrBusy, who holds the busy key
	// ("transaction 12@X", "broadcast 42@X") and which key it is.
	Holder, Key string
	// RetryAfter is how long the server asks the caller to wait before it
	// tries again (its google.rpc.RetryInfo: for ErrQuotaExceeded,
	// api.retry_after), 0 if it said nothing. Retry with the same
	// idempotency key.
	RetryAfter time.Duration
	// Primary is, for ErrSuperseded, the cluster promoted over the one
	// that answered.
	Primary string

	err         error         // the last attempt's error
	ctxErr      error         // the caller's context error, if it ended the retries
	notSent     bool          // the last attempt never reached a server
	tlsHint     string        // what to change, for a TLS failure
	hint        string        // what to check, for an answer that came from no walcast API
	unreachable time.Duration // how long no coordinator could be connected to, if that ended the call
}

// Error describes the last attempt's failure; raw idempotency keys never
// appear in it, only fingerprints.
func (e *Error) Error() string {
	s := "walcast: " + e.err.Error()
	if e.hint != "" {
		s = shortenQuote(s)
	}
	if e.tlsHint != "" && !strings.Contains(s, plainTextHint) {
		s += " (" + e.tlsHint + ")"
	}
	if e.hint != "" {
		s += " (" + e.hint + ")"
	}
	switch {
	case e.unreachable > 0:
		s += fmt.Sprintf(" (no coordinator could be connected to: %d attempts in %s)", e.Attempts, e.unreachable.Round(10*time.Millisecond))
	case e.Attempts > 1:
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
			e.Code == connect.CodeResourceExhausted && e.Reason != ReasonQuotaExceeded && e.Reason != ReasonTxnFull
	case ErrNotFound:
		return e.Code == connect.CodeNotFound
	case ErrKeyReused:
		return e.Code == connect.CodeAlreadyExists && e.Reason != ReasonAlreadyExists
	case ErrAlreadyExists:
		return e.Code == connect.CodeAlreadyExists && e.Reason == ReasonAlreadyExists
	case ErrQuotaExceeded:
		return e.Code == connect.CodeResourceExhausted && e.Reason == ReasonQuotaExceeded
	case ErrBusy:
		return e.Code == connect.CodeAborted && e.Reason == ReasonResourceBusy
	case ErrTxnFull:
		return e.Code == connect.CodeResourceExhausted && e.Reason == ReasonTxnFull
	case ErrFailedPrecondition:
		return e.Code == connect.CodeFailedPrecondition
	case ErrNotPrimary:
		return e.Code == connect.CodeFailedPrecondition && (e.Reason == ReasonNotPrimary || e.Reason == ReasonSuperseded)
	case ErrSuperseded:
		return e.Code == connect.CodeFailedPrecondition && e.Reason == ReasonSuperseded
	case ErrUnavailable:
		return e.Code == connect.CodeUnavailable
	case ErrUnreachable:
		return e.unreachable > 0
	case ErrTaskNotCreated:
		return e.notSent || e.Reason == ReasonTaskNotCreated || e.Reason == ReasonNotLeader
	case ErrUnauthenticated:
		return e.Code == connect.CodeUnauthenticated
	case ErrPermissionDenied:
		return e.Code == connect.CodePermissionDenied
	case ErrTLS:
		return e.tlsHint != ""
	}
	return false
}

// failure is what the retry loop learns from one failed attempt.
type failure struct {
	err     error
	code    connect.Code
	reason  string
	leader  string
	meta    map[string]string // the ErrorInfo's metadata
	retry   time.Duration     // the RetryInfo's delay, 0 if none
	notSent bool              // the connection was never made: no server saw the request
	tlsHint string            // set for a TLS failure: retrying cannot help
	hint    string            // set for an answer from something that is no walcast API
	hung    bool              // abandoned: the coordinator stopped answering (hungError)
	// unreachable is set when the call ends because no coordinator could
	// be connected to for that long.
	unreachable time.Duration
}

func inspect(err error) failure {
	f := failure{err: err, code: connect.CodeOf(err)}
	var ce *connect.Error
	if errors.As(err, &ce) {
		f.leader = ce.Meta().Get(LeaderHeader)
		for _, d := range ce.Details() {
			v, verr := d.Value()
			if ri, ok := v.(*errdetails.RetryInfo); ok && verr == nil {
				f.retry = max(0, ri.GetRetryDelay().AsDuration())
			}
			if info, ok := v.(*errdetails.ErrorInfo); ok && verr == nil && info.GetDomain() == errorDomain {
				f.reason = info.GetReason()
				f.meta = info.GetMetadata()
				if f.leader == "" {
					f.leader = info.GetMetadata()["leader"]
				}
			}
		}
	}
	var op *net.OpError
	f.notSent = errors.As(err, &op) && op.Op == "dial"
	var dns *net.DNSError
	var unsent *unsentError
	if errors.As(err, &dns) || errors.As(err, &unsent) {
		f.notSent = true
	}
	var hung *hungError
	if errors.As(err, &hung) {
		// The attempt may have reached the server: only its code says
		// retry (anyTransient), never "not sent".
		f.hung, f.code = true, connect.CodeUnavailable
	}
	if f.tlsHint = tlsHint(err); f.tlsHint != "" {
		f.notSent = true // the handshake comes before any request
	}
	if f.hint = foreignHint(f.code, err); f.hint != "" && f.code == connect.CodeUnavailable {
		// Something that is not an HTTP server answered (a NATS or etcd
		// port given for the API's): no walcast coordinator saw the
		// request, as if none listened there. Another address may be
		// right, so it is retried like a refused connection (and ends
		// like one, WithUnreachable).
		f.notSent = true
	}
	if f.code == connect.CodeCanceled && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		// connect-go reports a connection the server reset (it crashed or
		// was killed mid-call) as Canceled, a code meant for the caller's
		// own cancellation, which call checks on its context. The server
		// went away: it may have run the call, like any lost answer.
		f.code = connect.CodeUnavailable
	}
	return f
}

// notPrimary reports an answer of a cluster that does not take DDL: a
// secondary, or a superseded primary. Nothing was done; another cluster's
// address may be the primary's.
func (f failure) notPrimary() bool {
	return f.code == connect.CodeFailedPrecondition && (f.reason == ReasonNotPrimary || f.reason == ReasonSuperseded)
}

// retryable reports whether another attempt may succeed and is safe under p.
func (f failure) retryable(p policy) bool {
	if f.tlsHint != "" {
		return false // the same handshake fails again
	}
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
	e := &Error{Code: f.code, Reason: f.reason, Attempts: attempts, RetryAfter: f.retry, err: f.err, ctxErr: ctxErr, notSent: f.notSent,
		tlsHint: f.tlsHint, hint: f.hint, unreachable: f.unreachable}
	if f.reason == ReasonResourceBusy {
		e.Holder, e.Key = f.meta["holder"], f.meta["key"]
	}
	if f.reason == ReasonSuperseded {
		e.Primary = f.meta["primary"]
	}
	return e
}

// invalidRequest is a request refused before any attempt.
func invalidRequest(format string, args ...any) *Error {
	return &Error{Code: connect.CodeInvalidArgument, err: connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))}
}

// plainTextHint is what a walcast server tells a client that speaks plain
// HTTP to its TLS port (tlsfiles.PlainTextHint).
const plainTextHint = "this address serves TLS"

// tlsHint says what to change when err is a TLS failure, "" otherwise.
func tlsHint(err error) string {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &unknown):
		return "the server's certificate is not signed by a CA this client trusts: pass the CA bundle with --tls-ca (Go: client.WithTLS)"
	case errors.As(err, &hostname):
		return "the server's certificate is not valid for this address: use a name or IP it lists, or --tls-server-name"
	case errors.As(err, &invalid):
		return "the server's certificate is invalid (expired or not for servers): " + invalid.Error()
	case errors.As(err, &record), strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return "the server does not speak TLS: use an http:// address without --tls-ca"
	case strings.Contains(err.Error(), "remote error: tls: certificate required"):
		return "the server requires a client certificate: pass --tls-cert and --tls-key"
	case strings.Contains(err.Error(), "remote error: tls: "):
		// An alert from the server: the handshake failed on its side
		// (the only thing a client sends it to judge is a certificate).
		return "the server refused the TLS handshake: check --tls-cert and --tls-key"
	case strings.Contains(err.Error(), plainTextHint):
		return "the server serves TLS: use an https:// address (and --tls-ca for its CA)"
	}
	return ""
}

// foreignHint says what to check when the answer to a call came from
// something that is no walcast API: a server that does not speak HTTP (a
// NATS or etcd port), or an HTTP server without the procedure (HTTP 404
// with no Connect error in the body: a metrics port, another service);
// "" otherwise.
func foreignHint(code connect.Code, err error) string {
	msg := err.Error()
	switch {
	case code == connect.CodeUnavailable && (strings.Contains(msg, "malformed HTTP") || strings.Contains(msg, "readLoopPeekFailLocked")):
		// net/http's words for an answer that is no HTTP response, and
		// for bytes that came before any request (an HTTP server never
		// speaks first; a NATS server greets every connection).
		return "the server at this address does not speak HTTP: is it a walcast coordinator's API address, not its NATS or etcd port?"
	case code == connect.CodeUnimplemented && strings.HasSuffix(msg, "404 Not Found"):
		return "HTTP 404: the server at this address has no such walcast API: is it a coordinator's API address (not a metrics address or another service)?"
	}
	return ""
}

// shortenQuote cuts what net/http quotes of a malformed answer (a NATS
// server's INFO line is half a kilobyte) to its first 60 bytes.
func shortenQuote(s string) string {
	i := strings.Index(s, "malformed HTTP")
	if i < 0 {
		return s
	}
	open := strings.IndexByte(s[i:], '"')
	end := strings.LastIndexByte(s, '"')
	if open < 0 || end <= i+open+61 {
		return s
	}
	open += i + 1
	return s[:open+60] + "..." + s[end:]
}
