package message

import (
	"slices"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

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
	b = appendString(b, fTypeName, m.Type.Name)
	b = appendVarint(b, fTypeVersion, uint64(m.Type.Version))
	b = appendBytes(b, fPayload, m.Payload)
	for _, k := range props {
		b = protowire.AppendTag(b, fProperties, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(propertySize(k, m.Properties[k])))
		b = appendEntryString(b, 1, k)
		b = appendEntryString(b, 2, m.Properties[k])
	}
	b = appendString(b, fIdempotencyKey, string(m.IdempotencyKey))
	b = appendString(b, fTraceParent, m.TraceParent)
	b = appendString(b, fTraceState, m.TraceState)
	b = appendVarint(b, fBroadcastID, m.Broadcast.ID)
	for _, v := range m.Broadcast.VChannels {
		b = appendEntryString(b, fVChannels, string(v))
	}
	for _, k := range m.Broadcast.ResourceKeys {
		b = protowire.AppendTag(b, fResourceKeys, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(keySize(k)))
		b = appendVarint(b, 1, uint64(k.Domain))
		b = appendString(b, 2, k.Name)
		b = appendBool(b, 3, k.Mode == resource.Exclusive)
	}
	b = appendBool(b, fAckSyncUp, m.Broadcast.AckSyncUp)
	if r := m.Replicate; r != nil {
		b = protowire.AppendTag(b, fReplicate, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(replicateSize(r)))
		b = appendString(b, 1, r.SourceCluster)
		b = appendString(b, 2, string(r.SourcePChannel))
		b = appendVarint(b, 3, r.SourceMessageID)
		b = appendVarint(b, 4, r.SourceTimeTick)
	}
	if g := m.Group; g != nil {
		b = protowire.AppendTag(b, fGroup, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(groupSize(g)))
		b = appendVarint(b, 1, g.ID)
		b = appendVarint(b, 2, uint64(g.Seq))
		b = appendVarint(b, 3, uint64(g.Kind))
		b = appendString(b, 4, g.OwnerKey)
	}
	for _, v := range copies {
		c := m.Broadcast.Copies[v]
		cs := copySpecSize(c)
		b = protowire.AppendTag(b, fCopies, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(copyEntrySize(v, cs)))
		b = appendEntryString(b, 1, string(v))
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(cs))
		b = appendString(b, 1, c.Role)
		b = appendBytes(b, 2, c.Payload)
		b = appendBool(b, 3, c.HasPayload)
	}
	for _, v := range m.Broadcast.AppendFirst {
		b = appendEntryString(b, fAppendFirst, string(v))
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
		return errUTF8
	}
	return nil
}

// size is the encoded size of m.
func (m *Message) size(props []string, copies []VChannel) int {
	n := stringSize(fTypeName, m.Type.Name) + varintSize(fTypeVersion, uint64(m.Type.Version)) + bytesSize(fPayload, m.Payload)
	for _, k := range props {
		n += protowire.SizeTag(fProperties) + protowire.SizeBytes(propertySize(k, m.Properties[k]))
	}
	n += stringSize(fIdempotencyKey, string(m.IdempotencyKey)) + stringSize(fTraceParent, m.TraceParent) +
		stringSize(fTraceState, m.TraceState) + varintSize(fBroadcastID, m.Broadcast.ID)
	for _, v := range m.Broadcast.VChannels {
		n += protowire.SizeTag(fVChannels) + protowire.SizeBytes(len(v))
	}
	for _, k := range m.Broadcast.ResourceKeys {
		n += protowire.SizeTag(fResourceKeys) + protowire.SizeBytes(keySize(k))
	}
	n += boolSize(fAckSyncUp, m.Broadcast.AckSyncUp)
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
	return varintSize(1, uint64(k.Domain)) + stringSize(2, k.Name) + boolSize(3, k.Mode == resource.Exclusive)
}

func replicateSize(r *ReplicateHeader) int {
	return stringSize(1, r.SourceCluster) + stringSize(2, string(r.SourcePChannel)) + varintSize(3, r.SourceMessageID) +
		varintSize(4, r.SourceTimeTick)
}

func groupSize(g *GroupHeader) int {
	return varintSize(1, g.ID) + varintSize(2, uint64(g.Seq)) + varintSize(3, uint64(g.Kind)) + stringSize(4, g.OwnerKey)
}

func copySpecSize(c CopySpec) int {
	return stringSize(1, c.Role) + bytesSize(2, c.Payload) + boolSize(3, c.HasPayload)
}

func copyEntrySize(v VChannel, specSize int) int {
	return protowire.SizeTag(1) + protowire.SizeBytes(len(v)) + protowire.SizeTag(2) + protowire.SizeBytes(specSize)
}

func stringSize(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(s))
}

func bytesSize(num protowire.Number, v []byte) int {
	if len(v) == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(v))
}

func varintSize(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func boolSize(num protowire.Number, v bool) int {
	if !v {
		return 0
	}
	return protowire.SizeTag(num) + 1
}

// appendEntryString writes a string field even if it is empty (a repeated
// element, a map entry's key or value).
func appendEntryString(b []byte, num protowire.Number, s string) []byte {
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return appendEntryString(b, num, s)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

func appendBool(b []byte, num protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), 1)
}
