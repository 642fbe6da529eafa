package apicodec

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/walcast/walcast/api/walcastv1"
)

// codecInputs are wire forms of BroadcastResponse: protobuf-go's, and ones
// only another writer makes (fields out of order, repeated, missing map
// keys or values, unknown fields, malformed bytes).
func codecInputs(t testing.TB) map[string][]byte {
	cp := func(id uint64) *walcastv1.Checkpoint {
		return &walcastv1.Checkpoint{MessageId: id, TimeTick: id << 40, LastConfirmed: id - 1}
	}
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tag := protowire.AppendTag
	entry := func(key string, keyed bool, value []byte, valued bool) []byte {
		var e []byte
		if keyed {
			e = protowire.AppendString(tag(e, 1, protowire.BytesType), key)
		}
		if valued {
			e = protowire.AppendBytes(tag(e, 2, protowire.BytesType), value)
		}
		return protowire.AppendBytes(tag(nil, 2, protowire.BytesType), e)
	}
	in := map[string][]byte{
		"empty": nil,
		"four targets": marshal(&walcastv1.BroadcastResponse{BroadcastId: 1 << 33, Appends: map[string]*walcastv1.Checkpoint{
			"wal-0/v0": cp(7), "wal-1/v1": cp(8), "wal-2/v2": cp(9), "wal-3/v3": cp(1 << 60)},
			Outcome: &walcastv1.Outcome{Status: walcastv1.OutcomeStatus_OUTCOME_STATUS_SUCCEEDED}}),
		"every field": marshal(&walcastv1.BroadcastResponse{BroadcastId: 3, Appends: map[string]*walcastv1.Checkpoint{"wal-0/a": cp(2), "": {}},
			Duplicated: true,
			Outcome:    &walcastv1.Outcome{Status: walcastv1.OutcomeStatus_OUTCOME_STATUS_FAILED, Detail: "callback: übel", Data: []byte{0, 1, 2}},
			Window:     &walcastv1.Window{FirstSeen: timestamppb.Now(), CountHeadroom: -1, Class: "ddl", ClassEarlyEvicted: 4},
			Extras:     map[string][]byte{"wal-0/a": []byte("result"), "wal-1/z": {}}}),
		"negative status": marshal(&walcastv1.BroadcastResponse{Outcome: &walcastv1.Outcome{Status: -3}}),
		"entry without key or value": slices.Concat(entry("", false, nil, false), entry("k", true, nil, false),
			entry("", false, marshal(cp(5)), true)),
		"value twice in an entry": entry("k", true, slices.Concat(marshal(&walcastv1.Checkpoint{MessageId: 1}), marshal(&walcastv1.Checkpoint{TimeTick: 2})), true),
		"key twice":               slices.Concat(entry("k", true, marshal(cp(1)), true), entry("k", true, marshal(cp(2)), true)),
		"id twice, last wins":     protowire.AppendVarint(tag(protowire.AppendVarint(tag(nil, 1, protowire.VarintType), 1), 1, protowire.VarintType), 2),
		"outcome twice merges": slices.Concat(
			protowire.AppendBytes(tag(nil, 4, protowire.BytesType), marshal(&walcastv1.Outcome{Status: 1})),
			protowire.AppendBytes(tag(nil, 4, protowire.BytesType), marshal(&walcastv1.Outcome{Detail: "d"}))),
		"unknown field":            protowire.AppendVarint(tag(marshal(&walcastv1.BroadcastResponse{BroadcastId: 4}), 99, protowire.VarintType), 1),
		"unknown checkpoint field": entry("k", true, protowire.AppendVarint(tag(nil, 9, protowire.VarintType), 1), true),
		"key not UTF-8":            entry("\xff", true, nil, true),
		"detail not UTF-8":         protowire.AppendBytes(tag(nil, 4, protowire.BytesType), protowire.AppendString(tag(nil, 2, protowire.BytesType), "\xc3")),
		"truncated":                marshal(&walcastv1.BroadcastResponse{BroadcastId: 1 << 40})[:3],
		"wrong wire type":          protowire.AppendFixed64(tag(nil, 1, protowire.Fixed64Type), 1),
	}
	return in
}

// TestCodecReadsWhatProtoReads: every wire form reads into the message
// protobuf-go reads from it, or fails with protobuf-go's error.
func TestCodecReadsWhatProtoReads(t *testing.T) {
	for name, b := range codecInputs(t) {
		var want walcastv1.BroadcastResponse
		wantErr := proto.Unmarshal(b, &want)
		got := &walcastv1.BroadcastResponse{BroadcastId: 77} // not empty: Unmarshal replaces it
		err := Codec{}.Unmarshal(slices.Clone(b), got)
		switch {
		case (err == nil) != (wantErr == nil):
			t.Errorf("%s: error %v, protobuf-go's %v", name, err, wantErr)
		case err == nil && !proto.Equal(got, &want):
			t.Errorf("%s: read %v, protobuf-go reads %v", name, got, &want)
		}
	}
}

// TestCodecKeepsNothingOfTheBuffer: what is read does not share the
// buffer Connect reuses for the next call.
func TestCodecKeepsNothingOfTheBuffer(t *testing.T) {
	b := codecInputs(t)["every field"]
	var r walcastv1.BroadcastResponse
	if err := (Codec{}).Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	want := proto.Clone(&r)
	for i := range b {
		b[i] = 0
	}
	if !proto.Equal(&r, want) {
		t.Fatalf("overwriting the buffer changed the message: %v", &r)
	}
}

// BenchmarkBroadcastResponseUnmarshal is the reader against protobuf-go on
// the answer of a broadcast of four targets.
func BenchmarkBroadcastResponseUnmarshal(b *testing.B) {
	data := codecInputs(b)["four targets"]
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r walcastv1.BroadcastResponse
			_ = Codec{}.Unmarshal(data, &r)
		}
	})
	b.Run("protobuf-go", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r walcastv1.BroadcastResponse
			_ = proto.Unmarshal(data, &r)
		}
	})
}
