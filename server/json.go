package server

import (
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// strictJSONCodecs returns the handler options that make a Connect handler
// refuse JSON requests with fields its messages do not have (code
// InvalidArgument), where Connect's default JSON codec silently drops them.
// A request that misspells a field — "idempotency_kye" — would otherwise run
// as if the field were absent: a retry would no longer be idempotent, a
// filter would no longer filter. Every handler of the process uses it
// (BroadcastService, ReplicationService, and an application's handlers
// through AppHandlerOptions); clients built against a newer schema must therefore
// talk to a server that knows their fields, which is the price of never
// guessing. The binary protobuf codec is unchanged (unknown fields there are
// what schema evolution adds).
func strictJSONCodecs() []connect.HandlerOption {
	return []connect.HandlerOption{
		connect.WithCodec(strictJSON{name: "json"}),
		connect.WithCodec(strictJSON{name: "json; charset=utf-8"}),
	}
}

// strictJSON is Connect's protojson codec without DiscardUnknown.
type strictJSON struct{ name string }

func (c strictJSON) Name() string { return c.name }

func (c strictJSON) Marshal(m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", m)
	}
	return protojson.MarshalOptions{}.Marshal(pm)
}

func (c strictJSON) MarshalAppend(dst []byte, m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", m)
	}
	return protojson.MarshalOptions{}.MarshalAppend(dst, pm)
}

func (c strictJSON) Unmarshal(b []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a protobuf message", m)
	}
	if len(b) == 0 {
		return errors.New("zero-length payload is not a valid JSON object")
	}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(b, pm); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", m, err)
	}
	return nil
}

func (c strictJSON) IsBinary() bool { return false }
