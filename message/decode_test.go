package message

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/internal/durablepb"
	"github.com/walcast/walcast/resource"
)

// unmarshalProto is Unmarshal through proto.Unmarshal, as it was before
// decode: the reference decode must agree with.
func unmarshalProto(b []byte) (*Message, error) {
	var pb durablepb.Message
	if err := proto.Unmarshal(b, &pb); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	m := &Message{
		Type:           Type{Name: pb.TypeName, Version: pb.TypeVersion},
		Payload:        pb.Payload,
		Properties:     pb.Properties,
		IdempotencyKey: IdempotencyKey(pb.IdempotencyKey),
		TraceParent:    pb.TraceParent,
		TraceState:     pb.TraceState,
		Broadcast:      BroadcastHeader{ID: pb.BroadcastId, AckSyncUp: pb.AckSyncUp},
	}
	if n := len(pb.Vchannels); n > 0 {
		m.Broadcast.VChannels = make([]VChannel, n)
		for i, v := range pb.Vchannels {
			m.Broadcast.VChannels[i] = VChannel(v)
		}
	}
	if n := len(pb.ResourceKeys); n > 0 {
		m.Broadcast.ResourceKeys = make([]resource.Key, n)
		for i, k := range pb.ResourceKeys {
			mode := resource.Shared
			if k.Exclusive {
				mode = resource.Exclusive
			}
			if k.Domain > 0xffff {
				return nil, fmt.Errorf("%w: resource domain %d", ErrCorrupt, k.Domain)
			}
			m.Broadcast.ResourceKeys[i] = resource.Key{Domain: resource.Domain(k.Domain), Name: k.Name, Mode: mode}
		}
	}
	if r := pb.Replicate; r != nil {
		m.Replicate = &ReplicateHeader{SourceCluster: r.SourceCluster, SourcePChannel: PChannel(r.SourcePchannel),
			SourceMessageID: r.SourceMessageId, SourceTimeTick: r.SourceTimeTick}
	}
	if g := pb.Group; g != nil {
		if g.Kind < durablepb.GroupKind_GROUP_KIND_BEGIN || g.Kind > durablepb.GroupKind_GROUP_KIND_ROLLBACK {
			return nil, fmt.Errorf("%w: group kind %d", ErrCorrupt, g.Kind)
		}
		m.Group = &GroupHeader{ID: g.Id, Seq: g.Seq, Kind: GroupKind(g.Kind), OwnerKey: g.OwnerKey}
	}
	if len(pb.Copies) > 0 {
		m.Broadcast.Copies = make(map[VChannel]CopySpec, len(pb.Copies))
		for v, c := range pb.Copies {
			m.Broadcast.Copies[VChannel(v)] = CopySpec{Role: c.Role, Payload: c.Payload, HasPayload: c.HasPayload}
		}
	}
	if n := len(pb.AppendFirst); n > 0 {
		m.Broadcast.AppendFirst = make([]VChannel, n)
		for i, v := range pb.AppendFirst {
			m.Broadcast.AppendFirst[i] = VChannel(v)
		}
	}
	return m, nil
}

