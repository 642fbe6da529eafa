package engine

import (
	"errors"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
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

// errFieldNumber is a field number above protobuf's largest (ConsumeTag
// takes those; proto.Unmarshal refuses them).
var errFieldNumber = errors.New("field number out of range")

// errInvalidUTF8 is a string field that is not UTF-8 (proto.Unmarshal
// refuses those too).
var errInvalidUTF8 = errors.New("string field contains invalid UTF-8")

// decodeTask reads a Task record's wire format into f without reflection
// (a duplicate hit and recovery decode a record each). It reads it as
// proto.Unmarshal does: the last occurrence of a scalar wins, repeated
// checkpoints append, occurrences of the outcome merge, unknown fields and
// known fields of an unexpected wire type are skipped; bytes are copied
// (raw may be a tombstone's string) and empty ones are nil.
// TestDecodeTaskMatchesProto checks it against proto.Unmarshal.
func decodeTask(raw []byte, f *taskFields) error {
	return walkFields(raw, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
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
				f.message = copyBytes(v)
			case taskPayloadDigest:
				f.payloadDigest = copyBytes(v)
			case taskRequestDigest:
				f.requestDigest = copyBytes(v)
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
	return walkFields(raw, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
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
			c.extra = copyBytes(v)
			return n, nil
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
}

func decodeOutcome(raw []byte, o *outcomeFields) error {
	return walkFields(raw, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case typ == protowire.VarintType && num == outcomeStatusField:
			v, n := protowire.ConsumeVarint(b)
			o.status = int32(v)
			return n, nil
		case typ == protowire.BytesType && num == outcomeDetailField:
			v, n := protowire.ConsumeBytes(b)
			if n >= 0 && !utf8.Valid(v) {
				return n, errInvalidUTF8
			}
			o.detail = string(v)
			return n, nil
		case typ == protowire.BytesType && num == outcomeDataField:
			v, n := protowire.ConsumeBytes(b)
			o.data = copyBytes(v)
			return n, nil
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
}

// walkFields calls field with each field's number, wire type and the bytes
// after its tag; field returns how many bytes its value took (negative: a
// protowire parse error).
func walkFields(b []byte, field func(num protowire.Number, typ protowire.Type, b []byte) (int, error)) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		if num > protowire.MaxValidNumber {
			return errFieldNumber
		}
		b = b[n:]
		n, err := field(num, typ, b)
		if err != nil {
			return err
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
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

// copyBytes copies v; nil if it is empty (as proto.Unmarshal leaves an
// empty proto3 bytes field).
func copyBytes(v []byte) []byte {
	if len(v) == 0 {
		return nil
	}
	return append([]byte(nil), v...)
}
