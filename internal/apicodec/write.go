package apicodec

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/internal/wire"
)

// appendBroadcastResponse appends r's wire form to dst, as proto.Marshal
// would write it (fields in number order, zero values left out, map entries
// in map order); false, with dst as it was, for what it leaves to
// protobuf-go.
func appendBroadcastResponse(dst []byte, r *walcastv1.BroadcastResponse) ([]byte, bool) {
	if len(r.ProtoReflect().GetUnknown()) > 0 {
		return dst, false
	}
	b := wire.AppendVarint(dst, respBroadcastID, r.BroadcastId)
	for v, cp := range r.Appends {
		if !utf8.ValidString(v) || cp != nil && len(cp.ProtoReflect().GetUnknown()) > 0 {
			return dst, false
		}
		b = appendEntryHead(b, respAppends, v, checkpointSize(cp))
		b = appendCheckpoint(b, cp)
	}
	b = wire.AppendBool(b, respDuplicated, r.Duplicated)
	if o := r.Outcome; o != nil {
		if len(o.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(o.Detail) {
			return dst, false
		}
		b = appendHead(b, respOutcome, outcomeSize(o))
		b = appendOutcome(b, o)
	}
	if w := r.Window; w != nil {
		// Only keyed broadcasts have one: protobuf-go writes it (no
		// maps in it).
		b = appendHead(b, respWindow, proto.Size(w))
		var err error
		if b, err = (proto.MarshalOptions{UseCachedSize: true}).MarshalAppend(b, w); err != nil {
			return dst, false
		}
	}
	for v, x := range r.Extras {
		if !utf8.ValidString(v) {
			return dst, false
		}
		b = append(appendEntryHead(b, respExtras, v, len(x)), x...)
	}
	return b, true
}

// appendHead appends the tag and length of a message field of n bytes.
func appendHead(b []byte, num protowire.Number, n int) []byte {
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.BytesType), uint64(n))
}

// appendEntryHead appends a map entry with string key k up to its value's
// bytes (n of them): protobuf-go writes an entry's key and value even when
// they are empty.
func appendEntryHead(b []byte, num protowire.Number, k string, n int) []byte {
	b = appendHead(b, num, 1+protowire.SizeBytes(len(k))+1+protowire.SizeBytes(n))
	return appendHead(wire.AppendElemString(b, mapKey, k), mapValue, n)
}

func checkpointSize(cp *walcastv1.Checkpoint) int {
	return wire.VarintSize(cpMessageID, cp.GetMessageId()) + wire.VarintSize(cpTimeTick, cp.GetTimeTick()) +
		wire.VarintSize(cpLastConfirmed, cp.GetLastConfirmed())
}

func appendCheckpoint(b []byte, cp *walcastv1.Checkpoint) []byte {
	b = wire.AppendVarint(b, cpMessageID, cp.GetMessageId())
	b = wire.AppendVarint(b, cpTimeTick, cp.GetTimeTick())
	return wire.AppendVarint(b, cpLastConfirmed, cp.GetLastConfirmed())
}

func outcomeSize(o *walcastv1.Outcome) int {
	return wire.VarintSize(outcomeStatus, uint64(int64(o.Status))) + wire.StringSize(outcomeDetail, o.Detail) +
		wire.BytesSize(outcomeData, o.Data)
}

func appendOutcome(b []byte, o *walcastv1.Outcome) []byte {
	b = wire.AppendVarint(b, outcomeStatus, uint64(int64(o.Status)))
	b = wire.AppendString(b, outcomeDetail, o.Detail)
	return wire.AppendBytes(b, outcomeData, o.Data)
}
