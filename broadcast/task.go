package broadcast

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/internal/durablepb"
	"github.com/walcast/walcast/internal/tracing"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// State is a task's persisted state (R4.1).
type State int

const (
	// Pending tasks were created by this cluster's broadcasts: persisted,
	// being appended, acked, called back.
	Pending State = 1
	// Replicated tasks were created on a secondary from replicated copies.
	Replicated State = 2
	// Tombstone tasks are finished and kept for deduplication until GC.
	Tombstone State = 3
)

// String returns the state's name as records and the admin API show it:
// "PENDING", "REPLICATED", "TOMBSTONE" ("UNKNOWN" otherwise).
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

// ParseState reads a state name as String writes it.
func ParseState(s string) (State, error) {
	for _, st := range []State{Pending, Replicated, Tombstone} {
		if st.String() == s {
			return st, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown task state %q", ErrInvalidArgument, s)
}

// task is a live (PENDING or REPLICATED) broadcast task.
//
// Fields above ackMu are fixed once the task is registered. Lock order:
// Broadcaster.mu before task.mu; scheduler.mu before task.mu; task.ackMu
// before task.mu; task.persistMu before idAllocator.mu before task.mu.
// task.mu is never held while calling the catalog, the WAL or a callback;
// ackMu is held across the ack-once callback, persistMu across the catalog
// commits of a REPLICATED task (its acks and its TOMBSTONE).
type task struct {
	id       uint64
	msg      *message.Message // stamped, immutable
	msgBytes []byte
	info     message.TypeInfo
	scope    scope
	keys     []resource.Key
	control  int // index of the control channel in msg's targets, -1 if none
	created  time.Time
	digest   []byte // payloadDigest of the payload; keyed tasks only
	request  []byte // the caller's request digest, if any
	// trace is the trace context persisted in msg, the parent of the
	// task's spans; invalid if msg carries none (R9.6).
	trace trace.SpanContext
	done  chan struct{}
	// ackedAll is closed once every copy is acked.
	ackedAll chan struct{}
	// promote marks a force-promote task (see ForcePromote).
	promote bool

	// ackMu serialises acks of this task, so an ack-once callback runs once
	// per copy.
	ackMu sync.Mutex
	// persistMu serialises the catalog writes of a REPLICATED task: its
	// acks (concurrent ackers ride on one commit) and its TOMBSTONE, so that
	// no REPLICATED record can land after the TOMBSTONE.
	persistMu sync.Mutex

	mu            sync.Mutex
	state         State
	guard         *resource.Guard // issuance locks, nil if none held
	appended      []bool
	appendCP      []wal.Checkpoint
	acked         []bool
	ackCP         []wal.Checkpoint
	nacked        int // acked copies; only grows
	persistedAcks int // nacked covered by the last persisted REPLICATED record
	// tombstoning is set, for a REPLICATED task, from when commitTombstone
	// starts until it ends (closed then); tomb says what it left: no REPLICATED
	// record may be written once a TOMBSTONE may have been.
	tombstoning    chan struct{}
	tomb           tombWrite
	enrolled       bool
	wire           []byte // what to append, if not msgBytes (a promote's supplement)
	toAppend       int
	appendDone     chan struct{} // closed when toAppend reaches 0
	appendSpan     trace.Span    // span of the appends in flight, records failures
	appendAttempts int
	appendErr      string
	cb             callbackState
	outcome        Outcome
	completed      time.Time
	commits        int   // catalog commits made for this task
	err            error // why the task ended without completing (not created)
}

// tombWrite is what a task's TOMBSTONE commit left in the catalog.
type tombWrite int

const (
	tombNone    tombWrite = iota // no attempt applied (yet)
	tombInDoubt                  // an attempt may have applied; the broadcaster stopped
	tombDurable                  // committed
)

type callbackState struct {
	running  bool
	attempts int
	lastErr  string
	lastAt   time.Time
	nextAt   time.Time
	retry    chan struct{} // signalled to retry now
	force    *Outcome      // set by CompleteCallback
	cancel   func()        // cancels the running attempt
}

func newTask(msg *message.Message, msgBytes []byte, info message.TypeInfo, state State, created time.Time) *task {
	n := len(msg.Broadcast.VChannels)
	t := &task{
		id: msg.Broadcast.ID, msg: msg, msgBytes: msgBytes, info: info,
		scope: scopeOf(msg.Type, msg.IdempotencyKey), keys: msg.Broadcast.ResourceKeys,
		control: -1, created: created, trace: tracing.SpanContext(msg), done: make(chan struct{}), ackedAll: make(chan struct{}),
		state: state, appended: make([]bool, n), appendCP: make([]wal.Checkpoint, n),
		acked: make([]bool, n), ackCP: make([]wal.Checkpoint, n),
	}
	for i, v := range msg.Broadcast.VChannels {
		if v.IsControl() {
			t.control = i
			break
		}
	}
	if t.scope != (scope{}) {
		// Only a keyed task is compared with retries (R7.6).
		t.digest = payloadDigest(msg.Payload)
	}
	if d := msg.Properties[requestDigestProperty]; d != "" {
		// Set by the broadcaster that created the task, here or on a
		// primary this secondary replicates (R7.6, R8.4).
		t.request, _ = hex.DecodeString(d)
	}
	t.promote = msg.Type == AlterReplicateConfig && msg.Properties[unreplicableProperty] == forcePromoteMark
	return t
}

// allAcked reports whether every copy is acked. Caller holds t.mu.
func (t *task) allAcked() bool { return t.nacked == len(t.acked) }

// unappended groups by pchannel the indices of copies not appended by this
// broadcaster and not acked with a checkpoint, and counts them. A copy acked
// without one (after a restart, before its re-append) is appended again:
// its append result becomes its checkpoint.
func (t *task) unappended() (map[message.PChannel][]int, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	groups := make(map[message.PChannel][]int)
	n := 0
	for i, v := range t.msg.Broadcast.VChannels {
		if !t.appended[i] && (!t.acked[i] || t.ackCP[i] == (wal.Checkpoint{})) {
			groups[v.PChannel()] = append(groups[v.PChannel()], i)
			n++
		}
	}
	return groups, n
}

// expectAppends arms the channel closed once n submitted copies are
// appended; span records the failed rounds until then.
func (t *task) expectAppends(n int, span trace.Span) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.toAppend = n
	t.appendDone = make(chan struct{})
	t.appendSpan = span
	return t.appendDone
}

// onAppended records the append results of copies idx. A copy acked before
// its append returned, without a checkpoint, gets its append result as one.
func (t *task) onAppended(idx []int, cps []wal.Checkpoint) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for j, i := range idx {
		if t.appended[i] {
			continue
		}
		t.appended[i] = true
		t.appendCP[i] = cps[j]
		if t.acked[i] && t.ackCP[i] == (wal.Checkpoint{}) {
			t.ackCP[i] = cps[j]
		}
		t.toAppend--
	}
	if t.toAppend == 0 && t.appendDone != nil {
		close(t.appendDone)
		t.appendDone = nil
	}
}

