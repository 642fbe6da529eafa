package apicodec

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/api/walcastv1"
)

// readBroadcastResponse reads b into the empty r as proto.Unmarshal would;
// false for what it leaves to protobuf-go (r is then reset by it).
func readBroadcastResponse(b []byte, r *walcastv1.BroadcastResponse) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case typ == protowire.VarintType && (num == respBroadcastID || num == respDuplicated):
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			b = b[n:]
			if num == respBroadcastID {
				r.BroadcastId = v
			} else {
				r.Duplicated = v != 0
			}
		case typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return false
			}
			b = b[n:]
			switch num {
			case respAppends:
				k, cp, ok := readCheckpointEntry(v)
				if !ok {
					return false
				}
				if r.Appends == nil {
					r.Appends = make(map[string]*walcastv1.Checkpoint, 4)
				}
				r.Appends[k] = cp
			case respOutcome:
				if r.Outcome != nil { // protobuf-go merges the two
					return false
				}
				if r.Outcome = readOutcome(v); r.Outcome == nil {
					return false
				}
			case respWindow:
				if r.Window != nil {
					return false
				}
				w := &walcastv1.Window{}
				if proto.Unmarshal(v, w) != nil {
					return false
				}
				r.Window = w
			case respExtras:
				k, x, ok := readBytesEntry(v)
				if !ok {
					return false
				}
				if r.Extras == nil {
					r.Extras = make(map[string][]byte)
				}
				r.Extras[k] = x
			default:
				return false
			}
		default:
			return false
		}
	}
	return true
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
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType || num != mapKey && num != mapValue {
			return "", false
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return "", false
		}
		b = b[n+m:]
		if num == mapKey {
			if !utf8.Valid(v) {
				return "", false
			}
			k = string(v)
			continue
		}
		if !value(v) {
			return "", false
		}
	}
	return k, true
}

func readCheckpoint(b []byte, cp *walcastv1.Checkpoint) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.VarintType {
			return false
		}
		v, m := protowire.ConsumeVarint(b[n:])
		if m < 0 {
			return false
		}
		b = b[n+m:]
		switch num {
		case cpMessageID:
			cp.MessageId = v
		case cpTimeTick:
			cp.TimeTick = v
		case cpLastConfirmed:
			cp.LastConfirmed = v
		default:
			return false
		}
	}
	return true
}

// readOutcome reads an Outcome; nil for what it leaves to protobuf-go.
func readOutcome(b []byte) *walcastv1.Outcome {
	o := &walcastv1.Outcome{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		switch {
		case num == outcomeStatus && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return nil
			}
			b = b[m:]
			o.Status = walcastv1.OutcomeStatus(int32(v))
		case (num == outcomeDetail || num == outcomeData) && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil
			}
			b = b[m:]
			if num == outcomeData {
				o.Data = append([]byte(nil), v...)
				continue
			}
			if !utf8.Valid(v) {
				return nil
			}
			o.Detail = string(v)
		default:
			return nil
		}
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
