package server

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/walcast/walcast/app"
)

// TestR9_7_WALPrefixAndKafkaSettings: the stream and topic prefixes and
// min.insync.replicas are settings, refused at start when unusable, naming
// the setting; min.insync.replicas defaults to one below the replication
// factor.
func TestR9_7_WALPrefixAndKafkaSettings(t *testing.T) {
	for _, c := range []struct{ env, want string }{
		{"WALCAST_WAL_NATS_STREAM_PREFIX=a.b", "wal.nats.stream_prefix"},
		{"WALCAST_WAL_NATS_STREAM_PREFIX=" + strings.Repeat("S", 33), "wal.nats.stream_prefix"},
		{"WALCAST_WAL_KAFKA_TOPIC_PREFIX=a/b", "wal.kafka.topic_prefix"},
		{"WALCAST_WAL_KAFKA_MIN_INSYNC_REPLICAS=4", "wal.kafka.min_insync_replicas"},
		{"WALCAST_WAL_KAFKA_MIN_INSYNC_REPLICAS=-1", "wal.kafka.min_insync_replicas"},
	} {
		if _, err := Load("", []string{c.env}, nil, nil); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %s", c.env, err, c.want)
		}
	}
	for _, c := range []struct {
		env  []string
		want int
	}{
		{nil, 2},
		{[]string{"WALCAST_WAL_KAFKA_REPLICATION_FACTOR=1"}, 1},
		{[]string{"WALCAST_WAL_KAFKA_REPLICATION_FACTOR=5", "WALCAST_WAL_KAFKA_MIN_INSYNC_REPLICAS=3"}, 3},
		{[]string{"WALCAST_WAL_KAFKA_REPLICATION_FACTOR=0"}, 0},
	} {
		cfg, err := Load("", c.env, nil, nil)
		if err != nil {
			t.Fatalf("%v: %v", c.env, err)
		}
		if got := cfg.KafkaMinInsync(); got != c.want {
			t.Errorf("%v: min.insync.replicas %d, want %d", c.env, got, c.want)
		}
	}
	cfg, err := Load("", []string{"WALCAST_WAL_NATS_STREAM_PREFIX=WEST", "WALCAST_WAL_KAFKA_TOPIC_PREFIX=west."}, nil, nil)
	if err != nil || cfg.WAL.NATS.StreamPrefix != "WEST" || cfg.WAL.Kafka.TopicPrefix != "west." {
		t.Fatalf("prefixes: %+v, %v", cfg.WAL, err)
	}
}

// TestR9_7_KafkaReplicationFactorAboveTheBrokersNamesTheSetting: a
// coordinator with the default replication factor (3) against a one-broker
// Kafka fails at start with an error naming the setting and its flag, not a
// bare INVALID_REPLICATION_FACTOR.
func TestR9_7_KafkaReplicationFactorAboveTheBrokersNamesTheSetting(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := Default()
	cfg.DataDir = t.TempDir()
	cfg.API.Addr, cfg.Metrics.Addr, cfg.Log.Level = "127.0.0.1:0", "", "error"
	cfg.Catalog.Endpoints = []string{"http://127.0.0.1:1"} // not dialled before the WAL
	cfg.WAL.Kind, cfg.WAL.Kafka.Brokers = "kafka", kc.ListenAddrs()
	_, err = StartCoordinator(ctx, cfg, app.Generic{})
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "wal.kafka.replication_factor") ||
		!strings.Contains(err.Error(), "--kafka-replication-factor") || !strings.Contains(err.Error(), "1 broker") {
		t.Fatalf("replication factor 3 on one broker: %v", err)
	}
}
