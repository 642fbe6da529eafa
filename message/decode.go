package message

import (
	"fmt"
	"unicode/utf8"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/walcast/walcast/internal/wire"
	"github.com/walcast/walcast/resource"
)

// Field numbers of durablepb.Message and the messages it holds
// (proto/walcast/durable/v1/durable.proto).
const (
	fTypeName       protowire.Number = 1
	fTypeVersion    protowire.Number = 2
	fPayload        protowire.Number = 3
	fProperties     protowire.Number = 4
	fIdempotencyKey protowire.Number = 5
	fTraceParent    protowire.Number = 6
	fTraceState     protowire.Number = 7
	fBroadcastID    protowire.Number = 8
	fVChannels      protowire.Number = 9
	fResourceKeys   protowire.Number = 10
	fAckSyncUp      protowire.Number = 11
	fReplicate      protowire.Number = 12
	fGroup          protowire.Number = 13
	fCopies         protowire.Number = 14
	fAppendFirst    protowire.Number = 15
)

// decode reads the wire format of a durablepb.Message into m without
// reflection or an intermediate message (every copy a node reads and every
// record the engine decodes goes through here). It reads it as
// proto.Unmarshal does: the last occurrence of a scalar wins, repeated
// fields append, occurrences of a message field merge, the last map entry
// of a key wins, unknown fields and known fields of an unexpected wire
// type are skipped, strings must be UTF-8; bytes are copied and empty ones
// are nil. TestUnmarshalMatchesProto checks it against proto.Unmarshal.
func decode(b []byte, m *Message) error {
	sa := &strArena{}
	presize(b, m, sa)
	groupKind := int32(-1) // -1: no group
	err := wire.Fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if num == fProperties && m.Properties == nil {
			// proto.Unmarshal makes the map on the field's tag, even
			// when its wire type then makes it an unknown field.
			m.Properties = map[string]string{}
		}
		switch typ {
		case protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			switch num {
			case fTypeVersion:
				m.Type.Version = uint32(v)
			case fBroadcastID:
				m.Broadcast.ID = v
			case fAckSyncUp:
				m.Broadcast.AckSyncUp = v != 0
			default:
				return protowire.ConsumeFieldValue(num, typ, b), nil
			}
			return n, nil
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return n, nil
			}
			var err error
			switch num {
			case fTypeName:
				m.Type.Name, err = sa.str(v)
			case fPayload:
				m.Payload = wire.CopyBytes(v)
			case fProperties:
				err = m.decodeProperty(v, sa)
			case fIdempotencyKey:
				var s string
				s, err = sa.str(v)
				m.IdempotencyKey = IdempotencyKey(s)
			case fTraceParent:
				m.TraceParent, err = sa.str(v)
			case fTraceState:
				m.TraceState, err = sa.str(v)
			case fVChannels, fAppendFirst:
				var s string
				if s, err = sa.str(v); num == fVChannels {
					m.Broadcast.VChannels = append(m.Broadcast.VChannels, VChannel(s))
				} else {
					m.Broadcast.AppendFirst = append(m.Broadcast.AppendFirst, VChannel(s))
				}
			case fResourceKeys:
				err = m.decodeResourceKey(v, sa)
			case fReplicate:
				if m.Replicate == nil {
					m.Replicate = &ReplicateHeader{}
				}
				err = decodeReplicate(v, m.Replicate, sa)
			case fGroup:
				if m.Group == nil {
					m.Group, groupKind = &GroupHeader{}, 0
				}
				err = decodeGroup(v, m.Group, &groupKind, sa)
			case fCopies:
				err = m.decodeCopy(v)
			default:
				return n, nil
			}
			return n, err
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
	if err != nil {
		return err
	}
	if m.Group != nil {
		if groupKind < int32(GroupBegin) || groupKind > int32(GroupRollback) {
			return fmt.Errorf("group kind %d", groupKind)
		}
		m.Group.Kind = GroupKind(groupKind)
	}
	return nil
}

