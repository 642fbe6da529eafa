package message

import (
	"reflect"
	"slices"
	"testing"

	"github.com/walcast/walcast/resource"
)

// TestR2_1_StampedMessageCarriesEverythingThroughCodec: a stamped broadcast
// carries its type, payload, properties, the broadcast header {id, target
// vchannels each once with the control channel, the held resource keys,
// AckSyncUp}, and the optional idempotency key, trace context and replicate
// header; all of it survives Marshal/Unmarshal.
func TestR2_1_StampedMessageCarriesEverythingThroughCodec(t *testing.T) {
	cc := PChannel("wal-0").Control()
	key := DatabaseKey(12, "req:with:colons")
	keys := []resource.Key{resource.SharedDatabase("db"), resource.ExclusiveCollection("db", "c"), resource.SharedCluster()}
	const (
		traceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		traceState  = "vendor=opaque"
	)
	for _, tc := range []struct {
		name    string
		targets []VChannel
	}{
		{"control added", []VChannel{"wal-1/a", "wal-2/b"}},
		{"control named by the caller", []VChannel{"wal-1/a", cc, "wal-2/b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewBroadcast(testType, []byte{0, 1, 2, 0xff}, tc.targets,
				WithProperty("origin", "test"), WithProperty("empty", ""),
				WithIdempotencyKey(key), WithAckSyncUp())
			if err != nil {
				t.Fatal(err)
			}
			m.TraceParent, m.TraceState = traceParent, traceState
			m.Replicate = &ReplicateHeader{SourceCluster: "east", SourcePChannel: "wal-3", SourceMessageID: 1<<16 | 2, SourceTimeTick: 1<<16 | 3}
			s, err := m.Stamp(42, cc, keys)
			if err != nil {
				t.Fatal(err)
			}

			// The stamped header.
			h := s.Broadcast
			if h.ID != 42 || !h.AckSyncUp {
				t.Fatalf("header id %d, AckSyncUp %v", h.ID, h.AckSyncUp)
			}
			want := slices.Clone(tc.targets)
			if !slices.Contains(want, cc) {
				want = append(want, cc)
			}
			if !slices.Equal(h.VChannels, want) {
				t.Fatalf("targets %v, want %v", h.VChannels, want)
			}
			seen := map[VChannel]bool{}
			for _, v := range h.VChannels {
				if seen[v] {
					t.Fatalf("vchannel %s named twice in %v", v, h.VChannels)
				}
				seen[v] = true
			}
			if !slices.Equal(h.ResourceKeys, keys) {
				t.Fatalf("resource keys %v, want %v", h.ResourceKeys, keys)
			}
			// The rest of the message.
			if s.Type != testType || string(s.Payload) != "\x00\x01\x02\xff" ||
				!reflect.DeepEqual(s.Properties, map[string]string{"origin": "test", "empty": ""}) ||
				s.IdempotencyKey != key || s.TraceParent != traceParent || s.TraceState != traceState ||
				s.Replicate == nil || *s.Replicate != *m.Replicate {
				t.Fatalf("stamped message lost a field: %+v", s)
			}
			// The caller's keys slice is not shared with the message.
			keys[0].Name = "changed"
			defer func() { keys[0].Name = "db" }()
			if h.ResourceKeys[0].Name != "db" {
				t.Fatal("Stamp kept the caller's resource key slice")
			}

			// Everything survives the durable encoding.
			b, err := Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Unmarshal(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, s) {
				t.Fatalf("round trip\n got %+v\nwant %+v", got, s)
			}
			if got.Replicate == s.Replicate {
				t.Fatal("decoded message shares the replicate header")
			}
			// A message without the optional parts decodes without them.
			plain, err := NewBroadcast(testType, []byte("p"), []VChannel{"wal-1/a"})
			if err != nil {
				t.Fatal(err)
			}
			ps, err := plain.Stamp(43, cc, nil)
			if err != nil {
				t.Fatal(err)
			}
			if b, err = Marshal(ps); err != nil {
				t.Fatal(err)
			}
			if got, err = Unmarshal(b); err != nil {
				t.Fatal(err)
			}
			if got.IdempotencyKey != "" || got.TraceParent != "" || got.TraceState != "" || got.Replicate != nil ||
				got.Broadcast.AckSyncUp || len(got.Properties) != 0 || got.Broadcast.ID != 43 ||
				!slices.Equal(got.Broadcast.VChannels, []VChannel{"wal-1/a", cc}) {
				t.Fatalf("plain message decoded as %+v", got)
			}
		})
	}
}
