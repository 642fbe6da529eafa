package engine

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/walcast/walcast/broadcast/internal/mutate"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/retry"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
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

// Event is an input of the core: a request of the engine's API (carrying
// where to send its Reply), or the result of an action the driver performed.
type Event interface{ event() }

// Target is where a Reply goes: opaque to the core, which only copies it into
// the Reply (the driver uses a channel, a simulator a token).
type Target any

// HandleID names one handle (WithResourceKeys and friends) across the
// events of its life: Resolve, Lock, Submit, Close.
type HandleID uint64

// Resolve looks up a keyed request's scope before any lock (R7.5): the reply
// carries the Original, or admits the request as the scope's first (the
// handle then holds the scope's admission slot until Submit or Close), or,
// if another first request holds the slot, comes once that one is done.
type Resolve struct {
	To     Target
	Handle HandleID
	Scope  Scope
	Key    message.IdempotencyKey
	// Digest is the caller's request digest (R7.6), nil if none.
	Digest []byte
	// Check, if set, is checked when the key turns out new (the length
	// limit of R7.1 applies to new keys only).
	CheckNew bool
}

// Lock asks for a handle's issuance locks (keys normalised, the Cluster key
// included). The reply carries the Grant, or an error: not primary (or not
// secondary for a force promote), busy (Try), closed.
type Lock struct {
	To     Target
	Handle HandleID
	Keys   []resource.Key
	// Try fails at once with a busy error naming the holder instead of
	// queueing.
	Try bool
	// Need is the role the cluster must have, checked before and after the
	// wait (0: any); a force promote needs Secondary.
	Need Role
}

// Close ends a handle that did not broadcast: its locks and admission slot
// are released (R3.6). Closing a handle that broadcast does nothing.
type Close struct{ Handle HandleID }

// Submit creates a task from a handle that holds its locks (R4.2). Msg is
// stamped but for its broadcast id (0), and Bytes is Msg encoded: the core
// allocates the id, sets it in Msg and appends it to Bytes (a protobuf
// field appended overrides, so the encoding is complete without encoding
// again). The reply comes when the task finished (a Result), or with an
// error if it was never created, or with an Original if the scope got one
// meanwhile.
type Submit struct {
	To     Target
	Handle HandleID
	Msg    *message.Message
	Bytes  []byte
	// Request is the caller's request digest, nil if none.
	Request []byte
	// Group, if not 0, makes the broadcast a member of the open group of
	// that id (R13.1, R13.7): Msg carries the group's keys (and, in a
	// transaction, its targets) and its Group header with ID and Kind; the
	// core gives it its Seq. The handle holds the shared Cluster key only:
	// the member uses the group's keys.
	Group uint64
}

// Wait asks for the result of live task ID (a duplicate waiting for its
// original, R7.4).
type Wait struct {
	To Target
	ID uint64
}

// Ack is one consumer acknowledgement (R4.5).
type Ack struct {
	To         Target
	ID         uint64
	VChannel   message.VChannel
	Checkpoint wal.Checkpoint
	// Msg is the copy's message if the consumer has it; a replicated one
	// creates the REPLICATED task on a secondary (R8.2).
	Msg *message.Message
	// Ctx is the acker's context, handed to the ack-once callback it runs
	// (opaque to the core).
	Ctx context.Context
	// Extra is what the consumer returns with its ack (R13.12), persisted
	// with the copy's checkpoint; nil for nothing.
	Extra []byte
}

// WaitAcked asks to be answered once every copy of task ID on VChannels is
// acked (R13.11), at once if they are or the task is finished.
type WaitAcked struct {
	To        Target
	ID        uint64
	VChannels []message.VChannel
}

// Follow makes the (empty) cluster a secondary under Config (R8.1); Handle
// holds the exclusive Cluster key (a Lock without WantID).
type Follow struct {
	To     Target
	Handle HandleID
	Config ReplicateConfig
}

// RetryNow makes task ID's failing callback retry at once (R5.6).
type RetryNow struct {
	To Target
	ID uint64
}

// Complete completes task ID's callback without its effects (R5.6); the
// reply comes once the task is TOMBSTONE.
type Complete struct {
	To     Target
	ID     uint64
	Reason string
}

