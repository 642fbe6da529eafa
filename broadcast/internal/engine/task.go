package engine

import (
	"encoding/hex"
	"strconv"
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
	// enrolled says the task is in the callback order (sched); claims
	// are its places there, one per key.
	enrolled bool
	claims   []claim

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
	// supplementRest says a force promote appends the rest of a two-phase
	// task's missing copies once its first copies are acked.
	supplementRest bool
	// tombAfterAppends says the TOMBSTONE waits until no copy is queued
	// for an append any more: no copy of a task may land after its
	// TOMBSTONE (and GC) took it away (§11.1).
	tombAfterAppends bool
	// recording says a force promote's positions are being written.
	recording bool

	// group is the group t belongs to (nil if none): gkind its part, gseq
	// its place (R13.1, R13.7).
	group *group
	gkind message.GroupKind
	gseq  uint32
	// ignore, if set, completes t with this outcome without running its
	// callback: a group member a force promote cannot order (R13.5).
	ignore *Outcome
	// firstDone says the two-phase append's first copies are acked and
	// durable (R13.11); ackWaits wait for named copies' acks.
	firstDone bool
	ackWaits  []ackWait

	// Callback state (R5.2, R5.6).
	attempts int
	lastErr  string
	lastAt   time.Time
	nextAt   time.Time
	history  []Attempt // the latest MaxAttemptHistory attempts
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
	given         map[message.VChannel]wal.Checkpoint // see results
	key           string                              // TaskKey, once a record was written: see RecordSpec.Key
	completed     time.Time
	completeWaits []Target
	// lockAsked and lockGranted bound the wait for the issuance locks,
	// persisted is when the PENDING record was durable (unix nanoseconds,
	// 0 if not seen here): the timeline (R9.9).
	lockAsked, lockGranted, persisted int64

	appendAttempts int
	appendErr      string
	commits        int

	// waiters are answered with the Result when the task is Done.
	waiters []Target
	// Room for the first waiter and the first callback attempt, which
	// nearly every task has.
	waiterBuf  [1]Target
	historyBuf [1]Attempt
	// claimBuf holds the claims of a task of up to two resource keys.
	claimBuf [2]claim
}

// LockOwner labels the task's lock request ("broadcast 42"), when the
// lock table describes it.
func (t *task) LockOwner() string { return "broadcast " + strconv.FormatUint(t.id, 10) }

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
	// extra is what the consumer returned with its ack (R13.12).
	extra []byte
	// appendedAt and ackedAt are when the append returned and the ack
	// came (unix nanoseconds, 0 if not seen here): the timeline (R9.9).
	appendedAt, ackedAt int64
}

// ackWait is a WaitAcked request: the copies it waits for.
type ackWait struct {
	to  Target
	idx []int
}

// smallTask is a task of up to eight copies with its copies.
type smallTask struct {
	task   task
	copies [8]copyState
}

type ackWaiter struct {
	to   Target
	want int
}

func newTask(msg *message.Message, bytes []byte, info message.TypeInfo, created time.Time) *task {
	var t *task
	if n := len(msg.Broadcast.VChannels); n <= len(smallTask{}.copies) {
		// The usual broadcast's task and copies: one allocation.
		b := new(smallTask)
		t, b.task.copies = &b.task, b.copies[:n:n]
	} else {
		t = &task{copies: make([]copyState, n)}
	}
	t.id, t.msg, t.bytes, t.info = msg.Broadcast.ID, msg, bytes, info
	t.scope, t.keys = ScopeOf(msg.Type, msg.IdempotencyKey), msg.Broadcast.ResourceKeys
	t.control, t.created = -1, created
	t.waiters, t.history = t.waiterBuf[:0], t.historyBuf[:0]
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
	if g := msg.Group; g != nil {
		t.gkind, t.gseq = g.Kind, g.Seq
	}
	if d := msg.Properties[RequestDigestProperty]; d != "" {
		// Set by the broadcaster that created the task, here or on a
		// primary this secondary replicates (R7.6, R8.4).
		t.request, _ = hex.DecodeString(d)
	}
	t.promote = msg.Type == AlterReplicateConfig && msg.Properties[UnreplicableProperty] == ForcePromoteMark
	return t
}

// local reports whether t is a local-only broadcast (R13.13): marked so,
// or of an unreplicable type.
func (t *task) local() bool {
	return t.msg.Properties[UnreplicableProperty] == LocalMark || t.info.Unreplicable
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

// results returns where each acked copy landed. The map it returned last
// (to the callback) is returned again while it still says that: the
// callback's event and the Result share it, and neither may modify it.
func (t *task) results() map[message.VChannel]wal.Checkpoint {
	if m := t.given; m != nil && t.still(m) {
		return m
	}
	out := make(map[message.VChannel]wal.Checkpoint, len(t.copies))
	for i, v := range t.msg.Broadcast.VChannels {
		if t.copies[i].acked {
			out[v] = t.copies[i].ackCP
		}
	}
	t.given = out
	return out
}

// still reports whether m holds exactly the acked copies' checkpoints.
func (t *task) still(m map[message.VChannel]wal.Checkpoint) bool {
	n := 0
	for i, v := range t.msg.Broadcast.VChannels {
		if t.copies[i].acked {
			n++
			if cp, ok := m[v]; !ok || cp != t.copies[i].ackCP {
				return false
			}
		}
	}
	return n == len(m)
}

// extras returns what consumers returned with their acks, nil if none did.
func (t *task) extras() map[message.VChannel][]byte {
	var out map[message.VChannel][]byte
	for i, v := range t.msg.Broadcast.VChannels {
		if x := t.copies[i].extra; x != nil {
			if out == nil {
				out = make(map[message.VChannel][]byte)
			}
			out[v] = x
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

// recordWrite is the write of one task record: the write, the record's
// spec and, for a task of up to eight copies, its acks, checkpoints and
// outcome, in one allocation.
type recordWrite struct {
	w       writeOp
	spec    RecordSpec
	outcome Outcome
	acked   [8]bool
	cps     [8]wal.Checkpoint
}

// record returns the write of t's record in state st (its spec in spec).
func (t *task) record(st State) *recordWrite {
	rw := &recordWrite{}
	rw.w.rec = &rw.spec
	s := &rw.spec
	*s = RecordSpec{ID: t.id, State: st, Message: t.bytes, Msg: t.msg, Created: t.created,
		PayloadDigest: t.digest, RequestDigest: t.request}
	if st == Pending && !t.promote && len(t.msg.Broadcast.AppendFirst) == 0 && !t.msg.Broadcast.AckSyncUp {
		// A PENDING record has no checkpoints: a crash before the TOMBSTONE
		// appends the copies again (consumers deduplicate). A force
		// promote's records hold its acks (see promote.go), a two-phase
		// append's its first copies' (phases.go), an AckSyncUp task's its
		// consumers' acks (durableAcks).
		return rw
	}
	if n := len(t.copies); n <= len(rw.cps) {
		s.Acked, s.Checkpoints = rw.acked[:n:n], rw.cps[:n:n]
	} else {
		s.Acked, s.Checkpoints = make([]bool, n), make([]wal.Checkpoint, n)
	}
	for i := range t.copies {
		s.Acked[i] = t.copies[i].acked
		s.Checkpoints[i] = t.copies[i].ackCP
		if x := t.copies[i].extra; x != nil && t.copies[i].acked {
			if s.Extras == nil {
				s.Extras = make([][]byte, len(t.copies))
			}
			s.Extras[i] = x
		}
	}
	return rw
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
