package engine

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/walcast/walcast/internal/wire"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

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