// Withdraw takes back the request whose reply goes to To: its caller gave
// up waiting (R11.5). Whatever the request left in the core goes with it —
// its place among an admission slot's waiters, its queued lock request and
// the slot its handle holds, its place among a task's waiters — and the
// core never answers To afterwards; a Submit already made goes on without
// its caller. Done is answered once it is withdrawn, with the task it
// waited for (Reply.Waited). Withdrawing a request already answered does
// nothing.
type Withdraw struct {
	To   Target
	Done Target
}

// Inspect runs Fn with the core's read-only View between two events, for
// reads (introspection APIs). Fn must not keep the view.
type Inspect struct{ Fn func(View) }

// Written is the result of a Write action.
type Written struct {
	ID  uint64
	Err error
	// Record and Message are what the driver encoded from the Write's
	// RecordSpec (the record put under the task key, the message if the
	// spec carried none).
	Record, Message []byte
}

// Appended is the result of an Append action: per item, per vchannel, where
// the copy landed.
type Appended struct {
	ID      uint64
	Results [][]wal.Checkpoint
	Err     error
}

// CallbackDone is the result of a Callback action: the catalog writes the
// callback staged (R5.3) and its outcome, or its error.
type CallbackDone struct {
	Task    uint64
	Attempt int
	Ops     []catalog.Op
	Outcome Outcome
	Err     error
}

// AckOnceDone is the result of an AckOnce action.
type AckOnceDone struct {
	ID  uint64
	Err error
}

// Scanned is the result of a Scan action: the copies found.
type Scanned struct {
	ID    uint64
	Found []Found
	Err   error
}

// Found is one copy a Scan found.
type Found struct {
	ID         uint64
	VChannel   message.VChannel
	Checkpoint wal.Checkpoint
}

// Tick tells the core that time passed (its next deadline may be due).
type Tick struct{}

// Stop stops the core (Close, or a fenced catalog): every waiter is
// answered, telling apart tasks never created from tasks that complete
// after recovery (R4.7).
type Stop struct{ Err error }

func (Resolve) event()      {}
func (Lock) event()         {}
func (Close) event()        {}
func (Submit) event()       {}
func (Wait) event()         {}
func (WaitAcked) event()    {}
func (Ack) event()          {}
func (Follow) event()       {}
func (RetryNow) event()     {}
func (Complete) event()     {}
func (Withdraw) event()     {}
func (Inspect) event()      {}
func (Written) event()      {}
func (Appended) event()     {}
func (CallbackDone) event() {}
func (AckOnceDone) event()  {}
func (Scanned) event()      {}
func (Tick) event()         {}
func (Stop) event()         {}

// Make sure the constructors cannot drift: every Event above.
var _ = []Event{Resolve{}, Lock{}, Close{}, Submit{}, Wait{}, WaitAcked{}, Ack{}, Follow{}, RetryNow{}, Complete{},
	Withdraw{}, Inspect{}, Written{}, Appended{}, CallbackDone{}, AckOnceDone{}, Scanned{}, Tick{}, Stop{}}

// WriteKind is what a write is for.
type WriteKind int

// Kinds of writes.
const (
	// WritePending persists a new task's PENDING record (R4.2).
	WritePending WriteKind = iota + 1
	// WriteAcks persists a REPLICATED task's acks (and the id floor) before
	// the acker is answered (R8.2).
	WriteAcks
	// WriteTombstone persists the TOMBSTONE with the callback's effects
	// (R5.3).
	WriteTombstone
	// WriteGC deletes collected tombstones (R6.2).
	WriteGC
	// WriteIDs reserves a block of broadcast ids.
	WriteIDs
	// WriteTopology stores a followed replication topology (Follow).
	WriteTopology
	// WritePromote records where a force promote's copies landed (R8.3).
	WritePromote
	// AppendCopies appends copies to the WAL (R4.3).
	AppendCopies
	// WriteFirstAcks persists a two-phase append's first-phase acks before
	// its other copies are appended (R13.11).
	WriteFirstAcks
)

