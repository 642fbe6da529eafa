package kafka

import (
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/walcast/walcast/message"
)

// TestReplicationFactorAboveTheBrokers: topics asked with more replicas
// than the cluster has brokers (the production default of 3 on a
// one-broker development Kafka) fail New with ErrReplicationFactor, saying
// both numbers, and create nothing; a factor the cluster can hold works.
func TestReplicationFactorAboveTheBrokers(t *testing.T) {
	c := newCluster(t)
	cfg := Config{Brokers: c.ListenAddrs(), PChannels: []message.PChannel{"wal-0"}, ReplicationFactor: 3}
	_, err := New(tctx(t), cfg)
	if !errors.Is(err, ErrReplicationFactor) || !strings.Contains(err.Error(), "ReplicationFactor 3") || !strings.Contains(err.Error(), "1 broker") {
		t.Fatalf("replication factor 3 on one broker: %v, want ErrReplicationFactor naming 3 and 1 broker", err)
	}
	cfg.Existing = true
	if _, err := New(tctx(t), cfg); !errors.Is(err, ErrNoTopic) {
		t.Fatalf("the refused New created a topic: %v", err)
	}
	cfg.Existing, cfg.ReplicationFactor = false, 1
	l := open(t, c, cfg)
	_ = l.Close()
}

// TestExistingCreatesNoTopic: a reader of another cluster's WAL
// (Config.Existing) fails on missing topics instead of creating them, and
// opens them, under the prefix given, once they exist.
func TestExistingCreatesNoTopic(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "east-wal-1"))
	cfg := Config{Brokers: c.ListenAddrs(), PChannels: []message.PChannel{"wal-0", "wal-1"}, TopicPrefix: "east-", Existing: true}
	_, err := New(tctx(t), cfg)
	if !errors.Is(err, ErrNoTopic) || !strings.Contains(err.Error(), "east-wal-0") || strings.Contains(err.Error(), "east-wal-1") {
		t.Fatalf("Existing with east-wal-0 missing: %v, want ErrNoTopic naming it alone", err)
	}
	owner := cfg
	owner.Existing = false
	_ = open(t, c, owner).Close()
	l := open(t, c, cfg)
	if got := l.Topic("wal-0"); got != "east-wal-0" {
		t.Fatalf("topic %q, want east-wal-0", got)
	}
}
