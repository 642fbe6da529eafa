package server

import (
	"errors"
	"slices"
	"testing"

	"github.com/walcast/walcast/broadcast"
)

// TestR8_2_ReplicationSourcesNameTheirWAL: a topology source names the
// primary WAL's kind, addresses and prefix; a malformed one is refused as
// invalid, saying what is wrong, before anything changes.
func TestR8_2_ReplicationSourcesNameTheirWAL(t *testing.T) {
	for _, c := range []struct {
		in   string
		want walSource
	}{
		{"nats://10.0.0.5:4222", walSource{kind: "nats", natsURL: "nats://10.0.0.5:4222"}},
		{"nats://a:4222,b:4222?stream_prefix=EAST", walSource{kind: "nats", natsURL: "nats://a:4222,b:4222", prefix: "EAST"}},
		{"tls://a:4222", walSource{kind: "nats", natsURL: "tls://a:4222"}},
		{"kafka://k1:9092,k2:9092", walSource{kind: "kafka", brokers: []string{"k1:9092", "k2:9092"}}},
		{"kafka://k1:9092,kafka://k2:9092?topic_prefix=east-", walSource{kind: "kafka", brokers: []string{"k1:9092", "k2:9092"}, prefix: "east-"}},
	} {
		got, err := parseSource(c.in)
		if err != nil || got.kind != c.want.kind || got.natsURL != c.want.natsURL || got.prefix != c.want.prefix || !slices.Equal(got.brokers, c.want.brokers) {
			t.Errorf("%s: %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "10.0.0.5:4222", "kafka://", "kafka://k1", "kafka://k1:9092?stream_prefix=x", "nats://a:4222?topic_prefix=x", "nats://a:4222,,b:4222", "kafka://k:1?%zz"} {
		if _, err := parseSource(bad); !errors.Is(err, broadcast.ErrInvalidArgument) {
			t.Errorf("%q: %v, want ErrInvalidArgument", bad, err)
		}
	}
	topo := broadcast.ReplicateConfig{Primary: "east", Secondaries: []broadcast.SecondaryConfig{{Name: "west", Source: "kafka://k1"}}}
	if err := checkSources(topo); !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("topology with a bad source: %v", err)
	}
}