func (t *task) onAppendFailed(p message.PChannel, err error) {
	t.mu.Lock()
	t.appendAttempts++
	t.appendErr = err.Error()
	span := t.appendSpan
	t.mu.Unlock()
	if span != nil && span.IsRecording() {
		recordRetry(span, err, trace.WithAttributes(tracing.AttrPChannel.String(string(p))))
	}
}

// results returns where each acked copy landed. Caller holds t.mu.
func (t *task) results() map[message.VChannel]wal.Checkpoint {
	out := make(map[message.VChannel]wal.Checkpoint, len(t.acked))
	for i, v := range t.msg.Broadcast.VChannels {
		if t.acked[i] {
			out[v] = t.ackCP[i]
		}
	}
	return out
}

// controlTick is the control channel copy's time tick, 0 if not acked.
// Caller holds t.mu.
func (t *task) controlTick() uint64 {
	if t.control < 0 || !t.acked[t.control] {
		return 0
	}
	return t.ackCP[t.control].TimeTick
}

func taskKey(prefix string, id uint64) string {
	// Zero-padded so that listing returns tasks in id order.
	return prefix + "tasks/" + fmt.Sprintf("%020d", id)
}

func parseTaskKey(prefix, key string) (uint64, bool) {
	s := key[len(prefix)+len("tasks/"):]
	id, err := strconv.ParseUint(s, 10, 64)
	return id, err == nil && id != 0
}