var kindNames = map[WriteKind]string{
	WritePending: "pending", WriteAcks: "ack", WriteTombstone: "tombstone", WriteGC: "gc",
	WriteIDs: "ids", WriteTopology: "replicate", WritePromote: "promote", AppendCopies: "append",
	WriteFirstAcks: "first-acks",
}

// String names the kind as the catalog-commit metric labels it.
func (k WriteKind) String() string {
	if n, ok := kindNames[k]; ok {
		return n
	}
	return fmt.Sprintf("WriteKind(%d)", int(k))
}

// rawBytes returns a record string's bytes without copying; callers only
// read them (proto.Unmarshal copies what it keeps).
func rawBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// Action is an output of the core: something the driver must do, and
// report back as an Event when it is an I/O. It is a value, not a boxed
// interface, so that the core emits it into a slice it reuses without
// allocating: Kind says which one of its fields holds the action; the
// others are zero.
type Action struct {
	Kind           ActionKind
	Reply          Reply
	Write          Write
	Append         Append
	Callback       Callback
	CancelCallback CancelCallback
	AckOnce        AckOnce
	Scan           Scan
	RoleChanged    RoleChanged
	Fenced         Fenced
}

// ActionKind says which field of an Action holds it.
type ActionKind uint8

// The kinds of action, one per field of Action.
const (
	ActNone ActionKind = iota
	ActReply
	ActWrite
	ActAppend
	ActCallback
	ActCancelCallback
	ActAckOnce
	ActScan
	ActRoleChanged
	ActFenced
)

var actionKinds = [...]string{"None", "Reply", "Write", "Append", "Callback", "CancelCallback", "AckOnce", "Scan", "RoleChanged", "Fenced"}

// String names the kind as its field is named.
func (k ActionKind) String() string {
	if int(k) < len(actionKinds) {
		return actionKinds[k]
	}
	return fmt.Sprintf("ActionKind(%d)", k)
}

// outbox holds the actions ready for the driver, in the order the core
// decided them, as values in a slice it reuses (Core.AppendReady): emitting
// one allocates nothing. Every part that decides an action is handed the
// core's outbox.
type outbox struct{ acts []Action }

// reply answers to (nil: nobody waits, nothing is sent).
func (o *outbox) reply(to Target, r Reply) {
	if to == nil {
		return
	}
	r.To = to
	o.acts = append(o.acts, Action{Kind: ActReply, Reply: r})
}

func (o *outbox) write(w Write) { o.acts = append(o.acts, Action{Kind: ActWrite, Write: w}) }

func (o *outbox) append(a Append) { o.acts = append(o.acts, Action{Kind: ActAppend, Append: a}) }

func (o *outbox) callback(cb Callback) {
	o.acts = append(o.acts, Action{Kind: ActCallback, Callback: cb})
}

func (o *outbox) cancelCallback(task uint64) {
	o.acts = append(o.acts, Action{Kind: ActCancelCallback, CancelCallback: CancelCallback{Task: task}})
}

func (o *outbox) ackOnce(a AckOnce) { o.acts = append(o.acts, Action{Kind: ActAckOnce, AckOnce: a}) }

func (o *outbox) scan(s Scan) { o.acts = append(o.acts, Action{Kind: ActScan, Scan: s}) }

func (o *outbox) roleChanged(r RoleChanged) {
	o.acts = append(o.acts, Action{Kind: ActRoleChanged, RoleChanged: r})
}

func (o *outbox) fenced(err error) {
	o.acts = append(o.acts, Action{Kind: ActFenced, Fenced: Fenced{Err: err}})
}

// onlyReplies reports whether every action is a Reply (also when none is).
func (o *outbox) onlyReplies() bool {
	for i := range o.acts {
		if o.acts[i].Kind != ActReply {
			return false
		}
	}
	return true
}

// Reply answers a request.
type Reply struct {
	To  Target
	Err error
	// Admitted: the Resolve found no original; the handle holds the slot.
	Admitted bool
	// Granted: the Lock was granted.
	Granted bool
	// Original: the request is a duplicate of this original.
	Original *Original
	// Result: the task finished.
	Result *Result
	// Waited answers a Withdraw: the task the withdrawn request waited
	// for; nil if it waited for none (a key's admission slot, locks) or
	// was not waiting.
	Waited *Waited
}

