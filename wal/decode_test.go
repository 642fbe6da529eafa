package wal

import (
	"bytes"
	"crypto/sha256"
	"google.golang.org/protobuf/proto"
	"math/rand/v2"

	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/walcast/walcast/internal/durablepb"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/walcast/walcast/message"
)

func rawMessage(t *testing.T, id uint64) []byte {
	t.Helper()
	raw, err := message.Marshal(&message.Message{Type: message.Type{Name: "T", Version: 1}, Broadcast: message.BroadcastHeader{ID: id}})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// protoDecode is the reference decoding of an entry, through
// proto.Unmarshal.
func protoDecode(offset uint64, data []byte) ([]Copy, error) {
	var e durablepb.Entry
	if err := proto.Unmarshal(data, &e); err != nil {
		return nil, fmt.Errorf("%w at offset %d: %w", ErrCorrupt, offset, err)
	}
	var out []Copy
	idx := 0
	for _, it := range e.Items {
		m, err := message.Unmarshal(it.Message)
		if err != nil {
			return nil, fmt.Errorf("%w at offset %d: %w", ErrCorrupt, offset, err)
		}
		for _, v := range it.Vchannels {
			pos := Position(offset, idx)
			out = append(out, Copy{VChannel: message.VChannel(v), Message: m, Offset: offset,
				Checkpoint: Checkpoint{MessageID: pos, TimeTick: pos, LastConfirmed: pos}})
			idx++
		}
	}
	return out, nil
}

// TestDecodeFilteredMatchesDecode: decode, with a reader's filter or none
// (Decode), returns exactly the copies of the reference proto decoding the
// filter keeps, at the same positions, also for
// encodings with unknown fields, fields of unexpected wire types, a repeated
// message field and vchannels written before the message.
func TestDecodeFilteredMatchesDecode(t *testing.T) {
	items := []Item{
		{Message: rawMessage(t, 1), VChannels: []message.VChannel{"p0/a", "p1/a", "p0/b"}},
		{Message: rawMessage(t, 2), VChannels: []message.VChannel{"p1/b"}},
		{Message: rawMessage(t, 3), VChannels: []message.VChannel{"p2/a", "p0/a"}},
	}
	encoded, _, err := Encode(items)
	if err != nil {
		t.Fatal(err)
	}
	// The same items written by hand, oddly.
	var odd []byte
	odd = protowire.AppendTag(odd, 9, protowire.VarintType) // unknown
	odd = protowire.AppendVarint(odd, 5)
	for i, it := range items {
		var b []byte
		for _, v := range it.VChannels {
			b = protowire.AppendTag(b, itemVChannels, protowire.BytesType)
			b = protowire.AppendString(b, string(v))
		}
		b = protowire.AppendTag(b, itemVChannels, protowire.Fixed32Type) // wrong type: skipped
		b = protowire.AppendFixed32(b, 7)
		b = protowire.AppendTag(b, itemMessage, protowire.BytesType) // replaced below
		b = protowire.AppendBytes(b, rawMessage(t, 99))
		b = protowire.AppendTag(b, 15, protowire.BytesType) // unknown
		b = protowire.AppendBytes(b, []byte("zz"))
		b = protowire.AppendTag(b, itemMessage, protowire.BytesType)
		b = protowire.AppendBytes(b, it.Message)
		odd = protowire.AppendTag(odd, entryItems, protowire.BytesType)
		odd = protowire.AppendBytes(odd, b)
		if i == 0 {
			odd = protowire.AppendTag(odd, entryItems, protowire.Fixed64Type) // wrong type: skipped
			odd = protowire.AppendFixed64(odd, 1)
		}
	}
	filters := []*filter{nil, {p: "p0"}, {p: "p1"}, {p: "p2"}, {p: "p3"},
		{p: "p0", vs: map[message.VChannel]bool{"p0/a": true}}, {p: "p1", vs: map[message.VChannel]bool{"p0/a": true}}}
	for ei, data := range [][]byte{encoded, odd} {
		all, err := protoDecode(5, data)
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 6 {
			t.Fatalf("entry %d: Decode returned %d copies", ei, len(all))
		}
		for _, f := range filters {
			var want []string
			for _, c := range all {
				if f == nil || c.VChannel.PChannel() == f.p && (f.vs == nil || f.vs[c.VChannel]) {
					want = append(want, fmt.Sprintf("%s@%d/%d id %d", c.VChannel, c.Checkpoint.MessageID, c.Offset, c.Message.Broadcast.ID))
				}
			}
			got, err := decode(5, data, Header{}, f)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("entry %d, filter %+v: %d copies, want %d", ei, f, len(got), len(want))
			}
			for i, c := range got {
				s := fmt.Sprintf("%s@%d/%d id %d", c.VChannel, c.Checkpoint.MessageID, c.Offset, c.Message.Broadcast.ID)
				if s != want[i] || c.LastInEntry != (i == len(got)-1) {
					t.Fatalf("entry %d, filter %+v: copy %d %s (last %v), want %s", ei, f, i, s, c.LastInEntry, want[i])
				}
			}
		}
	}
	for _, bad := range [][]byte{{0xff, 0xff, 0xff}, encoded[:len(encoded)-1],
		protowire.AppendBytes(protowire.AppendTag(nil, entryItems, protowire.BytesType),
			protowire.AppendBytes(protowire.AppendTag(nil, itemVChannels, protowire.BytesType), []byte{'p', '0', '/', 0xff})),
		// A field number above protobuf's largest, at the top and in an
		// item: ConsumeTag takes it, proto.Unmarshal does not.
		protowire.AppendVarint(protowire.AppendTag(slices.Clone(encoded), protowire.MaxValidNumber+1, protowire.VarintType), 1),
		protowire.AppendBytes(protowire.AppendTag(nil, entryItems, protowire.BytesType),
			protowire.AppendVarint(protowire.AppendTag(nil, protowire.MaxValidNumber+1, protowire.VarintType), 1))} {
		_, derr := protoDecode(0, bad)
		_, err := decode(0, bad, Header{}, &filter{p: "p0"})
		if !errors.Is(err, ErrCorrupt) || !errors.Is(derr, ErrCorrupt) {
			t.Fatalf("corrupt entry %x: decode %v, Decode %v", bad, err, derr)
		}
	}
}

