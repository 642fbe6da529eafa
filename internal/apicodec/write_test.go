package apicodec

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/walcast/walcast/api/walcastv1"
)

func codecResponses() map[string]*walcastv1.BroadcastResponse {
	cp := func(id uint64) *walcastv1.Checkpoint {
		return &walcastv1.Checkpoint{MessageId: id, TimeTick: id << 40, LastConfirmed: id - 1}
	}
	return map[string]*walcastv1.BroadcastResponse{
		"empty": {},
		"four targets": {BroadcastId: 1 << 33, Appends: map[string]*walcastv1.Checkpoint{
			"wal-0/v0": cp(7), "wal-1/v1": cp(8), "wal-2/v2": cp(9), "wal-3/v3": cp(1 << 60)},
			Outcome: &walcastv1.Outcome{Status: walcastv1.OutcomeStatus_OUTCOME_STATUS_SUCCEEDED}},
		"every field": {BroadcastId: 3, Appends: map[string]*walcastv1.Checkpoint{"wal-0/a": cp(2), "": {}, "wal-1/z": nil},
			Duplicated: true,
			Outcome:    &walcastv1.Outcome{Status: walcastv1.OutcomeStatus_OUTCOME_STATUS_FAILED, Detail: "callback: übel", Data: []byte{0, 1, 2}},
			Window: &walcastv1.Window{FirstSeen: timestamppb.New(timestamppb.Now().AsTime()), CountHeadroom: -1, Class: "ddl",
				ClassEarlyEvicted: 4},
			Extras: map[string][]byte{"wal-0/a": []byte("result"), "wal-1/z": nil}},
		"negative status": {Outcome: &walcastv1.Outcome{Status: -3}},
	}
}

// TestCodecWritesWhatProtoReads: a BroadcastResponse written by the
// hand-written encoder reads back, with protobuf-go, as the message that
// protobuf-go itself writes; other messages are protobuf-go's bytes.
func TestCodecWritesWhatProtoReads(t *testing.T) {
	for name, r := range codecResponses() {
		got, err := Codec{}.MarshalAppend([]byte("prefix"), r)
		if err != nil || string(got[:6]) != "prefix" {
			t.Fatalf("%s: %v, or dst not kept", name, err)
		}
		var back, want walcastv1.BroadcastResponse
		if err := proto.Unmarshal(got[6:], &back); err != nil {
			t.Fatalf("%s: protobuf-go cannot read it: %v", name, err)
		}
		raw, _ := proto.Marshal(r)
		if err := proto.Unmarshal(raw, &want); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&back, &want) {
			t.Errorf("%s: read back %v, want %v", name, &back, &want)
		}
		if n := len(got) - 6; n != proto.Size(r) {
			t.Errorf("%s: %d bytes, protobuf-go writes %d", name, n, proto.Size(r))
		}
	}
	other := &walcastv1.Task{Id: 5, Type: "X.v1"}
	got, err := Codec{}.Marshal(other)
	if want, _ := proto.Marshal(other); err != nil || string(got) != string(want) {
		t.Errorf("a Task: %x, %v; want protobuf-go's %x", got, err, want)
	}
}

// TestCodecLeavesToProtoWhatItDoesNotWrite: a response with unknown
// fields keeps them, and one with a string protobuf-go refuses (not UTF-8)
// is refused with protobuf-go's error, as without the hand-written encoder.
func TestCodecLeavesToProtoWhatItDoesNotWrite(t *testing.T) {
	r := &walcastv1.BroadcastResponse{BroadcastId: 9}
	r.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1))
	got, err := Codec{}.Marshal(r)
	if want, _ := proto.Marshal(r); err != nil || string(got) != string(want) {
		t.Errorf("unknown fields: %x, %v; want protobuf-go's %x", got, err, want)
	}
	for _, bad := range []*walcastv1.BroadcastResponse{
		{Appends: map[string]*walcastv1.Checkpoint{"\xff": {}}},
		{Extras: map[string][]byte{"\xfe": nil}},
		{Outcome: &walcastv1.Outcome{Detail: "\xc3"}},
	} {
		_, want := proto.Marshal(bad)
		if _, err := (Codec{}).Marshal(bad); err == nil || want == nil || err.Error() != want.Error() {
			t.Errorf("%v: error %v, want protobuf-go's %v", bad, err, want)
		}
	}
}

// BenchmarkBroadcastResponseMarshal is the encoder against protobuf-go on
// the answer of a broadcast of four targets.
func BenchmarkBroadcastResponseMarshal(b *testing.B) {
	r := codecResponses()["four targets"]
	buf := make([]byte, 0, 512)
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, _ = Codec{}.MarshalAppend(buf[:0], r)
		}
	})
	b.Run("protobuf-go", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, _ = proto.MarshalOptions{}.MarshalAppend(buf[:0], r)
		}
	})
}
