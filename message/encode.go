package message

import (
	"slices"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/walcast/walcast/internal/wire"
	"github.com/walcast/walcast/resource"
)

// encode writes m in the wire format of a durablepb.Message, by hand, in
// one allocation of the exact size (plus the sorted keys of its maps, if
// it has any), with the bytes proto.MarshalOptions{Deterministic: true}
// writes (TestMarshalMatchesProto): fields in number order, zero scalars
// and empty strings and bytes left out, every element of a repeated field
// written, map entries sorted by key with both key and value written. A
// string that is not UTF-8 is an error, as for proto.Marshal.
func encode(m *Message) ([]byte, error) {
	if err := m.checkUTF8(); err != nil {
		return nil, err
	}
	var props []string
	if len(m.Properties) > 0 {
		props = make([]string, 0, len(m.Properties))
		for k := range m.Properties {
			props = append(props, k)
		}
		slices.Sort(props)
	}
	var copies []VChannel
	if len(m.Broadcast.Copies) > 0 {
		copies = make([]VChannel, 0, len(m.Broadcast.Copies))
		for v := range m.Broadcast.Copies {
			copies = append(copies, v)
		}
		slices.Sort(copies)
	}
	b := make([]byte, 0, m.size(props, copies))
	b = wire.AppendString(b, fTypeName, m.Type.Name)
	b = wire.AppendVarint(b, fTypeVersion, uint64(m.Type.Version))
	b = wire.AppendBytes(b, fPayload, m.Payload)
	for _, k := range props {
		b = protowire.AppendTag(b, fProperties, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(propertySize(k, m.Properties[k])))
		b = wire.AppendElemString(b, 1, k)
		b = wire.AppendElemString(b, 2, m.Properties[k])
	}
	b = wire.AppendString(b, fIdempotencyKey, string(m.IdempotencyKey))
	b = wire.AppendString(b, fTraceParent, m.TraceParent)
	b = wire.AppendString(b, fTraceState, m.TraceState)
	b = wire.AppendVarint(b, fBroadcastID, m.Broadcast.ID)
	for _, v := range m.Broadcast.VChannels {
		b = wire.AppendElemString(b, fVChannels, string(v))
	}
	for _, k := range m.Broadcast.ResourceKeys {
		b = protowire.AppendTag(b, fResourceKeys, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(keySize(k)))
		b = wire.AppendVarint(b, 1, uint64(k.Domain))
		b = wire.AppendString(b, 2, k.Name)
		b = wire.AppendBool(b, 3, k.Mode == resource.Exclusive)
	}
	b = wire.AppendBool(b, fAckSyncUp, m.Broadcast.AckSyncUp)
	if r := m.Replicate; r != nil {
		b = protowire.AppendTag(b, fReplicate, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(replicateSize(r)))
		b = wire.AppendString(b, 1, r.SourceCluster)
		b = wire.AppendString(b, 2, string(r.SourcePChannel))
		b = wire.AppendVarint(b, 3, r.SourceMessageID)
		b = wire.AppendVarint(b, 4, r.SourceTimeTick)
	}
	if g := m.Group; g != nil {
		b = protowire.AppendTag(b, fGroup, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(groupSize(g)))
		b = wire.AppendVarint(b, 1, g.ID)
		b = wire.AppendVarint(b, 2, uint64(g.Seq))
		b = wire.AppendVarint(b, 3, uint64(g.Kind))
		b = wire.AppendString(b, 4, g.OwnerKey)
	}
	for _, v := range copies {
		c := m.Broadcast.Copies[v]
		cs := copySpecSize(c)
		b = protowire.AppendTag(b, fCopies, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(copyEntrySize(v, cs)))
		b = wire.AppendElemString(b, 1, string(v))
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(cs))
		b = wire.AppendString(b, 1, c.Role)
		b = wire.AppendBytes(b, 2, c.Payload)
		b = wire.AppendBool(b, 3, c.HasPayload)
	}
	for _, v := range m.Broadcast.AppendFirst {
		b = wire.AppendElemString(b, fAppendFirst, string(v))
	}
	return b, nil
}