// randomMessage is the encoding of a random message with every field, and
// the oddities another encoder may produce: a scalar repeated (the last
// wins), a header split in two (they merge), a map key twice (the last
// entry wins), unknown fields, a known field with another wire type.
func randomMessage(r *rand.Rand) []byte {
	maybe := func(s string) string {
		if r.IntN(3) == 0 {
			return ""
		}
		return s
	}
	pb := &durablepb.Message{TypeName: maybe("CreateCollection"), TypeVersion: uint32(r.IntN(3)), Payload: []byte(maybe("payload")),
		IdempotencyKey: maybe("c:db:k"), TraceParent: maybe("00-abc-def-01"), TraceState: maybe("x=y"), BroadcastId: r.Uint64N(1 << 50),
		AckSyncUp: r.IntN(2) == 0}
	for i := range r.IntN(4) {
		pb.Vchannels = append(pb.Vchannels, fmt.Sprintf("wal-%d/v", i))
	}
	for i := range r.IntN(3) {
		pb.ResourceKeys = append(pb.ResourceKeys, &durablepb.ResourceKey{Domain: uint32(r.IntN(6)), Name: maybe(fmt.Sprint("k", i)), Exclusive: r.IntN(2) == 0})
	}
	if r.IntN(3) == 0 {
		pb.ResourceKeys = append(pb.ResourceKeys, &durablepb.ResourceKey{Domain: 0x10000 + uint32(r.IntN(3))})
	}
	if r.IntN(2) == 0 {
		pb.Properties = map[string]string{"a": maybe("1"), maybe("b"): "2"}
	}
	if r.IntN(2) == 0 {
		pb.Replicate = &durablepb.ReplicateHeader{SourceCluster: maybe("east"), SourcePchannel: maybe("wal-1"), SourceMessageId: r.Uint64(), SourceTimeTick: r.Uint64()}
	}
	if r.IntN(2) == 0 {
		pb.Group = &durablepb.GroupHeader{Id: r.Uint64(), Seq: r.Uint32(), Kind: durablepb.GroupKind(r.IntN(6)), OwnerKey: maybe("import/7")}
	}
	if r.IntN(2) == 0 {
		pb.Copies = map[string]*durablepb.CopySpec{"wal-0/v": {Role: maybe("fence"), Payload: []byte(maybe("p")), HasPayload: r.IntN(2) == 0}}
		if r.IntN(2) == 0 {
			pb.Copies["wal-1/v"] = &durablepb.CopySpec{}
		}
	}
	for i := range r.IntN(2) {
		pb.AppendFirst = append(pb.AppendFirst, fmt.Sprintf("wal-%d/v", i))
	}
	out, err := proto.Marshal(pb)
	if err != nil {
		panic(err)
	}
	if r.IntN(3) == 0 { // a later id and type name win
		out = protowire.AppendTag(out, fBroadcastID, protowire.VarintType)
		out = protowire.AppendVarint(out, r.Uint64())
		out = protowire.AppendTag(out, fTypeName, protowire.BytesType)
		out = protowire.AppendString(out, "Later")
	}
	if r.IntN(3) == 0 { // a second group header merges into the first
		g, _ := proto.Marshal(&durablepb.GroupHeader{Kind: durablepb.GroupKind(1 + r.IntN(4))})
		out = protowire.AppendTag(out, fGroup, protowire.BytesType)
		out = protowire.AppendBytes(out, g)
	}
	if r.IntN(3) == 0 { // a copy and a property given again: the last entry wins
		e, _ := proto.Marshal(&durablepb.Message{Copies: map[string]*durablepb.CopySpec{"wal-0/v": {Role: "again"}}, Properties: map[string]string{"a": "again"}})
		out = append(out, e...)
	}
	if r.IntN(3) == 0 { // unknown fields of every wire type
		out = protowire.AppendTag(out, 99, protowire.VarintType)
		out = protowire.AppendVarint(out, 5)
		out = protowire.AppendTag(out, 100, protowire.BytesType)
		out = protowire.AppendBytes(out, []byte("x"))
		out = protowire.AppendTag(out, 101, protowire.Fixed64Type)
		out = protowire.AppendFixed64(out, 7)
		out = protowire.AppendTag(out, 102, protowire.Fixed32Type)
		out = protowire.AppendFixed32(out, 7)
	}
	if r.IntN(4) == 0 { // known fields with another wire type are unknown
		out = protowire.AppendTag(out, fAckSyncUp, protowire.BytesType)
		out = protowire.AppendBytes(out, []byte{1})
		out = protowire.AppendTag(out, fVChannels, protowire.VarintType)
		out = protowire.AppendVarint(out, 3)
	}
	if r.IntN(8) == 0 { // not UTF-8
		out = protowire.AppendTag(out, fVChannels, protowire.BytesType)
		out = protowire.AppendBytes(out, []byte{0xff, 0xfe})
	}
	return out
}

// TestUnmarshalMatchesProto: Unmarshal (decode) and the same decoding
// through proto.Unmarshal give equal messages for random encodings, and
// agree on which corrupted ones to refuse.
func TestUnmarshalMatchesProto(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 3000 {
		raw := randomMessage(r)
		checkDecode(t, fmt.Sprint("message ", i), raw)
		checkDecode(t, fmt.Sprint("message ", i, " cut"), raw[:r.IntN(len(raw)+1)])
		if len(raw) > 0 {
			bad := append([]byte(nil), raw...)
			bad[r.IntN(len(bad))] ^= byte(1 + r.IntN(255))
			checkDecode(t, fmt.Sprint("message ", i, " changed"), bad)
		}
	}
}

func checkDecode(t *testing.T, what string, raw []byte) {
	t.Helper()
	got, err := Unmarshal(raw)
	want, werr := unmarshalProto(raw)
	if (err == nil) != (werr == nil) {
		t.Fatalf("%s: Unmarshal error %v, proto.Unmarshal's %v\n%x", what, err, werr, raw)
	}
	if err == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: Unmarshal\n%#v\nproto.Unmarshal\n%#v", what, got, want)
	}
}

