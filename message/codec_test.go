package message

import (
	"errors"
	"reflect"
	"testing"

	"github.com/walcast/walcast/resource"
)

func TestCodecRoundTrip(t *testing.T) {
	m := &Message{
		Type: testType, Payload: []byte{1, 2, 3}, Properties: map[string]string{"a": "b"},
		IdempotencyKey: CollectionKey(3, "k"), TraceParent: "00-01-02-01", TraceState: "x=y",
		Broadcast: BroadcastHeader{ID: 77, VChannels: []VChannel{"p/a", "p/_control"},
			ResourceKeys: []resource.Key{resource.ExclusiveCollection("d", "c"), resource.SharedCluster()}, AckSyncUp: true},
		Replicate: &ReplicateHeader{SourceCluster: "east", SourcePChannel: "p", SourceMessageID: 9, SourceTimeTick: 10},
	}
	b, err := Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("round trip\n got %+v\nwant %+v", got, m)
	}
	if _, err := Unmarshal([]byte{0xff, 0xff}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("garbage decoded: %v", err)
	}
}
