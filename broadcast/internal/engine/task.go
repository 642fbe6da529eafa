package engine

import (
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/durablepb"
	"github.com/walcast/walcast/internal/wire"
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
	given         wal.Landings // see results
	key           string       // TaskKey, once a record was written: see RecordSpec.Key
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

// results returns where each acked copy landed. The landings it returned
// last (to the callback) are returned again while they still say that: the
// callback's event and the Result share them, and neither may modify them.
func (t *task) results() wal.Landings {
	if ls := t.given; ls != nil && t.still(ls) {
		return ls
	}
	out := make(wal.Landings, 0, len(t.copies))
	for i, v := range t.msg.Broadcast.VChannels {
		if t.copies[i].acked {
			out = append(out, wal.Landing{VChannel: v, Checkpoint: t.copies[i].ackCP})
		}
	}
	t.given = out
	return out
}

// still reports whether ls holds exactly the acked copies' checkpoints.
func (t *task) still(ls wal.Landings) bool {
	n := 0
	for i, v := range t.msg.Broadcast.VChannels {
		if t.copies[i].acked {
			if n >= len(ls) || ls[n].VChannel != v || ls[n].Checkpoint != t.copies[i].ackCP {
				return false
			}
			n++
		}
	}
	return n == len(ls)
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
		// append's its first copies' (acks.go), an AckSyncUp task's its
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

// MaxTimelines bounds how many finished tasks keep their timeline in
// memory (RecentTimeline): the latest to finish here. A tombstone's record
// keeps only its creation and completion times.
const MaxTimelines = 1024

// Timeline is when a task went through each step of its life, as this
// core saw it (the console draws it, R9.9). A zero time is a step not
// seen: not reached yet, not taken (a broadcast without resource keys
// waits for no lock), or taken before this core recovered the task.
type Timeline struct {
	// LockAsked and LockGranted bound the wait for the issuance locks.
	LockAsked, LockGranted time.Time
	// Created is when the task got its id; Persisted when its PENDING
	// record was durable.
	Created, Persisted time.Time
	// Appended and Acked are, per target in header order, when the copy's
	// append returned and when its ack came.
	Appended, Acked []time.Time
	// Attempts are the latest callback attempts (at most
	// MaxAttemptHistory), oldest first.
	Attempts []Attempt
	// Tombstoned is when the TOMBSTONE was durable.
	Tombstoned time.Time
}

// timelines keeps the timelines of the tasks that finished last, at most
// MaxTimelines: ring holds them by value in finishing order (no allocation
// per task once it is full), byID where each is, next is where the next
// one goes (the oldest, once the ring is full).
type timelines struct {
	byID map[uint64]int
	ring []keptTimeline
	next int
}

// keptTimeline is a timeline in the ring, with its task's id; its slices
// use the slot's own arrays when they fit, so that keeping a finished
// task's timeline allocates nothing (B10).
type keptTimeline struct {
	id       uint64
	tl       Timeline
	attempts [1]Attempt
	times    [16]time.Time
}

// keepTask remembers the timeline of t, which finished at now, forgetting
// the oldest past MaxTimelines.
func (ts *timelines) keepTask(t *task, now time.Time) {
	slot := ts.slot(t.id)
	slot.tl = Timeline{LockAsked: unixTime(t.lockAsked), LockGranted: unixTime(t.lockGranted), Created: t.created,
		Persisted: unixTime(t.persisted), Tombstoned: now}
	if len(t.history) <= len(slot.attempts) {
		slot.tl.Attempts = slot.attempts[:copy(slot.attempts[:], t.history)]
	} else {
		slot.tl.Attempts = slices.Clone(t.history)
	}
	n := len(t.copies)
	times := slot.times[:]
	if 2*n > len(times) {
		times = make([]time.Time, 2*n)
	}
	slot.tl.Appended, slot.tl.Acked = times[:n:n], times[n:2*n:2*n]
	for i, cp := range t.copies {
		slot.tl.Appended[i], slot.tl.Acked[i] = unixTime(cp.appendedAt), unixTime(cp.ackedAt)
	}
}

// keep remembers id's timeline, forgetting the oldest past MaxTimelines.
func (ts *timelines) keep(id uint64, tl Timeline) {
	ts.slot(id).tl = tl
}

// slot returns the ring's slot for id, emptied: a new one, or the oldest's
// once the ring is full.
func (ts *timelines) slot(id uint64) *keptTimeline {
	if ts.byID == nil {
		ts.byID = make(map[uint64]int)
	}
	i := len(ts.ring)
	if i < MaxTimelines {
		ts.ring = append(ts.ring, keptTimeline{id: id})
	} else {
		i = ts.next
		delete(ts.byID, ts.ring[i].id)
		ts.ring[i].id = id
		ts.next = (ts.next + 1) % MaxTimelines
	}
	ts.byID[id] = i
	return &ts.ring[i]
}

// get returns a copy of id's kept timeline, which shares nothing with the
// ring (a slot is reused once MaxTimelines newer tasks finished).
func (ts *timelines) get(id uint64) (Timeline, bool) {
	i, ok := ts.byID[id]
	if !ok {
		return Timeline{}, false
	}
	tl := ts.ring[i].tl
	tl.Attempts = slices.Clone(tl.Attempts)
	tl.Appended, tl.Acked = slices.Clone(tl.Appended), slices.Clone(tl.Acked)
	return tl, true
}

// unixTime is the time of unix nanoseconds n, zero for 0.
func unixTime(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// timeline returns t's timeline so far.
func (t *task) timeline() Timeline {
	tl := Timeline{LockAsked: unixTime(t.lockAsked), LockGranted: unixTime(t.lockGranted), Created: t.created,
		Persisted: unixTime(t.persisted), Attempts: slices.Clone(t.history)}
	// One array for both: a finished task's timeline is kept (MaxTimelines).
	times := make([]time.Time, 2*len(t.copies))
	tl.Appended, tl.Acked = times[:len(t.copies):len(t.copies)], times[len(t.copies):]
	for i, cp := range t.copies {
		tl.Appended[i], tl.Acked[i] = unixTime(cp.appendedAt), unixTime(cp.ackedAt)
	}
	return tl
}

// RecordSpec is a task record to encode (EncodeRecord) and put under the
// task's key. The core builds specs and its driver encodes them, so the core
// spends no time on encoding: the broadcaster's on a commits worker, or on
// its loop when it hands the write to an asynchronous catalog (about 1% of
// a CPU at 10,000 broadcasts/s, a tenth of the loop's time); the simulator
// when it performs the write.
type RecordSpec struct {
	ID uint64
	// Key is the record's catalog key, TaskKey(prefix, ID): the core builds
	// it once per task, for all its records.
	Key   string
	State State
	// Message is the encoded message; if nil, Msg is encoded (a replicated
	// task's first record) and Written reports the bytes.
	Message []byte
	Msg     *message.Message
	Created time.Time
	// Completed is set for a TOMBSTONE.
	Completed     time.Time
	PayloadDigest []byte
	RequestDigest []byte
	// Acked and Checkpoints are per target; nil for a PENDING record, which
	// has no checkpoints.
	Acked       []bool
	Checkpoints []wal.Checkpoint
	// Outcome is set for a TOMBSTONE.
	Outcome *Outcome
	// Extras are per target what its consumer returned with its ack (nil:
	// nothing); only with Acked.
	Extras [][]byte
	// HoldsKeys marks a group's Begin whose TOMBSTONE keeps its keys
	// (R13.1, R13.7).
	HoldsKeys bool
}

// EncodeRecord encodes a record deterministically (the same spec gives the
// same bytes, so a retried write writes the same bytes). It returns the
// record and the message bytes it holds.
func EncodeRecord(s *RecordSpec) (record, msg []byte, err error) {
	msg = s.Message
	if msg == nil {
		if msg, err = message.Marshal(s.Msg); err != nil {
			return nil, nil, fmt.Errorf("encode broadcast %d: %w", s.ID, err)
		}
	}
	return encodeTask(s, msg), msg, nil
}

// Record is a decoded task record.
type Record struct {
	State         State
	Msg           *message.Message
	Message       []byte // the encoded message
	Created       time.Time
	Completed     time.Time // zero unless TOMBSTONE
	PayloadDigest []byte
	RequestDigest []byte
	// Acked and Checkpoints are per target; all false for a PENDING record.
	Acked       []bool
	Checkpoints []wal.Checkpoint
	// Extras are per target what its consumer returned with its ack.
	Extras  [][]byte
	Outcome Outcome
	// HoldsKeys marks a group's Begin that kept its keys past its
	// TOMBSTONE; Released is when its group's end released them (zero:
	// still held), ReleasedBy the end's broadcast id.
	HoldsKeys  bool
	Released   time.Time
	ReleasedBy uint64
}

// Holding reports whether the record is a group's Begin that still holds
// its group's keys.
func (r *Record) Holding() bool {
	return r.State == Tombstone && r.HoldsKeys && r.Released.IsZero()
}

// DecodeRecord decodes a task record.
func DecodeRecord(raw []byte) (*Record, error) {
	var pb taskFields
	if err := decodeTask(raw, &pb); err != nil {
		return nil, err
	}
	m, err := message.Unmarshal(pb.message)
	if err != nil {
		return nil, err
	}
	n := len(m.Broadcast.VChannels)
	if m.Broadcast.ID == 0 || n == 0 {
		return nil, fmt.Errorf("record has no broadcast id or targets")
	}
	if c := len(pb.checkpoints); c != 0 && c != n {
		return nil, fmt.Errorf("record has %d checkpoints for %d vchannels", c, n)
	}
	st := stateFromPB(durablepb.TaskState(pb.state))
	if st == 0 {
		return nil, fmt.Errorf("record has unknown state %v", durablepb.TaskState(pb.state))
	}
	r := &Record{State: st, Msg: m, Message: pb.message, Created: time.Unix(0, pb.created),
		PayloadDigest: pb.payloadDigest, RequestDigest: pb.requestDigest,
		Acked: make([]bool, n), Checkpoints: make([]wal.Checkpoint, n)}
	if pb.completed != 0 {
		r.Completed = time.Unix(0, pb.completed)
	}
	for i, c := range pb.checkpoints {
		if c.acked {
			r.Acked[i] = true
			r.Checkpoints[i] = checkpointOf(c.messageID, c.timeTick, c.lastConfirmed)
			if c.extra != nil {
				if r.Extras == nil {
					r.Extras = make([][]byte, n)
				}
				r.Extras[i] = c.extra
			}
		}
	}
	r.HoldsKeys = pb.holdsKeys
	if pb.released != 0 {
		r.Released = time.Unix(0, pb.released)
	}
	r.ReleasedBy = pb.releasedBy
	r.Outcome = Outcome{Status: OutcomeStatus(pb.outcome.status), Detail: pb.outcome.detail, Data: pb.outcome.data}
	return r, nil
}

// releasedRecord returns a holding Begin's record with its keys released at
// at by broadcast by: the fields are appended to the encoded record (a
// protobuf field appended overrides), so the end's TOMBSTONE transaction
// rewrites the Begin without decoding or encoding it again, and the same
// inputs give the same bytes.
func releasedRecord(raw []byte, at time.Time, by uint64) []byte {
	out := make([]byte, 0, len(raw)+24)
	out = append(out, raw...)
	out = protowire.AppendTag(out, releasedField, protowire.VarintType)
	out = protowire.AppendVarint(out, uint64(at.UnixNano()))
	out = protowire.AppendTag(out, releasedByField, protowire.VarintType)
	return protowire.AppendVarint(out, by)
}

// Field numbers of the durable Task (proto/walcast/durable/v1/durable.proto).
const (
	releasedField   protowire.Number = 10
	releasedByField protowire.Number = 11
)

// Results returns where each acked copy of the record landed.
func (r *Record) Results() wal.Landings {
	out := make(wal.Landings, 0, len(r.Acked))
	for i, v := range r.Msg.Broadcast.VChannels {
		if r.Acked[i] {
			out = append(out, wal.Landing{VChannel: v, Checkpoint: r.Checkpoints[i]})
		}
	}
	return out
}

// ExtrasByVChannel returns what consumers returned with their acks, by
// vchannel; nil if none did.
func (r *Record) ExtrasByVChannel() map[message.VChannel][]byte {
	var out map[message.VChannel][]byte
	for i, x := range r.Extras {
		if x != nil {
			if out == nil {
				out = make(map[message.VChannel][]byte)
			}
			out[r.Msg.Broadcast.VChannels[i]] = x
		}
	}
	return out
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

// checkpointOf restores what checkpointFieldsOf left out.
func checkpointOf(messageID, timeTick, lastConfirmed uint64) wal.Checkpoint {
	c := wal.Checkpoint{MessageID: messageID, TimeTick: timeTick, LastConfirmed: lastConfirmed}
	if c.TimeTick == 0 {
		c.TimeTick = c.MessageID
	}
	if c.LastConfirmed == 0 {
		c.LastConfirmed = c.MessageID
	}
	return c
}

// Catalog keys, under the core's prefix.

// TaskKey is the key of task id's record; ids are zero-padded so that a
// listing returns tasks in id order.
func TaskKey(prefix string, id uint64) string {
	var digits [20]byte
	d := strconv.AppendUint(digits[:0], id, 10)
	var buf [96]byte
	k := append(append(buf[:0], prefix...), "tasks/"...)
	for range 20 - len(d) {
		k = append(k, '0')
	}
	return string(append(k, d...))
}

// TasksPrefix is the prefix of every task record.
func TasksPrefix(prefix string) string { return prefix + "tasks/" }

// ParseTaskKey returns the id of a key under TasksPrefix.
func ParseTaskKey(prefix, key string) (uint64, bool) {
	s := key[len(TasksPrefix(prefix)):]
	id, err := strconv.ParseUint(s, 10, 64)
	return id, err == nil && id != 0
}

// IDsKey holds the end of the reserved broadcast id block (the id floor).
func IDsKey(prefix string) string { return prefix + "ids/broadcast" }

// ReplicateKey holds the replication topology.
func ReplicateKey(prefix string) string { return prefix + "replicate" }

// PromotePrefix holds, per force promote, where its copies landed.
func PromotePrefix(prefix string) string { return prefix + "promote/" }

// PromoteKey is the key of force promote id's positions.
func PromoteKey(prefix string, id uint64) string {
	return PromotePrefix(prefix) + strconv.FormatUint(id, 10)
}

// CollectedKey holds the set of replicated broadcast ids whose tombstones
// GC deleted (an idset encoding).
func CollectedKey(prefix string) string { return prefix + "replicated/collected" }

// Field numbers of durablepb.Task, durablepb.Checkpoint and
// durablepb.Outcome (proto/walcast/durable/v1/durable.proto).
const (
	taskMessage        protowire.Number = 1
	taskState          protowire.Number = 2
	taskCheckpoints    protowire.Number = 3
	taskCreated        protowire.Number = 4
	taskCompleted      protowire.Number = 5
	taskPayloadDigest  protowire.Number = 6
	taskRequestDigest  protowire.Number = 7
	taskOutcome        protowire.Number = 8
	taskHoldsKeys      protowire.Number = 9
	taskReleased       protowire.Number = 10
	taskReleasedBy     protowire.Number = 11
	cpAcked            protowire.Number = 1
	cpMessageID        protowire.Number = 2
	cpTimeTick         protowire.Number = 3
	cpLastConfirmed    protowire.Number = 4
	cpExtra            protowire.Number = 5
	outcomeStatusField protowire.Number = 1
	outcomeDetailField protowire.Number = 2
	outcomeDataField   protowire.Number = 3
)

// taskFields is a durablepb.Task as decodeTask reads it: the checkpoints
// by value, in one slice.
type taskFields struct {
	message                      []byte
	state                        int32
	checkpoints                  []checkpointFields
	created, completed, released int64
	payloadDigest, requestDigest []byte
	outcome                      outcomeFields
	holdsKeys                    bool
	releasedBy                   uint64
}

type checkpointFields struct {
	acked                              bool
	messageID, timeTick, lastConfirmed uint64
	extra                              []byte
}

type outcomeFields struct {
	status int32
	detail string
	data   []byte
}

// decodeTask reads a Task record's wire format into f without reflection
// (a duplicate hit and recovery decode a record each). It reads it as
// proto.Unmarshal does: the last occurrence of a scalar wins, repeated
// checkpoints append, occurrences of the outcome merge, unknown fields and
// known fields of an unexpected wire type are skipped; bytes are copied
// (raw may be a tombstone's string) and empty ones are nil.
// TestDecodeTaskMatchesProto checks it against proto.Unmarshal.
func decodeTask(raw []byte, f *taskFields) error {
	return wire.Fields(raw, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case typ == protowire.VarintType && (num == taskState || num == taskCreated || num == taskCompleted ||
			num == taskHoldsKeys || num == taskReleased || num == taskReleasedBy):
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return n, nil
			}
			switch num {
			case taskState:
				f.state = int32(v)
			case taskCreated:
				f.created = int64(v)
			case taskCompleted:
				f.completed = int64(v)
			case taskHoldsKeys:
				f.holdsKeys = v != 0
			case taskReleased:
				f.released = int64(v)
			case taskReleasedBy:
				f.releasedBy = v
			}
			return n, nil
		case typ == protowire.BytesType && (num == taskMessage || num == taskPayloadDigest || num == taskRequestDigest ||
			num == taskCheckpoints || num == taskOutcome):
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return n, nil
			}
			var err error
			switch num {
			case taskMessage:
				f.message = wire.CopyBytes(v)
			case taskPayloadDigest:
				f.payloadDigest = wire.CopyBytes(v)
			case taskRequestDigest:
				f.requestDigest = wire.CopyBytes(v)
			case taskCheckpoints:
				if f.checkpoints == nil {
					f.checkpoints = make([]checkpointFields, 0, 1+countFields(b[n:], taskCheckpoints))
				}
				var c checkpointFields
				err = decodeCheckpoint(v, &c)
				f.checkpoints = append(f.checkpoints, c)
			case taskOutcome:
				err = decodeOutcome(v, &f.outcome)
			}
			return n, err
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
}

func decodeCheckpoint(raw []byte, c *checkpointFields) error {
	return wire.Fields(raw, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case typ == protowire.VarintType && num >= cpAcked && num <= cpLastConfirmed:
			v, n := protowire.ConsumeVarint(b)
			switch num {
			case cpAcked:
				c.acked = v != 0
			case cpMessageID:
				c.messageID = v
			case cpTimeTick:
				c.timeTick = v
			case cpLastConfirmed:
				c.lastConfirmed = v
			}
			return n, nil
		case typ == protowire.BytesType && num == cpExtra:
			v, n := protowire.ConsumeBytes(b)
			c.extra = wire.CopyBytes(v)
			return n, nil
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
}

func decodeOutcome(raw []byte, o *outcomeFields) error {
	return wire.Fields(raw, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case typ == protowire.VarintType && num == outcomeStatusField:
			v, n := protowire.ConsumeVarint(b)
			o.status = int32(v)
			return n, nil
		case typ == protowire.BytesType && num == outcomeDetailField:
			v, n := protowire.ConsumeBytes(b)
			if n >= 0 && !utf8.Valid(v) {
				return n, wire.ErrUTF8
			}
			o.detail = string(v)
			return n, nil
		case typ == protowire.BytesType && num == outcomeDataField:
			v, n := protowire.ConsumeBytes(b)
			o.data = wire.CopyBytes(v)
			return n, nil
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
}

// countFields counts the length-delimited fields numbered num in b (up to
// the first it cannot read): the size of a repeated field, to allocate it
// once.
func countFields(b []byte, num protowire.Number) int {
	c := 0
	for len(b) > 0 {
		n2, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		if n = protowire.ConsumeFieldValue(n2, typ, b); n < 0 {
			break
		}
		b = b[n:]
		if n2 == num && typ == protowire.BytesType {
			c++
		}
	}
	return c
}

// encodeTask writes the record of s holding message msg: the wire format
// of a durablepb.Task, by hand, in one allocation of the exact size, with
// the bytes proto.MarshalOptions{Deterministic: true} writes
// (TestEncodeTaskMatchesProto): fields in number order, zero scalars and
// empty bytes left out, every checkpoint written (a target not acked as an
// empty one).
func encodeTask(s *RecordSpec, msg []byte) []byte {
	var created, completed int64 = s.Created.UnixNano(), 0
	if !s.Completed.IsZero() {
		completed = s.Completed.UnixNano()
	}
	state := uint64(stateToPB(s.State))
	size := wire.BytesSize(taskMessage, msg) + wire.VarintSize(taskState, state)
	for i := range s.Acked {
		size += protowire.SizeTag(taskCheckpoints) + protowire.SizeBytes(checkpointSize(s, i))
	}
	size += wire.VarintSize(taskCreated, uint64(created)) + wire.VarintSize(taskCompleted, uint64(completed)) +
		wire.BytesSize(taskPayloadDigest, s.PayloadDigest) + wire.BytesSize(taskRequestDigest, s.RequestDigest)
	if s.Outcome != nil {
		size += protowire.SizeTag(taskOutcome) + protowire.SizeBytes(outcomeSize(s.Outcome))
	}
	if s.HoldsKeys {
		size += wire.VarintSize(taskHoldsKeys, 1)
	}
	b := make([]byte, 0, size)
	b = wire.AppendBytes(b, taskMessage, msg)
	b = wire.AppendVarint(b, taskState, state)
	for i := range s.Acked {
		b = protowire.AppendTag(b, taskCheckpoints, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(checkpointSize(s, i)))
		if s.Acked[i] {
			id, tick, last := checkpointFieldsOf(s.Checkpoints[i])
			b = wire.AppendVarint(b, cpAcked, 1)
			b = wire.AppendVarint(b, cpMessageID, id)
			b = wire.AppendVarint(b, cpTimeTick, tick)
			b = wire.AppendVarint(b, cpLastConfirmed, last)
			b = wire.AppendBytes(b, cpExtra, extraOf(s, i))
		}
	}
	b = wire.AppendVarint(b, taskCreated, uint64(created))
	b = wire.AppendVarint(b, taskCompleted, uint64(completed))
	b = wire.AppendBytes(b, taskPayloadDigest, s.PayloadDigest)
	b = wire.AppendBytes(b, taskRequestDigest, s.RequestDigest)
	if o := s.Outcome; o != nil {
		b = protowire.AppendTag(b, taskOutcome, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(outcomeSize(o)))
		b = wire.AppendVarint(b, outcomeStatusField, uint64(int64(int32(o.Status))))
		b = wire.AppendString(b, outcomeDetailField, o.Detail)
		b = wire.AppendBytes(b, outcomeDataField, o.Data)
	}
	if s.HoldsKeys {
		b = wire.AppendVarint(b, taskHoldsKeys, 1)
	}
	return b
}

// checkpointFieldsOf is what an acked checkpoint's record keeps. The WAL's
// positions make time tick and last-confirmed id equal to the message id;
// those are left out (0) to keep tombstones small, and checkpointOf
// restores them. No acked copy has a zero time tick, so the encoding is
// unambiguous.
func checkpointFieldsOf(c wal.Checkpoint) (id, tick, last uint64) {
	id, tick, last = c.MessageID, c.TimeTick, c.LastConfirmed
	if tick == id {
		tick = 0
	}
	if last == id {
		last = 0
	}
	return id, tick, last
}

func extraOf(s *RecordSpec, i int) []byte {
	if i < len(s.Extras) {
		return s.Extras[i]
	}
	return nil
}

func checkpointSize(s *RecordSpec, i int) int {
	if !s.Acked[i] {
		return 0
	}
	id, tick, last := checkpointFieldsOf(s.Checkpoints[i])
	return wire.VarintSize(cpAcked, 1) + wire.VarintSize(cpMessageID, id) + wire.VarintSize(cpTimeTick, tick) +
		wire.VarintSize(cpLastConfirmed, last) + wire.BytesSize(cpExtra, extraOf(s, i))
}

func outcomeSize(o *Outcome) int {
	return wire.VarintSize(outcomeStatusField, uint64(int64(int32(o.Status)))) +
		wire.StringSize(outcomeDetailField, o.Detail) + wire.BytesSize(outcomeDataField, o.Data)
}

// recordIdentity reads the identity of a task record's message (its type,
// key and owner key) without decoding the record or the rest of the
// message: what the collector needs of a tombstone it deletes.
func recordIdentity(raw []byte) (message.Identity, error) {
	var msg []byte
	err := wire.Fields(raw, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if num == taskMessage && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			msg = v
			return n, nil
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
	if err != nil {
		return message.Identity{}, err
	}
	return message.DecodeIdentity(msg)
}

// recordCreated reads a task record's creation time (unix nanoseconds)
// without decoding the rest: what a tombstone's window needs of it. The
// last occurrence wins, as in decodeTask.
func recordCreated(raw []byte) (int64, error) {
	var created int64
	err := wire.Fields(raw, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if num == taskCreated && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n >= 0 {
				created = int64(v)
			}
			return n, nil
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
	return created, err
}

// idRefs maps tombstone ids to their refs (class and sequence number).
//
// Ids come from one counter, so the tombstones kept are mostly runs of
// consecutive ids. A range of idPageSize ids holding at least
// idPagePromote tombstones gets a page: an array of refs at 8 bytes an id,
// where a Go map spends 35-41 bytes (its tables are half empty after they
// split, as they are at a million tombstones; SPEC B6). Other ids are in a
// map. A page left with fewer than idPageDemote ids gives them back to the
// map and goes; the gap between the two bounds keeps a range from moving
// back and forth. A range's ids are all in its page or all in the map.
type idRefs struct {
	pages map[uint64]*idPage // by range (id / idPageSize)
	loose map[uint64]uint64  // ids of no page
	// looseIn counts the loose ids of each range that has any.
	looseIn map[uint64]int
	n       int
}

const (
	idPageSize    = 512
	idPagePromote = idPageSize / 2
	idPageDemote  = idPageSize / 4
)

type idPage struct {
	refs [idPageSize]uint64 // ref+1; 0: no tombstone
	n    int
}

func newIDRefs() idRefs {
	return idRefs{pages: map[uint64]*idPage{}, loose: map[uint64]uint64{}, looseIn: map[uint64]int{}}
}

func (x *idRefs) len() int { return x.n }

func (x *idRefs) get(id uint64) (uint64, bool) {
	if p := x.pages[id/idPageSize]; p != nil {
		r := p.refs[id%idPageSize]
		return r - 1, r != 0
	}
	ref, ok := x.loose[id]
	return ref, ok
}

// set maps id to ref, replacing its ref if it has one.
func (x *idRefs) set(id, ref uint64) {
	rng, i := id/idPageSize, id%idPageSize
	if p := x.pages[rng]; p != nil {
		if p.refs[i] == 0 {
			p.n++
			x.n++
		}
		p.refs[i] = ref + 1
		return
	}
	if _, ok := x.loose[id]; ok {
		x.loose[id] = ref
		return
	}
	x.loose[id] = ref
	x.n++
	x.looseIn[rng]++
	if x.looseIn[rng] >= idPagePromote {
		x.promote(rng)
	}
}

// delete removes id, if it is mapped.
func (x *idRefs) delete(id uint64) {
	rng, i := id/idPageSize, id%idPageSize
	p := x.pages[rng]
	if p == nil {
		if _, ok := x.loose[id]; ok {
			delete(x.loose, id)
			x.n--
			if x.looseIn[rng]--; x.looseIn[rng] == 0 {
				delete(x.looseIn, rng)
			}
		}
		return
	}
	if p.refs[i] == 0 {
		return
	}
	p.refs[i] = 0
	p.n--
	x.n--
	if p.n < idPageDemote {
		x.demote(rng, p)
	}
}

// promote moves the loose ids of range rng into a new page.
func (x *idRefs) promote(rng uint64) {
	p := &idPage{}
	for i := range uint64(idPageSize) {
		id := rng*idPageSize + i
		if ref, ok := x.loose[id]; ok {
			p.refs[i] = ref + 1
			p.n++
			delete(x.loose, id)
		}
	}
	delete(x.looseIn, rng)
	x.pages[rng] = p
}

// demote moves the ids of page p, of range rng, back to the map.
func (x *idRefs) demote(rng uint64, p *idPage) {
	for i, r := range p.refs {
		if r != 0 {
			x.loose[rng*idPageSize+uint64(i)] = r - 1
		}
	}
	if p.n > 0 {
		x.looseIn[rng] += p.n
	}
	delete(x.pages, rng)
}