// presize gives m's repeated fields the capacity b holds for them, so that
// decoding them allocates each once instead of growing it, and sizes sa to
// hold m's strings (a cheap pass over the tags; an error is left to decode
// to report).
func presize(b []byte, m *Message, sa *strArena) {
	var vcs, keys, first, strs int
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			break
		}
		b = b[n:]
		if typ == protowire.BytesType {
			switch num {
			case fVChannels:
				vcs++
			case fResourceKeys:
				keys++
			case fAppendFirst:
				first++
			}
			switch num {
			case fTypeName, fIdempotencyKey, fTraceParent, fTraceState, fVChannels, fAppendFirst,
				fResourceKeys, fProperties, fReplicate, fGroup:
				// A string's length, or a nested message's: its strings
				// take no more than that.
				strs += n
			}
		}
	}
	if strs > 0 {
		sa.buf = make([]byte, 0, strs)
	}
	if vcs > 1 && m.Broadcast.VChannels == nil {
		m.Broadcast.VChannels = make([]VChannel, 0, vcs)
	}
	if keys > 1 && m.Broadcast.ResourceKeys == nil {
		m.Broadcast.ResourceKeys = make([]resource.Key, 0, keys)
	}
	if first > 1 && m.Broadcast.AppendFirst == nil {
		m.Broadcast.AppendFirst = make([]VChannel, 0, first)
	}
}

// strArena holds the strings of one decoded message in one allocation
// instead of one each (a message has a dozen: its type, key, targets and
// resource keys). Its buffer is written only past what was handed out and
// never grows, so every string given stays immutable.
type strArena struct {
	buf []byte
}

// str is v as a string, from the arena while it has room; not UTF-8 is
// wire.ErrUTF8.
func (sa *strArena) str(v []byte) (string, error) {
	if !utf8.Valid(v) {
		return "", wire.ErrUTF8
	}
	if len(v) == 0 {
		return "", nil
	}
	if cap(sa.buf)-len(sa.buf) < len(v) {
		return string(v), nil
	}
	at := len(sa.buf)
	sa.buf = append(sa.buf, v...)
	return unsafe.String(&sa.buf[at], len(v)), nil
}

// consume is wire.ConsumeString with the string from the arena.
func (sa *strArena) consume(b []byte) (string, int, error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return "", n, nil
	}
	s, err := sa.str(v)
	return s, n, err
}

// decodeProperty reads one entry of the properties map.
func (m *Message) decodeProperty(b []byte, sa *strArena) error {
	var k, v string
	err := wire.Fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if typ != protowire.BytesType || (num != 1 && num != 2) {
			return protowire.ConsumeFieldValue(num, typ, b), nil
		}
		s, n, err := sa.consume(b)
		if num == 1 {
			k = s
		} else {
			v = s
		}
		return n, err
	})
	if err != nil {
		return err
	}
	if m.Properties == nil {
		m.Properties = map[string]string{}
	}
	m.Properties[k] = v
	return nil
}

// decodeResourceKey reads one ResourceKey.
func (m *Message) decodeResourceKey(b []byte, sa *strArena) error {
	var (
		domain    uint32
		name      string
		exclusive bool
	)
	err := wire.Fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case typ == protowire.VarintType && (num == 1 || num == 3):
			v, n := protowire.ConsumeVarint(b)
			if num == 1 {
				domain = uint32(v)
			} else {
				exclusive = v != 0
			}
			return n, nil
		case typ == protowire.BytesType && num == 2:
			v, n, err := sa.consume(b)
			name = v
			return n, err
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
	if err != nil {
		return err
	}
	if domain > 0xffff {
		return fmt.Errorf("resource domain %d", domain)
	}
	mode := resource.Shared
	if exclusive {
		mode = resource.Exclusive
	}
	m.Broadcast.ResourceKeys = append(m.Broadcast.ResourceKeys, resource.Key{Domain: resource.Domain(domain), Name: name, Mode: mode})
	return nil
}

