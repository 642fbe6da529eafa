package devcluster

import (
	"errors"
	"slices"
	"testing"

	"go.uber.org/goleak"
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

// TestPlanNamesTheMembers plans a cluster of each WAL kind without starting
// it: the members and the coordinators' API addresses follow the documented
// port layout. (server's TestDevClusterConfigsLoad loads the files.)
func TestPlanNamesTheMembers(t *testing.T) {
	for _, wal := range []string{NATS, Kafka} {
		c, err := Plan(Config{Binary: "walcast", Dir: t.TempDir(), BasePort: 30000, WAL: wal})
		if err != nil {
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
		if err := c.Member("coord-0").Start(t.Context()); err == nil {
			t.Fatal("a planned cluster's member started")
		}
	}
}