// FuzzUnmarshal: for any bytes, Unmarshal and proto.Unmarshal agree.
func FuzzUnmarshal(f *testing.F) {
	r := rand.New(rand.NewPCG(7, 8))
	for range 20 {
		f.Add(randomMessage(r))
	}
	f.Fuzz(func(t *testing.T, raw []byte) { checkDecode(t, "fuzzed message", raw) })
}

// marshalProto is Marshal through proto.Marshal, as it was before encode:
// the reference its bytes must equal.
func marshalProto(m *Message) ([]byte, error) {
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

// randomMsg is a random message with every field, empty strings and empty
// elements included.
func randomMsg(r *rand.Rand) *Message {
	maybe := func(s string) string {
		if r.IntN(3) == 0 {
			return ""
		}
		return s
	}
	m := &Message{Type: Type{Name: maybe("CreateCollection"), Version: uint32(r.IntN(3))}, Payload: []byte(maybe("payload")),
		IdempotencyKey: IdempotencyKey(maybe("c:db:k")), TraceParent: maybe("00-abc-def-01"), TraceState: maybe("x=y")}
	m.Broadcast.ID = r.Uint64N(1 << 50)
	m.Broadcast.AckSyncUp = r.IntN(2) == 0
	for i := range r.IntN(4) {
		m.Broadcast.VChannels = append(m.Broadcast.VChannels, VChannel(maybe(fmt.Sprintf("wal-%d/v", i))))
	}
	for i := range r.IntN(3) {
		m.Broadcast.ResourceKeys = append(m.Broadcast.ResourceKeys, resource.Key{Domain: resource.Domain(r.IntN(6)), Name: maybe(fmt.Sprint("k", i)),
			Mode: []resource.Mode{resource.Shared, resource.Exclusive}[r.IntN(2)]})
	}
	if r.IntN(2) == 0 {
		m.Properties = map[string]string{}
		for i := range r.IntN(4) {
			m.Properties[maybe(fmt.Sprint("p", i))] = maybe(fmt.Sprint("v", i))
		}
	}
	if r.IntN(2) == 0 {
		m.Replicate = &ReplicateHeader{SourceCluster: maybe("east"), SourcePChannel: PChannel(maybe("wal-1")), SourceMessageID: r.Uint64N(3), SourceTimeTick: r.Uint64()}
	}
	if r.IntN(2) == 0 {
		m.Group = &GroupHeader{ID: r.Uint64N(3), Seq: uint32(r.IntN(3)), Kind: GroupKind(r.IntN(5)), OwnerKey: maybe("import/7")}
	}
	if r.IntN(2) == 0 {
		m.Broadcast.Copies = map[VChannel]CopySpec{}
		for i := range r.IntN(4) {
			m.Broadcast.Copies[VChannel(maybe(fmt.Sprintf("wal-%d/c", i)))] = CopySpec{Role: maybe("fence"), Payload: []byte(maybe("p")), HasPayload: r.IntN(2) == 0}
		}
	}
	for i := range r.IntN(3) {
		m.Broadcast.AppendFirst = append(m.Broadcast.AppendFirst, VChannel(fmt.Sprintf("wal-%d/v", i)))
	}
	return m
}

// TestMarshalMatchesProto: Marshal writes the bytes of
// proto.MarshalOptions{Deterministic: true} (stored records and WAL entries
// keep their bytes and their dedup ids) in a buffer of the exact size, and
// refuses what it refuses (a string that is not UTF-8).
func TestMarshalMatchesProto(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for i := range 3000 {
		m := randomMsg(r)
		if r.IntN(20) == 0 {
			m.Broadcast.VChannels = append(m.Broadcast.VChannels, VChannel([]byte{'w', 0xff}))
		}
		if r.IntN(40) == 0 {
			m.Properties = map[string]string{"k": string([]byte{0xc3})}
		}
		got, err := Marshal(m)
		want, werr := marshalProto(m)
		if (err == nil) != (werr == nil) {
			t.Fatalf("message %d: Marshal error %v, proto.Marshal's %v", i, err, werr)
		}
		if err != nil {
			continue
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("message %d %+v: Marshal\n%x\nproto.Marshal\n%x", i, m, got, want)
		}
		if cap(got) != len(got) {
			t.Fatalf("message %d: %d bytes in a buffer of %d", i, len(got), cap(got))
		}
	}
}
