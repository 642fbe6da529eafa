package engine

import (
	"encoding/hex"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// task is a live broadcast task: PENDING or REPLICATED, from Persisting to
// Tombstoning. Only the core touches it.
type task struct {
	id    uint64
	msg   *message.Message // stamped; never modified
	bytes []byte           // msg encoded; nil until known (a replicated task before its first record)
	// wire is what to append instead of bytes: a force promote appends a
	// replicated task's missing copies without their replicate header.
	wire    []byte
	info    message.TypeInfo
	scope   Scope
	keys    []resource.Key
	control int // index of the control channel among the targets, -1 if none
	created time.Time
	digest  []byte // payload digest (keyed tasks only, R7.6)
	request []byte // the caller's request digest, if any
	class   int    // retention class
	// promote marks a force promote; replicated a task created from
	// replicated copies (REPLICATED).
	promote    bool
	replicated bool

	stage Stage
	lock  *resource.Request // issuance locks; nil if none
	// handle is the handle that created the task (0 for recovered and
	// replicated tasks); its caller waits in waiters too.
	copies []copyState
	nacked int // acked copies; only grows
	// enrolled says the task is in the callback order (sched).
	enrolled bool

	// write is the task's catalog write in flight or waiting to be retried:
	// at most one at a time, so that no REPLICATED record can land after a
	// TOMBSTONE (R5.3).
	write *writeOp
	// writes wait for write to end, in order.
	writes []*writeOp
	// maybePersisted says the PENDING record may be durable (an attempt
	// was applied or ambiguous).
	maybePersisted bool
	// persistedAcks is nacked as of the last durable REPLICATED record;
	// ackWaiters wait for a durable record covering their ack.
	persistedAcks int
	ackWaiters    []ackWaiter
	// tombDue says a TOMBSTONE write waits for the write in flight.
	tombDue bool
	// supplementing says a force promote appends the task's missing
	// copies (and acks them, without AckSyncUp).
	supplementing bool
	// tombAfterAppends says the TOMBSTONE waits until no copy is queued
	// for an append any more: no copy of a task may land after its
	// TOMBSTONE (and GC) took it away (§11.1).
	tombAfterAppends bool
	// recording says a force promote's positions are being written.
	recording bool

	// Callback state (R5.2, R5.6).
	attempts int
	lastErr  string
	lastAt   time.Time
	nextAt   time.Time
	cbBack   *backoff.ExponentialBackOff
	cbTimer  *deadline
	force    *Outcome // set by Complete
	// retrySoon makes the next retry start without waiting (RetryNow
	// while an attempt ran).
	retrySoon bool
	// The TOMBSTONE to write once the callback succeeded: its effects and
	// outcome, and the completion time, fixed by the first attempt so that
	// retries write the same bytes.
	tombOps       []catalog.Op
	outcome       Outcome
	completed     time.Time
	completeWaits []Target

	appendAttempts int
	appendErr      string
	commits        int

	// waiters are answered with the Result when the task is Done.
	waiters []Target
}

// copyState is one copy (target vchannel) of a task.
type copyState struct {
	appended bool
	appendCP wal.Checkpoint
	acked    bool
	ackCP    wal.Checkpoint
	// queued says the copy is in an append queue or batch.
	queued bool
	// ackOnce is the ack-once callback run in flight for this copy (0 if
	// none); ackOnceWaiters wait for it; fast says the engine acks it
	// itself (FastAck), retrying failures.
	ackOnce        uint64
	ackOnceWaiters []Target
	fast           bool
	fastBack       *backoff.ExponentialBackOff
}

type ackWaiter struct {
	to   Target
	want int
}

func newTask(msg *message.Message, bytes []byte, info message.TypeInfo, created time.Time) *task {
	t := &task{
		id: msg.Broadcast.ID, msg: msg, bytes: bytes, info: info,
		scope: ScopeOf(msg.Type, msg.IdempotencyKey), keys: msg.Broadcast.ResourceKeys,
		control: -1, created: created, copies: make([]copyState, len(msg.Broadcast.VChannels)),
	}
	for i, v := range msg.Broadcast.VChannels {
		if v.IsControl() {
			t.control = i
			break
		}
	}
	if t.scope != (Scope{}) {
		// Only a keyed task is compared with retries (R7.6).
		t.digest = PayloadDigest(msg.Payload)
	}
	if d := msg.Properties[RequestDigestProperty]; d != "" {
		// Set by the broadcaster that created the task, here or on a
		// primary this secondary replicates (R7.6, R8.4).
		t.request, _ = hex.DecodeString(d)
	}
	t.promote = msg.Type == AlterReplicateConfig && msg.Properties[UnreplicableProperty] == ForcePromoteMark
	return t
}

func (t *task) allAcked() bool { return t.nacked == len(t.copies) }

// anyQueued reports whether a copy is in an append queue or batch.
func (t *task) anyQueued() bool {
	for i := range t.copies {
		if t.copies[i].queued {
			return true
		}
	}
	return false
}

// allAppended reports whether every copy is in the WAL: appended by this
// core, or acked with a checkpoint (recovered).
func (t *task) allAppended() bool {
	for i := range t.copies {
		cp := &t.copies[i]
		if !cp.appended && !(cp.acked && cp.ackCP != (wal.Checkpoint{})) {
			return false
		}
	}
	return true
}

// state is the task's persisted state.
func (t *task) state() State {
	if t.replicated {
		return Replicated
	}
	return Pending
}

// results returns where each acked copy landed.
func (t *task) results() map[message.VChannel]wal.Checkpoint {
	out := make(map[message.VChannel]wal.Checkpoint, len(t.copies))
	for i, v := range t.msg.Broadcast.VChannels {
		if t.copies[i].acked {
			out[v] = t.copies[i].ackCP
		}
	}
	return out
}

// controlTick is the control channel copy's time tick, 0 if not acked.
func (t *task) controlTick() uint64 {
	if t.control < 0 || !t.copies[t.control].acked {
		return 0
	}
	return t.copies[t.control].ackCP.TimeTick
}

// record returns the spec of t's record in state st.
func (t *task) record(st State) *RecordSpec {
	s := &RecordSpec{ID: t.id, State: st, Message: t.bytes, Msg: t.msg, Created: t.created,
		PayloadDigest: t.digest, RequestDigest: t.request}
	if st == Pending && !t.promote {
		// A PENDING record has no checkpoints: a crash before the TOMBSTONE
		// appends the copies again (consumers deduplicate). A force
		// promote's records hold its acks (see promote.go).
		return s
	}
	s.Acked = make([]bool, len(t.copies))
	s.Checkpoints = make([]wal.Checkpoint, len(t.copies))
	for i := range t.copies {
		s.Acked[i] = t.copies[i].acked
		s.Checkpoints[i] = t.copies[i].ackCP
	}
	return s
}

func compareTicks(a, b uint64, ida, idb uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	case ida < idb:
		return -1
	case ida > idb:
		return 1
	}
	return 0
}