func decodeReplicate(b []byte, r *ReplicateHeader, sa *strArena) error {
	return wire.Fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case typ == protowire.BytesType && (num == 1 || num == 2):
			s, n, err := sa.consume(b)
			if num == 1 {
				r.SourceCluster = s
			} else {
				r.SourcePChannel = PChannel(s)
			}
			return n, err
		case typ == protowire.VarintType && (num == 3 || num == 4):
			v, n := protowire.ConsumeVarint(b)
			if num == 3 {
				r.SourceMessageID = v
			} else {
				r.SourceTimeTick = v
			}
			return n, nil
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
}

func decodeGroup(b []byte, g *GroupHeader, kind *int32, sa *strArena) error {
	return wire.Fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case typ == protowire.VarintType && num >= 1 && num <= 3:
			v, n := protowire.ConsumeVarint(b)
			switch num {
			case 1:
				g.ID = v
			case 2:
				g.Seq = uint32(v)
			case 3:
				*kind = int32(v)
			}
			return n, nil
		case typ == protowire.BytesType && num == 4:
			v, n, err := sa.consume(b)
			g.OwnerKey = v
			return n, err
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
}

// decodeCopy reads one entry of the copies map (a value given twice in
// one entry merges, as a message does).
func (m *Message) decodeCopy(b []byte) error {
	var (
		k string
		c CopySpec
	)
	err := wire.Fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if typ != protowire.BytesType || (num != 1 && num != 2) {
			return protowire.ConsumeFieldValue(num, typ, b), nil
		}
		raw, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return n, nil
		}
		if num == 1 {
			var err error
			k, err = wire.String(raw)
			return n, err
		}
		return n, decodeCopySpec(raw, &c)
	})
	if err != nil {
		return err
	}
	if m.Broadcast.Copies == nil {
		m.Broadcast.Copies = map[VChannel]CopySpec{}
	}
	m.Broadcast.Copies[VChannel(k)] = c
	return nil
}

func decodeCopySpec(b []byte, c *CopySpec) error {
	return wire.Fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case typ == protowire.BytesType && (num == 1 || num == 2):
			raw, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return n, nil
			}
			if num == 2 {
				c.Payload = wire.CopyBytes(raw)
				return n, nil
			}
			var err error
			c.Role, err = wire.String(raw)
			return n, err
		case typ == protowire.VarintType && num == 3:
			v, n := protowire.ConsumeVarint(b)
			c.HasPayload = v != 0
			return n, nil
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
}

// Identity is what names a stored broadcast without its payload and
// targets: its type, its idempotency key and, in a group, the ownership it
// belongs to (the engine's collector needs no more of a tombstone).
type Identity struct {
	Type           Type
	IdempotencyKey IdempotencyKey
	// OwnerKey is the group's owner key; empty outside a group or in a
	// transaction.
	OwnerKey string
}

// DecodeIdentity reads only the identity of an encoded message: the same
// values Unmarshal gives those fields, without decoding the rest (which is
// still walked, so bytes Unmarshal refuses for their framing are refused
// here too).
func DecodeIdentity(b []byte) (Identity, error) {
	var id Identity
	err := wire.Fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case typ == protowire.VarintType && num == fTypeVersion:
			v, n := protowire.ConsumeVarint(b)
			id.Type.Version = uint32(v)
			return n, nil
		case typ == protowire.BytesType && (num == fTypeName || num == fIdempotencyKey || num == fGroup):
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return n, nil
			}
			var err error
			switch num {
			case fTypeName:
				id.Type.Name, err = wire.String(v)
			case fIdempotencyKey:
				var s string
				s, err = wire.String(v)
				id.IdempotencyKey = IdempotencyKey(s)
			case fGroup:
				err = wire.Fields(v, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
					if typ != protowire.BytesType || num != 4 {
						return protowire.ConsumeFieldValue(num, typ, b), nil
					}
					v, n, err := wire.ConsumeString(b)
					id.OwnerKey = v
					return n, err
				})
			}
			return n, err
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
	if err != nil {
		return Identity{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return id, nil
}
