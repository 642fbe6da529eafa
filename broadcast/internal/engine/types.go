package engine

import (
	"crypto/sha256"
	"log/slog"
	"strconv"
	"time"

	"github.com/walcast/walcast/broadcast/internal/mutate"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/retry"
	"github.com/walcast/walcast/message"
)

// State is a task's persisted state (R4.1). The numbers are those of the
// public broadcast.State.
type State int

// Persisted states.
const (
	Pending    State = 1
	Replicated State = 2
	Tombstone  State = 3
)

// String returns the state's name as records and the admin API show it.
func (s State) String() string {
	switch s {
	case Pending:
		return "PENDING"
	case Replicated:
		return "REPLICATED"
	case Tombstone:
		return "TOMBSTONE"
	}
	return "UNKNOWN"
}

// OutcomeStatus is how a task ended (numbers as broadcast.OutcomeStatus).
type OutcomeStatus int

// Outcome statuses.
const (
	Succeeded      OutcomeStatus = 1
	Failed         OutcomeStatus = 2
	ForceCompleted OutcomeStatus = 3
	Ignored        OutcomeStatus = 4
)

// String returns the status's name.
func (s OutcomeStatus) String() string {
	switch s {
	case Succeeded:
		return "succeeded"
	case Failed:
		return "failed"
	case ForceCompleted:
		return "force-completed"
	case Ignored:
		return "ignored"
	}
	return "unknown"
}

// Outcome is what a finished task's callback (or an operator) recorded.
type Outcome struct {
	Status OutcomeStatus
	Detail string
	Data   []byte
}

// Scope is the deduplication scope of a keyed broadcast (R7.2): a 128-bit
// digest of its message type and scoped idempotency key; the zero Scope
// when it has none. A digest rather than the strings keeps a remembered key
// small (SPEC B6); two scopes collide with probability 2^-128 per pair.
type Scope [16]byte

// ScopeOf returns the scope of type t and key k.
func ScopeOf(t message.Type, k message.IdempotencyKey) Scope {
	if k == "" {
		return Scope{}
	}
	// "name.version/key", hashed from a buffer on the stack: a duplicate
	// hit computes scopes, and sha256.New allocates.
	var buf [192]byte
	b := append(buf[:0], t.Name...)
	b = append(b, '.')
	b = strconv.AppendUint(b, uint64(t.Version), 10)
	b = append(b, '/')
	b = append(b, k...)
	sum := sha256.Sum256(b)
	return Scope(sum[:16])
}

// PayloadDigest is what R7.6 compares: a 128-bit digest of a payload.
func PayloadDigest(p []byte) []byte {
	sum := sha256.Sum256(p)
	return sum[:16]
}

// Class is a retention class of tombstones (R6.1, R6.4): its tombstones are
// kept until older than MaxLifetime or beyond its newest MaxCount.
type Class struct {
	Name        string
	MaxCount    int
	MaxLifetime time.Duration
}

// Config configures a Core. Every field but ClassOf, Observer and Logger is
// required (the broadcast package fills in the defaults).
type Config struct {
	// ControlChannel is the cluster's control channel; ControlTargets the
	// control channel of every pchannel (where a topology change goes).
	ControlChannel message.VChannel
	ControlTargets []message.VChannel
	// ClusterName names this cluster in replication topologies.
	ClusterName string
	// Prefix is prepended to every catalog key the core writes.
	Prefix string
	// Types are the registered message types.
	Types *message.Registry
	// HasAckOnce reports whether a type has an ack-once callback.
	HasAckOnce func(message.Type) bool
	// Lane returns the WAL lane a pchannel is appended through.
	Lane func(message.PChannel) message.PChannel
	// MaxEntryBytes bounds one WAL entry; Limits one catalog transaction.
	MaxEntryBytes int
	Limits        catalog.Limits
	// AppendConcurrency bounds appends in flight across lanes (R4.3).
	AppendConcurrency int
	// Backoff paces every retry the core schedules.
	Backoff retry.Policy
	// Classes are the retention classes; ClassOf maps a type to one (an
	// index into Classes; nil: every type in Classes[0]).
	Classes []Class
	ClassOf func(message.Type) int
	// CheckInterval is how often GC looks for aged tombstones.
	CheckInterval time.Duration
	// MaxKeyLength bounds new client idempotency keys.
	MaxKeyLength int
	// MaxGroupMembers bounds a transaction's members, its Begin and its
	// end included (R13.4); 0 means 64.
	MaxGroupMembers int
	// Observer receives events for metrics; Logger logs. Both are outputs:
	// the core never reads anything back from them.
	Observer Observer
	Logger   *slog.Logger
	// IndexScopeBits, if not 0, keys the idempotency index's main map by
	// that many bits of a scope (1-63) instead of 64, so that scopes share
	// keys and the exact map that parts them works (the simulator's
	// TestR7_3_IndexSharedKeys). Never set outside tests.
	IndexScopeBits int
	// Mutation plants a known bug, so that the simulator can show it
	// catches it (R11.4). It does nothing in a build without the tag
	// walcast_mutate (package mutate).
	Mutation mutate.Bug
}

// Observer receives the core's events (for metrics and tracing). Methods
// must be fast and must not call back into the core.
type Observer interface {
	// TaskState is called when a task enters a persisted state (from is 0
	// for a new or recovered task) and when it leaves the last (to is 0).
	TaskState(t message.Type, from, to State)
	// Stage is called when a task enters a lifecycle stage (a Stage of the
	// transition table), with the task's id and message.
	Stage(id uint64, m *message.Message, from, to Stage)
	// Appended is called when every copy of a task is in the WAL.
	Appended(t message.Type, since time.Duration)
	// Completed is called when a task is TOMBSTONE, with its execution time
	// and the catalog commits it took.
	Completed(id uint64, m *message.Message, d time.Duration, commits int, out Outcome)
	// AppendRetry is called when an append to lane p failed;
	// AppendFailed once per task whose copies it held.
	AppendRetry(p message.PChannel, err error)
	AppendFailed(id uint64, p message.PChannel, err error)
	// Duplicate is called when a request resolved to an earlier broadcast.
	Duplicate(t message.Type)
	// Evicted is called when GC deleted tombstones of a class: early of
	// them by the class's MaxCount before their MaxLifetime.
	Evicted(class string, total, early int)
	// CatalogCommit is called for every catalog write the core issues.
	CatalogCommit(kind string)
	// Fenced is called when the catalog reports a newer coordinator term.
	Fenced()
}

type nopObserver struct{}

func (nopObserver) TaskState(message.Type, State, State)                            {}
func (nopObserver) Stage(uint64, *message.Message, Stage, Stage)                    {}
func (nopObserver) Appended(message.Type, time.Duration)                            {}
func (nopObserver) Completed(uint64, *message.Message, time.Duration, int, Outcome) {}
func (nopObserver) AppendRetry(message.PChannel, error)                             {}
func (nopObserver) AppendFailed(uint64, message.PChannel, error)                    {}
func (nopObserver) Duplicate(message.Type)                                          {}
func (nopObserver) Evicted(string, int, int)                                        {}
func (nopObserver) CatalogCommit(string)                                            {}
func (nopObserver) Fenced()                                                         {}
