package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

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
	Appends map[message.VChannel]wal.Checkpoint
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
	Results map[message.VChannel]wal.Checkpoint
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
