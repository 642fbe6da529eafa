package server_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/walcast/walcast/internal/devcluster"
	"github.com/walcast/walcast/server"
)

// TestR9_7_DevClusterConfigsLoad plans a dev cluster of each WAL kind without
// starting it: the files its coordinators and nodes start from are valid
// walcast configurations with the durable settings (three etcd endpoints,
// three replicas or brokers, the monitoring URLs, keepalives inside the
// election TTL, extra Settings).
func TestR9_7_DevClusterConfigsLoad(t *testing.T) {
	for _, wal := range []string{devcluster.NATS, devcluster.Kafka} {
		c, err := devcluster.Plan(devcluster.Config{Binary: "walcast", Dir: t.TempDir(), BasePort: 30000, WAL: wal,
			Settings: map[string]any{"broadcast.backoff.max": "200ms"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"coord-0", "node-1"} {
			cfg, err := server.Load(filepath.Join(c.Dir(), name+".yaml"), nil, nil, nil)
			if err != nil {
				t.Fatalf("%s %s: %v", wal, name, err)
			}
			if len(cfg.Catalog.Endpoints) != 3 || cfg.WAL.Kind != wal || cfg.Election.TTL.D() != devcluster.DefaultElectionTTL ||
				cfg.Catalog.KeepaliveTime+cfg.Catalog.KeepaliveTimeout >= cfg.Election.TTL || cfg.Broadcast.Backoff.Max.D().String() != "200ms" {
				t.Fatalf("%s %s: %+v", wal, name, cfg)
			}
			switch wal {
			case devcluster.NATS:
				if cfg.WAL.NATS.Replicas != 3 || len(cfg.WAL.NATS.MonitorURLs) != 3 {
					t.Fatalf("%s: nats %+v", name, cfg.WAL.NATS)
				}
			case devcluster.Kafka:
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