// Waited is what a withdrawn request was waiting for: task ID in Stage;
// with ID 0, its turn in group Group (a member queued behind the one
// before it) or, without a group, the catalog to allocate its broadcast's
// id.
type Waited struct {
	ID    uint64
	Stage Stage
	Group uint64
}

// Original is the broadcast that owns a scope, as a duplicate sees it.
type Original struct {
	ID uint64
	// Live is set while the original runs: Wait for its Result. Msg is then
	// its message, Digest its payload digest and Request its request
	// digest.
	Live    bool
	Msg     *message.Message
	Digest  []byte
	Request []byte
	// Persisting is set while a live original's PENDING record is not
	// known to be durable: a crash now may forget it, and a request with
	// its key would then be new work with another id.
	Persisting bool
	// Record is a tombstoned original's record (decode it with
	// DecodeRecord), Window its idempotency window.
	Record string
	Window Window
}

// Result is a finished task, as Broadcast returns it.
type Result struct {
	ID      uint64
	Msg     *message.Message
	Appends wal.Landings
	// Extras are what consumers returned with their acks (R13.12), by
	// vchannel; nil if none did.
	Extras  map[message.VChannel][]byte
	Outcome Outcome
	// Window is set for a keyed task (R7.7).
	Window *Window
}

// Window is the idempotency window of a key (R7.7).
type Window struct {
	FirstSeen     time.Time
	CompletedAt   time.Time
	ExpiresLatest time.Time
	// CountHeadroom is how many newer tombstones of the key's class may be
	// created before its MaxCount evicts this one; -1 while running.
	CountHeadroom int
	// Class is the retention class; ClassEarlyEvicted counts the class's
	// tombstones MaxCount evicted before their MaxLifetime since this core
	// started: if not 0, some windows of the class were cut short (R6.4).
	Class             string
	ClassEarlyEvicted int
}

// Write asks for one catalog commit. The driver encodes Record (if set)
// and puts it under the task's key as the first op, then commits Ops with
// it, and reports Written.
type Write struct {
	ID     uint64
	Kind   WriteKind
	Task   uint64
	Record *RecordSpec
	Ops    []catalog.Op
}

// Append asks for one WAL append of Items as one entry of Lane, with the
// driver's salt; the driver reports Appended.
type Append struct {
	ID    uint64
	Lane  message.PChannel
	Items []wal.Item
}

// Callback asks for one attempt of task Task's ack callback; the driver
// reports CallbackDone. Until then, a CancelCallback may cancel it.
type Callback struct {
	Task    uint64
	Attempt int
	Msg     *message.Message
	Results wal.Landings
	// Extras are what consumers returned with their acks (R13.12).
	Extras map[message.VChannel][]byte
}

// CancelCallback cancels the running attempt of Task's callback (an
// operator completed it).
type CancelCallback struct{ Task uint64 }

// AckOnce asks for one run of the ack-once callback of one copy (R5.5); the
// driver reports AckOnceDone.
type AckOnce struct {
	// Ctx is the acker's context (nil for the engine's own FastAck).
	Ctx        context.Context
	ID         uint64
	Task       uint64
	Msg        *message.Message
	VChannel   message.VChannel
	Checkpoint wal.Checkpoint
}

// Scan asks for every copy of PChannel from entry offset From to the end of
// its lane (a force promote looking for copies an earlier run appended);
// the driver reports Scanned.
type Scan struct {
	ID       uint64
	PChannel message.PChannel
	From     uint64
}

// RoleChanged tells the driver the cluster's role and topology changed.
type RoleChanged struct {
	Role   Role
	Config ReplicateConfig
}

// Fenced tells the driver the catalog reported a newer coordinator term:
// the core wrote nothing more and must be stopped (R9.2).
type Fenced struct{ Err error }

// requestDigest returns the original's request digest (R7.6), nil if it
// has none or its record does not decode.
func (o *Original) requestDigest() []byte {
	if o.Live {
		return o.Request
	}
	r, err := DecodeRecord(rawBytes(o.Record))
	if err != nil {
		return nil
	}
	return r.RequestDigest
}