// checkUTF8 refuses a string field that is not UTF-8.
func (m *Message) checkUTF8() error {
	ok := utf8.ValidString(m.Type.Name) && utf8.ValidString(string(m.IdempotencyKey)) &&
		utf8.ValidString(m.TraceParent) && utf8.ValidString(m.TraceState)
	for k, v := range m.Properties {
		ok = ok && utf8.ValidString(k) && utf8.ValidString(v)
	}
	for _, v := range m.Broadcast.VChannels {
		ok = ok && utf8.ValidString(string(v))
	}
	for _, k := range m.Broadcast.ResourceKeys {
		ok = ok && utf8.ValidString(k.Name)
	}
	if r := m.Replicate; r != nil {
		ok = ok && utf8.ValidString(r.SourceCluster) && utf8.ValidString(string(r.SourcePChannel))
	}
	if g := m.Group; g != nil {
		ok = ok && utf8.ValidString(g.OwnerKey)
	}
	for v, c := range m.Broadcast.Copies {
		ok = ok && utf8.ValidString(string(v)) && utf8.ValidString(c.Role)
	}
	for _, v := range m.Broadcast.AppendFirst {
		ok = ok && utf8.ValidString(string(v))
	}
	if !ok {
		return wire.ErrUTF8
	}
	return nil
}

// size is the encoded size of m.
func (m *Message) size(props []string, copies []VChannel) int {
	n := wire.StringSize(fTypeName, m.Type.Name) + wire.VarintSize(fTypeVersion, uint64(m.Type.Version)) + wire.BytesSize(fPayload, m.Payload)
	for _, k := range props {
		n += protowire.SizeTag(fProperties) + protowire.SizeBytes(propertySize(k, m.Properties[k]))
	}
	n += wire.StringSize(fIdempotencyKey, string(m.IdempotencyKey)) + wire.StringSize(fTraceParent, m.TraceParent) +
		wire.StringSize(fTraceState, m.TraceState) + wire.VarintSize(fBroadcastID, m.Broadcast.ID)
	for _, v := range m.Broadcast.VChannels {
		n += protowire.SizeTag(fVChannels) + protowire.SizeBytes(len(v))
	}
	for _, k := range m.Broadcast.ResourceKeys {
		n += protowire.SizeTag(fResourceKeys) + protowire.SizeBytes(keySize(k))
	}
	n += wire.BoolSize(fAckSyncUp, m.Broadcast.AckSyncUp)
	if r := m.Replicate; r != nil {
		n += protowire.SizeTag(fReplicate) + protowire.SizeBytes(replicateSize(r))
	}
	if g := m.Group; g != nil {
		n += protowire.SizeTag(fGroup) + protowire.SizeBytes(groupSize(g))
	}
	for _, v := range copies {
		n += protowire.SizeTag(fCopies) + protowire.SizeBytes(copyEntrySize(v, copySpecSize(m.Broadcast.Copies[v])))
	}
	for _, v := range m.Broadcast.AppendFirst {
		n += protowire.SizeTag(fAppendFirst) + protowire.SizeBytes(len(v))
	}
	return n
}

func propertySize(k, v string) int {
	return protowire.SizeTag(1) + protowire.SizeBytes(len(k)) + protowire.SizeTag(2) + protowire.SizeBytes(len(v))
}

func keySize(k resource.Key) int {
	return wire.VarintSize(1, uint64(k.Domain)) + wire.StringSize(2, k.Name) + wire.BoolSize(3, k.Mode == resource.Exclusive)
}

func replicateSize(r *ReplicateHeader) int {
	return wire.StringSize(1, r.SourceCluster) + wire.StringSize(2, string(r.SourcePChannel)) + wire.VarintSize(3, r.SourceMessageID) +
		wire.VarintSize(4, r.SourceTimeTick)
}

func groupSize(g *GroupHeader) int {
	return wire.VarintSize(1, g.ID) + wire.VarintSize(2, uint64(g.Seq)) + wire.VarintSize(3, uint64(g.Kind)) + wire.StringSize(4, g.OwnerKey)
}

func copySpecSize(c CopySpec) int {
	return wire.StringSize(1, c.Role) + wire.BytesSize(2, c.Payload) + wire.BoolSize(3, c.HasPayload)
}

func copyEntrySize(v VChannel, specSize int) int {
	return protowire.SizeTag(1) + protowire.SizeBytes(len(v)) + protowire.SizeTag(2) + protowire.SizeBytes(specSize)
}
