// Package app is the contract between a walcast process (package server)
// and the application it runs, such as the reference metadata service
// (package meta): what an application registers with the process, and what
// the process gives it. Both sides import this package and neither imports
// the other; the process is the composition root that wires an App in
// (server.StartStandalone, server.StartCoordinator, server.StartNode).
//
// An application registers its message types and ack callbacks
// (App.Register), serves its API beside BroadcastService (App.Handlers) and
// keeps per-vchannel state on the streaming nodes (App.Applier). Optional
// interfaces add the rest: types only its own API may broadcast
// (TypeOwner), views its nodes serve (NodeViewer), failures its effects
// show after their broadcast succeeded (OutcomeJudge), and import jobs and
// collections the operator console lists (ImportJobLister,
// CollectionLister).
//
// The process gives it the leader's broadcaster (Leader) and the handler
// options every API handler of the process uses. Its handlers return plain
// errors: the process maps them to the API's status codes as it maps
// BroadcastService's, so a handler wraps the kinds below (ErrAlreadyExists,
// ErrQuotaExceeded) or broadcast's (broadcast.ErrInvalidArgument,
// broadcast.ErrNotFound, ...) to say what a request ran into.
//
// Generic is the application of a process that runs none of its own.
package app

import (
	"context"
	"errors"
	"net/http"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/node"
)

// App plugs an application into a walcast process: its message types and
// ack callbacks on the coordinator, its API handlers, and its per-vchannel
// state on the streaming nodes.
type App interface {
	// Register adds the app's types and callbacks. The process calls it once,
	// before the first broadcaster starts.
	Register(types *message.Registry, cbs *broadcast.Callbacks) error
	// Handlers returns extra API handlers by path, served beside
	// BroadcastService; l gives the broadcaster while this process leads.
	// opts are the process's handler options, to pass to every handler:
	// they refuse JSON requests with unknown fields, map the errors the
	// handlers return to the API's status codes, answer a cancellation the
	// client did not ask for as Unavailable, and audit the calls.
	Handlers(l Leader, opts ...connect.HandlerOption) map[string]http.Handler
	// Applier returns the state a streaming node keeps of the copies it
	// applies.
	Applier(node string) node.Applier
}

// TypeOwner is implemented by an App whose message types only its own API
// may broadcast: BroadcastService refuses them.
type TypeOwner interface {
	OwnedTypes() []message.Type
}

// NodeViewer is implemented by an App whose streaming nodes can show what
// they applied (the metadata service's views): a `walcast node` process
// serves its handlers on its metrics address (--metrics-addr), since in
// cluster mode the coordinators run no node (`walcast view --addr <node>`).
// They are served with the API's authentication when the node's api.auth
// or api.tls.client_ca_file is set, else to loopback callers only. opts are
// the process's handler options, as for App.Handlers.
type NodeViewer interface {
	NodeHandlers(opts ...connect.HandlerOption) map[string]http.Handler
}

// OutcomeJudge is implemented by an App whose effects can fail after their
// broadcast succeeded (the metadata service's import job, created by its
// Import broadcast, fails later on a bad file). BroadcastService shows that
// verdict with the task and its idempotency key (Task.application_outcome,
// LookupKeyResponse.application_outcome), so an operator sees a key stuck
// on a failed original (R7.9).
type OutcomeJudge interface {
	// ApplicationOutcome returns the application's outcome of a finished
	// task of type typ whose broadcast outcome is o, and true when it is a
	// failure o does not show; b is the broadcaster that leads.
	ApplicationOutcome(ctx context.Context, b *broadcast.Broadcaster, typ message.Type, o broadcast.Outcome) (broadcast.Outcome, bool)
}

// ImportJobLister is implemented by an App whose import jobs the operator
// console shows (the metadata service), a page at a time: the first (token
// ""), or the one after token; next is the token of the page after ("":
// none).
type ImportJobLister interface {
	ImportJobs(ctx context.Context, token string) (jobs []*walcastv1.ImportJob, next string, err error)
}

// CollectionLister is implemented by an App whose collections the operator
// console shows (the metadata service), a page of a database's at a time:
// the first (token ""), or the one after token; next is the token of the
// page after ("": none).
type CollectionLister interface {
	Collections(ctx context.Context, database, token string) (colls []*walcastv1.Collection, next string, err error)
}

// Leader gives an application's API the broadcaster of the coordinator
// while it leads. Current is called once per request; while the coordinator
// does not lead it returns an error the process answers with code
// Unavailable and the leader's address (server.NotLeaderError), which a
// handler returns as it is.
type Leader interface {
	Current() (*broadcast.Broadcaster, error)
}

// LeaderFunc adapts a function to the Leader interface.
type LeaderFunc func() (*broadcast.Broadcaster, error)

// Current calls f.
func (f LeaderFunc) Current() (*broadcast.Broadcaster, error) { return f() }

// StaticLeader is a Leader that always leads with b: for tests and for
// embedding walcast in a process that is its only coordinator.
func StaticLeader(b *broadcast.Broadcaster) Leader {
	return LeaderFunc(func() (*broadcast.Broadcaster, error) { return b, nil })
}

// Errors an application's API handlers wrap so that the process maps them
// like the engine's own: they say what the request ran into, not which part
// of the server refused it.
var (
	// ErrAlreadyExists reports an object the request would create that
	// exists already (a database or collection name taken): code
	// AlreadyExists, reason ALREADY_EXISTS.
	ErrAlreadyExists = errors.New("already exists")
	// ErrQuotaExceeded reports an admission limit reached by new work (too
	// many unfinished import jobs): code ResourceExhausted, reason
	// QUOTA_EXCEEDED. Retries of accepted requests are answered before such
	// limits are checked (R7.5).
	ErrQuotaExceeded = errors.New("quota exceeded")
)
