package devcluster

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"go.uber.org/goleak"

	"github.com/walcast/walcast/server"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestInvalidConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no binary":      {Dir: t.TempDir()},
		"no dir":         {Binary: "walcast"},
		"low base port":  {Binary: "walcast", Dir: t.TempDir(), BasePort: 80},
		"high base port": {Binary: "walcast", Dir: t.TempDir(), BasePort: 65500},
		"unknown wal":    {Binary: "walcast", Dir: t.TempDir(), WAL: "pulsar"},
		"one pchannel":   {Binary: "walcast", Dir: t.TempDir(), PChannels: 1},
	} {
		if err := cfg.fill(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}

// TestPlanWritesLoadableConfigs plans a cluster of each WAL kind without
// starting it: the members have the documented ports, and the files the
// coordinators and nodes start from are valid walcast configurations with
// the durable settings (three etcd endpoints, three replicas or brokers,
// the monitoring URLs, keepalives inside the election TTL, extra Settings).
func TestPlanWritesLoadableConfigs(t *testing.T) {
	for _, wal := range []string{NATS, Kafka} {
		c := &Cluster{cfg: Config{Binary: "walcast", Dir: t.TempDir(), BasePort: 30000, WAL: wal,
			Settings: map[string]any{"broadcast.backoff.max": "200ms"}}, byName: map[string]*Member{}}
		if err := c.cfg.fill(); err != nil {
			t.Fatal(err)
		}
		if err := c.plan(); err != nil {
			t.Fatal(err)
		}
		want := []string{"etcd-0", "etcd-1", "etcd-2", "nats-0", "nats-1", "nats-2", "coord-0", "coord-1", "node-0", "node-1"}
		if wal == Kafka {
			want = []string{"etcd-0", "etcd-1", "etcd-2", "kafka", "coord-0", "coord-1", "node-0", "node-1"}
		}
		var names []string
		for _, m := range c.Members() {
			names = append(names, m.Name)
		}
		if !slices.Equal(names, want) {
			t.Fatalf("%s members %v", wal, names)
		}
		if got := c.APIAddrs(); !slices.Equal(got, []string{"127.0.0.1:30060", "127.0.0.1:30061"}) {
			t.Fatalf("API addresses %v", got)
		}
		for _, name := range []string{"coord-0", "node-1"} {
			cfg, err := server.Load(filepath.Join(c.Dir(), name+".yaml"), nil, nil, nil)
			if err != nil {
				t.Fatalf("%s %s: %v", wal, name, err)
			}
			if len(cfg.Catalog.Endpoints) != 3 || cfg.WAL.Kind != wal || cfg.Election.TTL.D() != DefaultElectionTTL ||
				cfg.Catalog.KeepaliveTime+cfg.Catalog.KeepaliveTimeout >= cfg.Election.TTL || cfg.Broadcast.Backoff.Max.D().String() != "200ms" {
				t.Fatalf("%s %s: %+v", wal, name, cfg)
			}
			switch wal {
			case NATS:
				if cfg.WAL.NATS.Replicas != 3 || len(cfg.WAL.NATS.MonitorURLs) != 3 {
					t.Fatalf("%s: nats %+v", name, cfg.WAL.NATS)
				}
			case Kafka:
				if cfg.WAL.Kafka.ReplicationFactor != 3 || len(cfg.WAL.Kafka.Brokers) != 3 {
					t.Fatalf("%s: kafka %+v", name, cfg.WAL.Kafka)
				}
			}
			if name == "node-1" && (cfg.Nodes.Name != "node-1" || !slices.Equal(cfg.Nodes.PChannels, []int{1, 3}) || len(cfg.Nodes.Coordinators) != 2) {
				t.Fatalf("node-1: %+v", cfg.Nodes)
			}
		}
	}
}
