package server

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestR9_7_DefaultsAreValid(t *testing.T) {
	c, err := Load("", nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, Default()) {
		t.Fatalf("Load with nothing set differs from Default()")
	}
	// SPEC defaults, by name.
	if c.Broadcast.Tombstone.MaxLifetime.D() != 24*time.Hour || c.Broadcast.Tombstone.MaxCount != 8192 ||
		c.Broadcast.Tombstone.CheckInterval.D() != 5*time.Minute || c.Broadcast.ConcurrencyRatio != 4 ||
		c.Broadcast.Backoff.Initial.D() != 10*time.Millisecond || c.Broadcast.Backoff.Max.D() != 10*time.Second ||
		c.Broadcast.MaxKeyLength != 256 || c.WAL.PChannels != 4 || c.Nodes.Count != 2 || c.DataDir != "./walcast-data" {
		t.Fatalf("defaults %+v", c)
	}
}

func TestR9_7_FileEnvFlagsPrecedence(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "walcast.yaml")
	yml := "data_dir: /from/file\nbroadcast:\n  tombstone:\n    max_count: 100\n    max_lifetime: 2h\napi:\n  addr: 127.0.0.1:1\n"
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"WALCAST_BROADCAST_TOMBSTONE_MAX_COUNT=200", "WALCAST_CATALOG_ENDPOINTS=http://a:2379, http://b:2379", "HOME=/x"}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.String("data-dir", "./walcast-data", "")
	fs.String("api-addr", "", "")
	if err := fs.Parse([]string{"--data-dir=/from/flag"}); err != nil {
		t.Fatal(err)
	}
	keyOf := func(f string) string { return map[string]string{"data-dir": "data_dir", "api-addr": "api.addr"}[f] }
	c, err := Load(path, env, fs, keyOf)
	if err != nil {
		t.Fatal(err)
	}
	if c.DataDir != "/from/flag" {
		t.Errorf("data_dir %q: flags must win", c.DataDir)
	}
	if c.Broadcast.Tombstone.MaxCount != 200 {
		t.Errorf("max_count %d: env must beat the file", c.Broadcast.Tombstone.MaxCount)
	}
	if c.Broadcast.Tombstone.MaxLifetime.D() != 2*time.Hour || c.API.Addr != "127.0.0.1:1" {
		t.Errorf("file values lost: %+v", c)
	}
	if !reflect.DeepEqual(c.Catalog.Endpoints, []string{"http://a:2379", "http://b:2379"}) {
		t.Errorf("endpoints %q", c.Catalog.Endpoints)
	}
	if c.Broadcast.Tombstone.CheckInterval.D() != 5*time.Minute {
		t.Error("unset value lost its default")
	}
}

func TestR9_7_InvalidSettingsNameTheSetting(t *testing.T) {
	cases := []struct {
		env  string
		want string
	}{
		{"WALCAST_BROADCAST_TOMBSTONE_MAX_COUNT=0", "broadcast.tombstone.max_count"},
		{"WALCAST_WAL_KIND=pulsar", "wal.kind"},
		{"WALCAST_LOG_LEVEL=loud", "log.level"},
		{"WALCAST_BROADCAST_BACKOFF_INITIAL=-1s", "broadcast.backoff"},
		{"WALCAST_BROADCAST_TOMBSTONE_MAX_LIFETIME=48h", "meta.import_job_retention"}, // the coupling
		{"WALCAST_BROADCAST_MAX_MESSAGE_BYTES=4000000", "broadcast.max_message_bytes"},
		{"WALCAST_NODES_PCHANNELS=0,9", "nodes.pchannels"},
		{"WALCAST_TOMBSTONE_MAX_COUNT=5", "WALCAST_TOMBSTONE_MAX_COUNT"}, // typo
		{"WALCAST_BROADCAST_TOMBSTONE_MAX_LIFETIME=soon", "max_lifetime"},
	}
	for _, c := range cases {
		_, err := Load("", []string{c.env}, nil, nil)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %s", c.env, err, c.want)
		}
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "bad.yaml")
	_ = os.WriteFile(path, []byte("broadcast:\n  tombstone:\n    max_cuont: 3\n"), 0o600)
	if _, err := Load(path, nil, nil, nil); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "max_cuont") {
		t.Errorf("unknown key in file: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml"), nil, nil, nil); !errors.Is(err, ErrConfig) {
		t.Errorf("missing file: %v", err)
	}
}

// TestR9_7_InvalidNamesAndRangesNameTheSetting: settings that become a
// Kafka topic's replication factor (an int16), pchannel names and a node's
// state directory are refused at start, naming the setting, instead of
// wrapping, failing later or escaping data_dir.
func TestR9_7_InvalidNamesAndRangesNameTheSetting(t *testing.T) {
	cases := []struct {
		env  string
		want string
	}{
		{"WALCAST_WAL_KAFKA_REPLICATION_FACTOR=70000", "wal.kafka.replication_factor"},
		{"WALCAST_WAL_KAFKA_REPLICATION_FACTOR=-1", "wal.kafka.replication_factor"},
		{"WALCAST_WAL_PCHANNEL_PREFIX=wal/", "wal.pchannel_prefix"},
		{"WALCAST_WAL_PCHANNEL_PREFIX=" + strings.Repeat("p", 64), "wal.pchannel_prefix"},
		{"WALCAST_NODES_NAME=..", "nodes.name"},
		{"WALCAST_NODES_NAME=../../etc", "nodes.name"},
		{"WALCAST_NODES_NAME=a/b", "nodes.name"},
	}
	for _, c := range cases {
		_, err := Load("", []string{c.env}, nil, nil)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %s", c.env, err, c.want)
		}
	}
	// Valid values at the edges pass.
	for _, env := range [][]string{{"WALCAST_WAL_KAFKA_REPLICATION_FACTOR=0"}, {"WALCAST_WAL_KAFKA_REPLICATION_FACTOR=32767"},
		{"WALCAST_WAL_PCHANNEL_PREFIX=" + strings.Repeat("p", 63)}, {"WALCAST_NODES_NAME=node-1.a"}} {
		if _, err := Load("", env, nil, nil); err != nil {
			t.Errorf("%s: %v", env, err)
		}
	}
}

func TestR9_7_PrintedConfigLoadsBack(t *testing.T) {
	c := Default()
	c.Broadcast.Tombstone.MaxCount = 77
	c.Catalog.Endpoints = []string{"http://x:2379"}
	y, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(y), "max_lifetime: 24h0m0s") {
		t.Fatalf("durations not printed as durations:\n%s", y)
	}
	path := filepath.Join(t.TempDir(), "printed.yaml")
	if err := os.WriteFile(path, y, 0o600); err != nil {
		t.Fatal(err)
	}
	back, err := Load(path, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	y2, err := back.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if string(y2) != string(y) || back.Broadcast.Tombstone.MaxCount != 77 {
		t.Fatalf("printed config loads back differently:\n%s\n---\n%s", y, y2)
	}
}