// record encodes the task as its catalog record in state st. Caller holds
// t.mu. A PENDING record has no checkpoints; REPLICATED and TOMBSTONE
// records have one per target, empty (not acked) for copies not acked.
func (t *task) record(st State, completed time.Time, out Outcome) ([]byte, error) {
	pb := &durablepb.Task{
		Message:         t.msgBytes,
		State:           stateToPB(st),
		CreatedUnixNano: t.created.UnixNano(),
		PayloadDigest:   t.digest,
		RequestDigest:   t.request,
	}
	if !completed.IsZero() {
		pb.CompletedUnixNano = completed.UnixNano()
	}
	if st == Tombstone || st == Replicated {
		pb.Checkpoints = make([]*durablepb.Checkpoint, len(t.acked))
		for i := range t.acked {
			cp := &durablepb.Checkpoint{}
			if t.acked[i] {
				c := t.ackCP[i]
				cp = checkpointPB(c)
			}
			pb.Checkpoints[i] = cp
		}
	}
	if st == Tombstone {
		pb.Outcome = &durablepb.Outcome{Status: durablepb.OutcomeStatus(out.Status), Detail: out.Detail, Data: out.Data}
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(pb)
}

func stateToPB(s State) durablepb.TaskState {
	switch s {
	case Pending:
		return durablepb.TaskState_TASK_STATE_PENDING
	case Replicated:
		return durablepb.TaskState_TASK_STATE_REPLICATED
	case Tombstone:
		return durablepb.TaskState_TASK_STATE_TOMBSTONE
	}
	return durablepb.TaskState_TASK_STATE_UNSPECIFIED
}

func stateFromPB(s durablepb.TaskState) State {
	switch s {
	case durablepb.TaskState_TASK_STATE_PENDING:
		return Pending
	case durablepb.TaskState_TASK_STATE_REPLICATED:
		return Replicated
	case durablepb.TaskState_TASK_STATE_TOMBSTONE:
		return Tombstone
	}
	return 0
}

// decoded is a task record read back from the catalog.
type decoded struct {
	pb  *durablepb.Task
	msg *message.Message
}

func decodeRecord(raw []byte) (decoded, error) {
	var pb durablepb.Task
	if err := proto.Unmarshal(raw, &pb); err != nil {
		return decoded{}, err
	}
	m, err := message.Unmarshal(pb.Message)
	if err != nil {
		return decoded{}, err
	}
	if m.Broadcast.ID == 0 || len(m.Broadcast.VChannels) == 0 {
		return decoded{}, fmt.Errorf("record has no broadcast id or targets")
	}
	if n := len(pb.Checkpoints); n != 0 && n != len(m.Broadcast.VChannels) {
		return decoded{}, fmt.Errorf("record has %d checkpoints for %d vchannels", n, len(m.Broadcast.VChannels))
	}
	if stateFromPB(pb.State) == 0 {
		return decoded{}, fmt.Errorf("record has unknown state %v", pb.State)
	}
	return decoded{pb: &pb, msg: m}, nil
}

func (d decoded) checkpoints() map[message.VChannel]wal.Checkpoint {
	out := make(map[message.VChannel]wal.Checkpoint, len(d.pb.Checkpoints))
	for i, c := range d.pb.Checkpoints {
		if c.Acked {
			out[d.msg.Broadcast.VChannels[i]] = checkpointOf(c)
		}
	}
	return out
}

// created is the task's persisted creation time.
func (d decoded) created() time.Time { return time.Unix(0, d.pb.CreatedUnixNano) }

func (d decoded) outcome() Outcome {
	if d.pb.Outcome == nil {
		return Outcome{}
	}
	return Outcome{Status: OutcomeStatus(d.pb.Outcome.Status), Detail: d.pb.Outcome.Detail, Data: d.pb.Outcome.Data}
}

// checkpointPB encodes an acked checkpoint. The WAL's positions make time
// tick and last-confirmed id equal to the message id; those are left out
// (0) to keep tombstones small, and checkpointOf restores them. No acked
// copy has a zero time tick, so the encoding is unambiguous.
func checkpointPB(c wal.Checkpoint) *durablepb.Checkpoint {
	pb := &durablepb.Checkpoint{Acked: true, MessageId: c.MessageID, TimeTick: c.TimeTick, LastConfirmed: c.LastConfirmed}
	if pb.TimeTick == pb.MessageId {
		pb.TimeTick = 0
	}
	if pb.LastConfirmed == pb.MessageId {
		pb.LastConfirmed = 0
	}
	return pb
}

func checkpointOf(pb *durablepb.Checkpoint) wal.Checkpoint {
	c := wal.Checkpoint{MessageID: pb.MessageId, TimeTick: pb.TimeTick, LastConfirmed: pb.LastConfirmed}
	if c.TimeTick == 0 {
		c.TimeTick = c.MessageID
	}
	if c.LastConfirmed == 0 {
		c.LastConfirmed = c.MessageID
	}
	return c
}
