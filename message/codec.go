package message

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/internal/durablepb"
	"github.com/walcast/walcast/resource"
)

// Marshal encodes m in walcast's durable format (the Message of
// proto/walcast/durable/v1/durable.proto).
func Marshal(m *Message) ([]byte, error) {
	pb := &durablepb.Message{
		TypeName:       m.Type.Name,
		TypeVersion:    m.Type.Version,
		Payload:        m.Payload,
		Properties:     m.Properties,
		IdempotencyKey: string(m.IdempotencyKey),
		TraceParent:    m.TraceParent,
		TraceState:     m.TraceState,
		BroadcastId:    m.Broadcast.ID,
		AckSyncUp:      m.Broadcast.AckSyncUp,
	}
	if n := len(m.Broadcast.VChannels); n > 0 {
		pb.Vchannels = make([]string, n)
		for i, v := range m.Broadcast.VChannels {
			pb.Vchannels[i] = string(v)
		}
	}
	if n := len(m.Broadcast.ResourceKeys); n > 0 {
		pb.ResourceKeys = make([]*durablepb.ResourceKey, n)
		for i, k := range m.Broadcast.ResourceKeys {
			pb.ResourceKeys[i] = &durablepb.ResourceKey{Domain: uint32(k.Domain), Name: k.Name, Exclusive: k.Mode == resource.Exclusive}
		}
	}
	if r := m.Replicate; r != nil {
		pb.Replicate = &durablepb.ReplicateHeader{SourceCluster: r.SourceCluster, SourcePchannel: string(r.SourcePChannel),
			SourceMessageId: r.SourceMessageID, SourceTimeTick: r.SourceTimeTick}
	}
	if g := m.Group; g != nil {
		pb.Group = &durablepb.GroupHeader{Id: g.ID, Seq: g.Seq, Kind: durablepb.GroupKind(g.Kind), OwnerKey: g.OwnerKey}
	}
	if len(m.Broadcast.Copies) > 0 {
		pb.Copies = make(map[string]*durablepb.CopySpec, len(m.Broadcast.Copies))
		for v, c := range m.Broadcast.Copies {
			pb.Copies[string(v)] = &durablepb.CopySpec{Role: c.Role, Payload: c.Payload, HasPayload: c.HasPayload}
		}
	}
	if n := len(m.Broadcast.AppendFirst); n > 0 {
		pb.AppendFirst = make([]string, n)
		for i, v := range m.Broadcast.AppendFirst {
			pb.AppendFirst[i] = string(v)
		}
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(pb)
}

// Unmarshal decodes a message written by Marshal. Bytes that do not decode,
// or decode to a message with an invalid domain or mode, give an error
// wrapping ErrCorrupt.
func Unmarshal(b []byte) (*Message, error) {
	m := &Message{}
	if err := decode(b, m); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return m, nil
}
