package engine

import (
	"context"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
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