// This file is the task state machine: every stage a task goes through in
// the engine and every transition between them, in one table. The
// persisted states (PENDING, REPLICATED, TOMBSTONE; R4.1) are coarser: a
// task is PENDING from Persisting to Tombstoning when this cluster created
// it, REPLICATED over the same stages when a secondary took it from
// replicated copies, and TOMBSTONE once Done.
//
// Per copy (one per target vchannel) the engine also keeps whether it is
// appended (with its append result) and whether it is acked (with its
// checkpoint), and whether an ack-once callback runs for it; those two
// facts are independent (a consumer may ack a copy before its append
// returns, R4.5) and are not stages.

// Stage is where a task is in its lifecycle.
type Stage int

// Stages.
const (
	// StageNone: not in the engine (before creation, after Tombstoned or
	// Aborted).
	StageNone Stage = iota
	// Persisting: the PENDING record is being written, or waits to be
	// written again after an ambiguous failure (R4.2).
	Persisting
	// FirstPhase: a two-phase append's first copies are appended and wait
	// for their consumers' acks, which are made durable before the rest
	// are appended (R13.11).
	FirstPhase
	// Appending: the record is durable and copies are being appended
	// (R4.3).
	Appending
	// Acking: every copy is appended and the engine acks them from their
	// append results, running ack-once callbacks (FastAck, R4.4); a force
	// promote waits here for its consumers' acks.
	Acking
	// Collecting: a REPLICATED task collects its consumers' acks; it is not
	// in the callback order before its control-channel copy is acked (R8.2).
	Collecting
	// Promoting: a force promote has every ack and finishes the incomplete
	// tasks, one at a time (R8.3).
	Promoting
	// Queued: in the callback order (R5.4); waits until every copy is acked
	// and no earlier task with a conflicting key is unfinished.
	Queued
	// Calling: an attempt of the ack callback runs (R5.2).
	Calling
	// Backoff: the callback failed; the next attempt waits for its backoff,
	// an operator's retry or completion (R5.6).
	Backoff
	// Tombstoning: the TOMBSTONE with the callback's effects is being
	// written, or waits to be written again (R5.3).
	Tombstoning
	// Tombstoned: the TOMBSTONE is durable; the task is a tombstone now.
	Tombstoned
	// Holding: the TOMBSTONE of a group's Begin is durable and it keeps the
	// group's keys until the group's end (R13.1, R13.7).
	Holding
	// Aborted: the PENDING record was definitely not written; the task was
	// never created.
	Aborted
)

var stageNames = [...]string{"none", "persisting", "first-phase", "appending", "acking", "collecting", "promoting",
	"queued", "calling", "backoff", "tombstoning", "tombstoned", "holding", "aborted"}

func (s Stage) String() string {
	if int(s) < len(stageNames) {
		return stageNames[s]
	}
	return fmt.Sprintf("Stage(%d)", int(s))
}

// Trigger is what moves a task from one stage to another.
type Trigger int

// Triggers.
const (
	OnSubmit Trigger = iota + 1
	OnRecoverPending
	OnRecoverReplicated
	OnReplicatedAck
	OnPersisted
	OnNotCreated
	OnAppended
	OnAcked
	OnControlAcked
	OnSupplement
	OnPromoted
	OnRun
	OnCallbackOK
	OnCallbackFailed
	OnRetry
	OnForce
	OnTombstoned
	OnTombstoneRefused
	OnFirstAcked
	OnGroupEnded
	OnRecoverHolding
)

var triggerNames = map[Trigger]string{
	OnSubmit: "submitted", OnRecoverPending: "recovered PENDING", OnRecoverReplicated: "recovered REPLICATED",
	OnReplicatedAck: "first replicated ack", OnPersisted: "PENDING durable", OnNotCreated: "PENDING not written",
	OnAppended: "every copy appended", OnAcked: "every copy acked", OnControlAcked: "control copy acked",
	OnSupplement: "force promote finishes it", OnPromoted: "incomplete tasks finished", OnRun: "runnable",
	OnCallbackOK: "callback succeeded", OnCallbackFailed: "callback failed", OnRetry: "backoff over / retry now",
	OnForce: "operator completes", OnTombstoned: "TOMBSTONE durable", OnTombstoneRefused: "TOMBSTONE can never fit",
	OnFirstAcked: "first copies acked and durable", OnGroupEnded: "group's end durable", OnRecoverHolding: "recovered holding Begin",
}

