package server_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/internal/embedetcd"
	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/server"
)

// startCoordinator starts a coordinator of cfg, closed when the test ends.
func startCoordinator(t *testing.T, ctx context.Context, cfg server.Config) *server.Process {
	t.Helper()
	p, err := server.StartCoordinator(ctx, cfg, app.Generic{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// TestR9_11_CoordinatorChecksNATSSync starts coordinators against NATS
// servers: one that syncs every write is reported as checked; one that
// does not, and one whose sync cannot be checked (no monitoring URL), are
// refused with the setting to change named, unless durability.allow_unsafe
// (and the report still says UNSAFE).
func TestR9_11_CoordinatorChecksNATSSync(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	etcd, err := embedetcd.Start(ctx, embedetcd.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	syncs, err := embednats.Start(ctx, embednats.Config{Dir: t.TempDir(), SyncAlways: true, Monitor: true})
	if err != nil {
		t.Fatal(err)
	}
	defer syncs.Close()
	lazy, err := embednats.Start(ctx, embednats.Config{Dir: t.TempDir(), Monitor: true})
	if err != nil {
		t.Fatal(err)
	}
	defer lazy.Close()

	cfg := coordConfig(t, etcd.Endpoints(), syncs.ClientURL())
	cfg.Catalog.Prefix = "durable/"
	cfg.WAL.NATS.MonitorURLs = []string{syncs.MonitorURL()}
	p := startCoordinator(t, ctx, cfg)
	d, ok := p.Durability()
	if !ok || len(d.Unsafe) != 0 {
		t.Fatalf("durability %v, %v", d, ok)
	}
	report := d.String()
	for _, want := range []string{"catalog: etcd cluster of 1 voting members", "keepalive 5s + 3s", "wal: NATS JetStream single server",
		"WALCAST_lane-0 R1", "checked on 1 servers via /varz", "note: etcd has 1 voting members", "note: the WAL is one NATS server"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	_ = p.Close()

	for name, c := range map[string]server.Config{
		"no sync": func() server.Config {
			c := coordConfig(t, etcd.Endpoints(), lazy.ClientURL())
			c.Catalog.Prefix = "lazy/"
			c.WAL.NATS.MonitorURLs = []string{lazy.MonitorURL()}
			return c
		}(),
		"unverified": func() server.Config {
			c := coordConfig(t, etcd.Endpoints(), syncs.ClientURL())
			c.Catalog.Prefix = "unverified/"
			return c
		}(),
		"unreachable monitor": func() server.Config {
			c := coordConfig(t, etcd.Endpoints(), syncs.ClientURL())
			c.Catalog.Prefix = "unreachable/"
			c.WAL.NATS.MonitorURLs = []string{"http://127.0.0.1:1"}
			return c
		}(),
	} {
		want := map[string]string{"no sync": "does not sync every write", "unverified": "set wal.nats.monitor_urls",
			"unreachable monitor": "no NATS monitoring endpoint answered"}[name]
		_, err := server.StartCoordinator(ctx, c, app.Generic{})
		if !errors.Is(err, server.ErrConfig) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--allow-unsafe-durability") {
			t.Errorf("%s: %v, want a refusal saying %q and naming the override", name, err, want)
			continue
		}
		c.Durability.AllowUnsafe = true
		p := startCoordinator(t, ctx, c)
		if d, _ := p.Durability(); len(d.Unsafe) == 0 || !strings.Contains(d.String(), "UNSAFE: ") {
			t.Errorf("%s allowed: report %s", name, d)
		}
		_ = p.Close()
	}
}

// TestR9_11_CoordinatorChecksNATSClusterReplicas starts coordinators on a
// three-server NATS cluster: streams with three replicas are reported with
// their leader and followers; one replica on a cluster is refused.
func TestR9_11_CoordinatorChecksNATSClusterReplicas(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	etcd, err := embedetcd.Start(ctx, embedetcd.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	servers, err := embednats.StartCluster(ctx, "js", t.TempDir(), 3, embednats.Config{SyncAlways: true, Monitor: true})
	if err != nil {
		t.Fatal(err)
	}
	var urls, monitors []string
	for _, s := range servers {
		defer s.Close()
		urls = append(urls, s.ClientURL())
		monitors = append(monitors, s.MonitorURL())
	}
	cfg := coordConfig(t, etcd.Endpoints(), strings.Join(urls, ","))
	cfg.WAL.NATS.MonitorURLs = monitors
	cfg.WAL.NATS.Replicas = 3
	cfg.Catalog.Prefix = "r3/"
	p := startCoordinator(t, ctx, cfg)
	d, _ := p.Durability()
	if len(d.Unsafe) != 0 || !strings.Contains(d.String(), "NATS JetStream cluster") || !strings.Contains(d.String(), "WALCAST_lane-0 R3 leader js-") ||
		!strings.Contains(d.String(), "(3 of the 3 hosting the streams)") {
		t.Fatalf("report:\n%s", d)
	}
	_ = p.Close()

	one := cfg
	one.WAL.NATS.Replicas = 1
	one.WAL.PChannelPrefix = "r1-"
	one.WAL.Lanes = 0
	one.Catalog.Prefix = "r1/"
	if _, err := server.StartCoordinator(ctx, one, app.Generic{}); !errors.Is(err, server.ErrConfig) || !strings.Contains(err.Error(), "set wal.nats.replicas to 3") {
		t.Fatalf("one replica on a cluster: %v", err)
	}
}

// TestR9_11_CoordinatorChecksKafkaTopics starts coordinators on kfake
// clusters of three brokers: topics with three replicas and
// min.insync.replicas 2 are reported safe; min.insync.replicas 1 is
// refused.
func TestR9_11_CoordinatorChecksKafkaTopics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	etcd, err := embedetcd.Start(ctx, embedetcd.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	for _, mir := range []string{"2", "1"} {
		kc, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.BrokerConfigs(map[string]string{"min.insync.replicas": mir}))
		if err != nil {
			t.Fatal(err)
		}
		defer kc.Close()
		cfg := coordConfig(t, etcd.Endpoints(), "")
		cfg.Catalog.Prefix = "kafka" + mir + "/"
		cfg.WAL.Kind = "kafka"
		cfg.WAL.Kafka.Brokers = kc.ListenAddrs()
		if mir == "1" {
			// walcast gives the topics it creates min.insync.replicas
			// replication_factor - 1 unless told otherwise: told 1, as
			// the brokers' default here, it is refused.
			cfg.WAL.Kafka.MinInsyncReplicas = 1
			if _, err := server.StartCoordinator(ctx, cfg, app.Generic{}); !errors.Is(err, server.ErrConfig) || !strings.Contains(err.Error(), "set min.insync.replicas 2") {
				t.Fatalf("min.insync.replicas 1: %v", err)
			}
			continue
		}
		p := startCoordinator(t, ctx, cfg)
		d, _ := p.Durability()
		if len(d.Unsafe) != 0 || !strings.Contains(d.String(), "producer acks=all, idempotent") ||
			!strings.Contains(d.String(), "walcast-lane-0 RF 3, ISR 3, min.insync.replicas 2") {
			t.Fatalf("report:\n%s", d)
		}
		_ = p.Close()
	}
}
