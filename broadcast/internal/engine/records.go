package engine

import (
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/walcast/walcast/internal/durablepb"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

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
func (r *Record) Results() map[message.VChannel]wal.Checkpoint {
	out := make(map[message.VChannel]wal.Checkpoint, len(r.Acked))
	for i, v := range r.Msg.Broadcast.VChannels {
		if r.Acked[i] {
			out[v] = r.Checkpoints[i]
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