func (t Trigger) String() string { return triggerNames[t] }

// transition is one row of the table.
type transition struct {
	from Stage
	on   Trigger
	to   Stage
	// when says which of several rows with the same from and on applies.
	when string
}

// table is the task state machine. The engine moves a task only along a
// row of it (Core.move); any other move is a bug, reported loudly.
var table = []transition{
	{StageNone, OnSubmit, Persisting, ""},
	{StageNone, OnRecoverPending, Appending, ""},
	{StageNone, OnRecoverPending, FirstPhase, "two-phase append, first copies not all acked"},
	{StageNone, OnRecoverHolding, Holding, "an open group's Begin"},
	{StageNone, OnRecoverReplicated, Collecting, "control copy not acked"},
	{StageNone, OnRecoverReplicated, Queued, "control copy acked"},
	{StageNone, OnReplicatedAck, Collecting, "on a secondary, not fenced"},
	{Persisting, OnPersisted, Appending, ""},
	{Persisting, OnPersisted, FirstPhase, "two-phase append"},
	{FirstPhase, OnFirstAcked, Appending, ""},
	{Persisting, OnNotCreated, Aborted, ""},
	{Appending, OnAppended, Acking, "FastAck, or a force promote"},
	{Appending, OnAppended, Queued, "AckSyncUp"},
	{Acking, OnAcked, Queued, ""},
	{Acking, OnAcked, Promoting, "a force promote"},
	{Collecting, OnControlAcked, Queued, ""},
	{Collecting, OnSupplement, Queued, ""},
	{Queued, OnSupplement, Queued, "copies missing"},
	{Promoting, OnPromoted, Queued, ""},
	{Queued, OnRun, Calling, ""},
	{Calling, OnCallbackOK, Tombstoning, ""},
	{Calling, OnCallbackFailed, Backoff, ""},
	{Calling, OnForce, Tombstoning, "the attempt failed after an operator completed it"},
	{Backoff, OnRetry, Calling, ""},
	{Backoff, OnForce, Tombstoning, ""},
	{Tombstoning, OnTombstoned, Tombstoned, ""},
	{Tombstoning, OnTombstoned, Holding, "a group's Begin (whatever its callback reported)"},
	{Holding, OnGroupEnded, Tombstoned, ""},
	{Tombstoning, OnTombstoneRefused, Backoff, "first attempt too large"},
}

// allowed reports whether the table has a row from -> to on trigger.
func allowed(from Stage, on Trigger, to Stage) bool {
	for _, r := range table {
		if r.from == from && r.on == on && r.to == to {
			return true
		}
	}
	return false
}

// TableMarkdown renders the table as docs/design.md shows it.
func TableMarkdown() string {
	var b strings.Builder
	b.WriteString("| from | on | to | when |\n|---|---|---|---|\n")
	for _, r := range table {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", r.from, r.on, r.to, r.when)
	}
	return b.String()
}

// TraceAttrs returns the log attributes naming the trace a message carries
// (R9.6, R9.10): trace_id and span_id from its W3C traceparent
// ("00-<32 hex>-<16 hex>-<2 hex>"), none if it carries none or a malformed
// one. Records about a task carry them, so that its log lines join its
// caller's trace like the records logged with a traced context.
func TraceAttrs(m *message.Message) []any {
	if m == nil {
		return nil
	}
	tp := m.TraceParent
	if len(tp) != 55 || tp[2] != '-' || tp[35] != '-' || tp[52] != '-' || !isHex(tp[3:35]) || !isHex(tp[36:52]) ||
		tp[3:35] == "00000000000000000000000000000000" {
		return nil
	}
	return []any{"trace_id", tp[3:35], "span_id", tp[36:52]}
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// taskLog is log for records about t: with t's trace ids (log itself for
// nil).
func taskLog(log *slog.Logger, t *task) *slog.Logger {
	if t == nil {
		return log
	}
	if attrs := TraceAttrs(t.msg); attrs != nil {
		return log.With(attrs...)
	}
	return log
}
