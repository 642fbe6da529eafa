package apicodec

import (
	"errors"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/internal/wire"
)

// errLeave stops a read at what the hand path leaves to protobuf-go.
var errLeave = errors.New("apicodec: left to protobuf-go")

// readBroadcastResponse reads b into the empty r as proto.Unmarshal would;
// false for what it leaves to protobuf-go (r is then reset by it).
func readBroadcastResponse(b []byte, r *walcastv1.BroadcastResponse) bool {
	return wire.Fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case typ == protowire.VarintType && (num == respBroadcastID || num == respDuplicated):
			v, n := protowire.ConsumeVarint(b)
			if num == respBroadcastID {
				r.BroadcastId = v
			} else {
				r.Duplicated = v != 0
			}
			return n, nil
		case typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return n, nil
			}
			return n, readResponseField(r, num, v)
		}
		return 0, errLeave
	}) == nil
}

// readResponseField reads the length-delimited field num of a
// BroadcastResponse into r.
func readResponseField(r *walcastv1.BroadcastResponse, num protowire.Number, v []byte) error {
	switch num {
	case respAppends:
		k, cp, ok := readCheckpointEntry(v)
		if !ok {
			return errLeave
		}
		if r.Appends == nil {
			r.Appends = make(map[string]*walcastv1.Checkpoint, 4)
		}
		r.Appends[k] = cp
	case respOutcome:
		if r.Outcome != nil { // protobuf-go merges the two
			return errLeave
		}
		if r.Outcome = readOutcome(v); r.Outcome == nil {
			return errLeave
		}
	case respWindow:
		if r.Window != nil {
			return errLeave
		}
		w := &walcastv1.Window{}
		if proto.Unmarshal(v, w) != nil {
			return errLeave
		}
		r.Window = w
	case respExtras:
		k, x, ok := readBytesEntry(v)
		if !ok {
			return errLeave
		}
		if r.Extras == nil {
			r.Extras = make(map[string][]byte)
		}
		r.Extras[k] = x
	default:
		return errLeave
	}
	return nil
}

// readCheckpointEntry reads one entry of a map<string, Checkpoint>; a
// missing key is "", a missing value an empty Checkpoint, as protobuf-go
// reads them.
func readCheckpointEntry(b []byte) (string, *walcastv1.Checkpoint, bool) {
	cp := &walcastv1.Checkpoint{}
	// A value twice merges, as protobuf-go does.
	k, ok := readEntry(b, func(v []byte) bool { return readCheckpoint(v, cp) })
	return k, cp, ok
}

// readEntry reads one entry of a map with string keys: it returns the key
// ("" if missing) and hands every value field to value; false for what it
// leaves to protobuf-go.
func readEntry(b []byte, value func(v []byte) bool) (string, bool) {
	var k string
	err := wire.Fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if typ != protowire.BytesType || num != mapKey && num != mapValue {
			return 0, errLeave
		}
		if num == mapKey {
			s, n, err := wire.ConsumeString(b)
			k = s
			return n, err
		}
		v, n := protowire.ConsumeBytes(b)
		if n >= 0 && !value(v) {
			return 0, errLeave
		}
		return n, nil
	})
	return k, err == nil
}

func readCheckpoint(b []byte, cp *walcastv1.Checkpoint) bool {
	return wire.Fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if typ != protowire.VarintType {
			return 0, errLeave
		}
		v, n := protowire.ConsumeVarint(b)
		switch num {
		case cpMessageID:
			cp.MessageId = v
		case cpTimeTick:
			cp.TimeTick = v
		case cpLastConfirmed:
			cp.LastConfirmed = v
		default:
			return 0, errLeave
		}
		return n, nil
	}) == nil
}

// readOutcome reads an Outcome; nil for what it leaves to protobuf-go.
func readOutcome(b []byte) *walcastv1.Outcome {
	o := &walcastv1.Outcome{}
	err := wire.Fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == outcomeStatus && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			o.Status = walcastv1.OutcomeStatus(int32(v))
			return n, nil
		case num == outcomeDetail && typ == protowire.BytesType:
			s, n, err := wire.ConsumeString(b)
			o.Detail = s
			return n, err
		case num == outcomeData && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			o.Data = wire.CopyBytes(v)
			return n, nil
		}
		return 0, errLeave
	})
	if err != nil {
		return nil
	}
	return o
}

// readBytesEntry reads one entry of a map<string, bytes>; a value is never
// nil, as protobuf-go reads them.
func readBytesEntry(b []byte) (string, []byte, bool) {
	x := []byte{}
	k, ok := readEntry(b, func(v []byte) bool { x = append([]byte{}, v...); return true })
	return k, x, ok
}
