package message

import (
	"testing"

	"github.com/walcast/walcast/resource"
)

// BenchmarkUnmarshal decodes a typical DDL message: four targets, two
// resource keys, a property and an idempotency key (every copy a node
// reads and every record the engine recovers goes through here).
func BenchmarkUnmarshal(b *testing.B) {
	m := &Message{
		Type:           Type{Name: "CreateCollection", Version: 1},
		Payload:        []byte("collection c1 in db1 with 4 shards"),
		Properties:     map[string]string{"db": "db1"},
		IdempotencyKey: "1:0:create-c1",
		Broadcast: BroadcastHeader{
			ID:        42,
			VChannels: []VChannel{"_control_p1", "p1_v1", "p2_v2", "p3_v3"},
			ResourceKeys: []resource.Key{
				{Domain: 1, Name: "db1", Mode: resource.Shared},
				{Domain: 2, Name: "db1/c1", Mode: resource.Exclusive},
			},
		},
	}
	raw, err := Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Unmarshal(raw); err != nil {
			b.Fatal(err)
		}
	}
}
