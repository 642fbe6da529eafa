package apicodec

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/api/walcastv1"
)

// appendBroadcastResponse appends r's wire form to dst, as proto.Marshal
// would write it (fields in number order, zero values left out, map entries
// in map order); false, with dst as it was, for what it leaves to
// protobuf-go.
func appendBroadcastResponse(dst []byte, r *walcastv1.BroadcastResponse) ([]byte, bool) {
	if len(r.ProtoReflect().GetUnknown()) > 0 {
		return dst, false
	}
	b := dst
	if r.BroadcastId != 0 {
		b = protowire.AppendTag(b, respBroadcastID, protowire.VarintType)
		b = protowire.AppendVarint(b, r.BroadcastId)
	}
	for v, cp := range r.Appends {
		if !utf8.ValidString(v) || cp != nil && len(cp.ProtoReflect().GetUnknown()) > 0 {
			return dst, false
		}
		n := checkpointSize(cp)
		b = protowire.AppendTag(b, respAppends, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(1+protowire.SizeBytes(len(v))+1+protowire.SizeBytes(n)))
		b = protowire.AppendTag(b, mapKey, protowire.BytesType)
		b = protowire.AppendString(b, v)
		b = protowire.AppendTag(b, mapValue, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(n))
		b = appendCheckpoint(b, cp)
	}
	if r.Duplicated {
		b = protowire.AppendTag(b, respDuplicated, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	if o := r.Outcome; o != nil {
		if len(o.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(o.Detail) {
			return dst, false
		}
		b = protowire.AppendTag(b, respOutcome, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(outcomeSize(o)))
		b = appendOutcome(b, o)
	}
	if w := r.Window; w != nil {
		// Only keyed broadcasts have one: protobuf-go writes it (no
		// maps in it).
		b = protowire.AppendTag(b, respWindow, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(proto.Size(w)))
		var err error
		if b, err = (proto.MarshalOptions{UseCachedSize: true}).MarshalAppend(b, w); err != nil {
			return dst, false
		}
	}
	for v, x := range r.Extras {
		if !utf8.ValidString(v) {
			return dst, false
		}
		b = protowire.AppendTag(b, respExtras, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(1+protowire.SizeBytes(len(v))+1+protowire.SizeBytes(len(x))))
		b = protowire.AppendTag(b, mapKey, protowire.BytesType)
		b = protowire.AppendString(b, v)
		b = protowire.AppendTag(b, mapValue, protowire.BytesType)
		b = protowire.AppendBytes(b, x)
	}
	return b, true
}

func checkpointSize(cp *walcastv1.Checkpoint) int {
	n := 0
	if v := cp.GetMessageId(); v != 0 {
		n += 1 + protowire.SizeVarint(v)
	}
	if v := cp.GetTimeTick(); v != 0 {
		n += 1 + protowire.SizeVarint(v)
	}
	if v := cp.GetLastConfirmed(); v != 0 {
		n += 1 + protowire.SizeVarint(v)
	}
	return n
}

func appendCheckpoint(b []byte, cp *walcastv1.Checkpoint) []byte {
	if v := cp.GetMessageId(); v != 0 {
		b = protowire.AppendTag(b, cpMessageID, protowire.VarintType)
		b = protowire.AppendVarint(b, v)
	}
	if v := cp.GetTimeTick(); v != 0 {
		b = protowire.AppendTag(b, cpTimeTick, protowire.VarintType)
		b = protowire.AppendVarint(b, v)
	}
	if v := cp.GetLastConfirmed(); v != 0 {
		b = protowire.AppendTag(b, cpLastConfirmed, protowire.VarintType)
		b = protowire.AppendVarint(b, v)
	}
	return b
}

func outcomeSize(o *walcastv1.Outcome) int {
	n := 0
	if s := o.Status; s != 0 {
		n += 1 + protowire.SizeVarint(uint64(int64(s)))
	}
	if len(o.Detail) > 0 {
		n += 1 + protowire.SizeBytes(len(o.Detail))
	}
	if len(o.Data) > 0 {
		n += 1 + protowire.SizeBytes(len(o.Data))
	}
	return n
}

func appendOutcome(b []byte, o *walcastv1.Outcome) []byte {
	if s := o.Status; s != 0 {
		b = protowire.AppendTag(b, outcomeStatus, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(int64(s)))
	}
	if len(o.Detail) > 0 {
		b = protowire.AppendTag(b, outcomeDetail, protowire.BytesType)
		b = protowire.AppendString(b, o.Detail)
	}
	if len(o.Data) > 0 {
		b = protowire.AppendTag(b, outcomeData, protowire.BytesType)
		b = protowire.AppendBytes(b, o.Data)
	}
	return b
}
