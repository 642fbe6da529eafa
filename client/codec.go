package client

import (
	"fmt"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/api/walcastv1"
)

// protoCodec is Connect's binary protobuf codec ("proto") with the answer
// of every broadcast, BroadcastResponse, read by hand: protobuf-go reads its
// map fields (appends, extras) by reflection, about 1.9 µs and 24
// allocations for a broadcast of four targets. What the reader does not
// expect (unknown fields, a message field twice, a string that is not UTF-8,
// malformed bytes) goes to protobuf-go, which reads it as it always did, or
// fails as it always did. Every other message is protobuf-go's.
type protoCodec struct{}

var _ connect.Codec = protoCodec{}

// Name is the codec's name in content types: it replaces Connect's.
func (protoCodec) Name() string { return "proto" }

// IsBinary tells Connect the encoding is binary.
func (protoCodec) IsBinary() bool { return true }

// Marshal encodes m, as Connect's codec does.
func (c protoCodec) Marshal(m any) ([]byte, error) { return c.MarshalAppend(nil, m) }

// MarshalAppend encodes m after dst.
func (protoCodec) MarshalAppend(dst []byte, m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", m)
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, pm)
}

// MarshalStable encodes m deterministically (Connect's GET requests).
func (protoCodec) MarshalStable(m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", m)
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(pm)
}

// Unmarshal decodes data into m. data is Connect's pooled buffer: nothing
// decoded refers to it.
func (protoCodec) Unmarshal(data []byte, m any) error {
	if r, ok := m.(*walcastv1.BroadcastResponse); ok && r != nil {
		proto.Reset(r)
		if readBroadcastResponse(data, r) {
			return nil
		}
	}
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a protobuf message", m)
	}
	if err := proto.Unmarshal(data, pm); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", m, err)
	}
	return nil
}

// Field numbers of the messages readBroadcastResponse reads (see
// broadcast.proto); TestProtoCodecKnowsEveryField fails when one gains a
// field this file does not read.
const (
	respBroadcastID = 1
	respAppends     = 2
	respDuplicated  = 3
	respOutcome     = 4
	respWindow      = 5
	respExtras      = 6

	cpMessageID     = 1
	cpTimeTick      = 2
	cpLastConfirmed = 3

	outcomeStatus = 1
	outcomeDetail = 2
	outcomeData   = 3

	mapKey   = 1
	mapValue = 2
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
	var k string
	cp := &walcastv1.Checkpoint{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType || num != mapKey && num != mapValue {
			return "", nil, false
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return "", nil, false
		}
		b = b[n+m:]
		if num == mapKey {
			if !utf8.Valid(v) {
				return "", nil, false
			}
			k = string(v)
			continue
		}
		if !readCheckpoint(v, cp) { // a value twice merges, as protobuf-go does
			return "", nil, false
		}
	}
	return k, cp, true
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
	var k string
	x := []byte{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType || num != mapKey && num != mapValue {
			return "", nil, false
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return "", nil, false
		}
		b = b[n+m:]
		if num == mapKey {
			if !utf8.Valid(v) {
				return "", nil, false
			}
			k = string(v)
			continue
		}
		x = append([]byte{}, v...)
	}
	return k, x, true
}
