// Package apicodec is the Connect codec of walcast's API, for its servers and
// its Go client alike: Connect's binary protobuf codec ("proto", for the
// Connect, gRPC and gRPC-Web protocols), with the answer of every
// broadcast, BroadcastResponse, written and read by hand. protobuf-go
// writes and reads its map fields (appends, extras) by reflection: for a
// broadcast of four targets about 1.2 µs and 10 allocations to write it and
// 1.9 µs and 24 allocations to read it, where the hand path writes in a
// tenth of the time without allocating and reads with half the
// allocations. What the hand path does not expect (unknown fields, a
// message field twice, a string that is not UTF-8, malformed bytes) goes to
// protobuf-go, which writes or reads it as it always did, or fails as it
// always did. Every other message is protobuf-go's.
package apicodec

import (
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/api/walcastv1"
)

// Codec is the API's codec; give it to connect.WithCodec on both sides.
type Codec struct{}

var _ connect.Codec = Codec{}

// Name is the codec's name in content types ("application/proto",
// "application/grpc+proto"): it replaces Connect's.
func (Codec) Name() string { return "proto" }

// IsBinary tells Connect the encoding is binary.
func (Codec) IsBinary() bool { return true }

// Marshal encodes m.
func (c Codec) Marshal(m any) ([]byte, error) { return c.MarshalAppend(nil, m) }

// MarshalAppend encodes m after dst (Connect passes a pooled buffer).
func (Codec) MarshalAppend(dst []byte, m any) ([]byte, error) {
	if r, ok := m.(*walcastv1.BroadcastResponse); ok && r != nil {
		if b, ok := appendBroadcastResponse(dst, r); ok {
			return b, nil
		}
	}
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", m)
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, pm)
}

// MarshalStable encodes m deterministically (Connect's GET requests).
func (Codec) MarshalStable(m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", m)
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(pm)
}

// Unmarshal decodes data into m. data is Connect's pooled buffer: nothing
// decoded refers to it.
func (Codec) Unmarshal(data []byte, m any) error {
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

// Field numbers of BroadcastResponse and the messages in it (see
// broadcast.proto); TestCodecKnowsEveryField fails
// when one gains a field this package does not write and read.
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