// encodeEntryProto is encodeEntry through proto.Marshal, as it was before
// the hand-written encoder: the reference its bytes must equal.
func encodeEntryProto(h Header, items []Item) (data []byte, sum [sha256.Size]byte, err error) {
	n := 0
	for _, it := range items {
		n += len(it.VChannels)
	}
	if n == 0 || n > MaxCopiesPerEntry {
		return nil, sum, fmt.Errorf("%w: %d copies in one entry", ErrTooLarge, n)
	}
	pbs := make([]durablepb.Item, len(items))
	ptrs := make([]*durablepb.Item, len(items))
	names := make([]string, n)
	for i, it := range items {
		vs := names[:len(it.VChannels):len(it.VChannels)]
		names = names[len(it.VChannels):]
		for j, v := range it.VChannels {
			vs[j] = string(v)
		}
		pbs[i].Message, pbs[i].Vchannels = it.Message, vs
		ptrs[i] = &pbs[i]
	}
	e := durablepb.Entry{Items: ptrs, Cluster: h.Cluster, ReplicatedFrom: h.ReplicatedFrom, Generation: h.Generation}
	data, err = proto.MarshalOptions{Deterministic: true}.Marshal(&e)
	if err != nil {
		return nil, sum, err
	}
	return data, sha256.Sum256(data), nil
}

// TestEncodeEntryMatchesProto: encodeEntry writes the bytes of
// proto.MarshalOptions{Deterministic: true}, so entry bytes (and the dedup
// ids made from them) are what they always were.
func TestEncodeEntryMatchesProto(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for i := range 2000 {
		var items []Item
		for j := range 1 + r.IntN(4) {
			it := Item{}
			if r.IntN(5) != 0 {
				it.Message = rawMessage(t, uint64(i*10+j))
			}
			for k := range 1 + r.IntN(3) {
				v := message.VChannel(fmt.Sprintf("wal-%d/v%d", k, r.IntN(1000)))
				if r.IntN(10) == 0 {
					v = ""
				}
				it.VChannels = append(it.VChannels, v)
			}
			items = append(items, it)
		}
		h := Header{}
		if r.IntN(2) == 0 {
			h.Cluster = "east"
		}
		if r.IntN(3) == 0 {
			h.ReplicatedFrom = "west"
		}
		if r.IntN(3) == 0 {
			h.Generation = r.Uint64N(1 << uint(r.IntN(64)))
		}
		got, gsum, err := encodeEntry(h, items)
		want, wsum, werr := encodeEntryProto(h, items)
		if err != nil || werr != nil {
			t.Fatal(err, werr)
		}
		if !bytes.Equal(got, want) || gsum != wsum {
			t.Fatalf("entry %d: encodeEntry\n%x\nproto.Marshal\n%x", i, got, want)
		}
		if cap(got) != len(got) {
			t.Fatalf("entry %d: %d bytes in a buffer of %d", i, len(got), cap(got))
		}
		if dh, err := DecodeHeader(0, got); err != nil || dh != h {
			t.Fatalf("entry %d: header %+v decoded as %+v, %v", i, h, dh, err)
		}
	}
}
