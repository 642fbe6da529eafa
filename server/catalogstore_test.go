package server_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/internal/longtest"
	"github.com/walcast/walcast/server"
)

// TestR9_10_StandaloneReportsAFullCatalog fills a standalone's embedded etcd to
// its quota (standalone.etcd_quota_bytes, at its 64 MiB minimum) faster than
// the space guard's one-minute floor lets it compact: past 80% /readyz warns
// and stays ready; once full it fails with the "catalog store" check,
// walcast_catalog_store_ok is 0, and a broadcast is refused at once with
// etcd's reason, creating nothing.
func TestR9_10_StandaloneReportsAFullCatalog(t *testing.T) {
	longtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, check := storeStandalone(t, ctx, "catalog store", func(cfg *server.Config) { cfg.Standalone.EtcdQuotaBytes = 64 << 20 })
	if c := check(); !c.OK {
		t.Fatalf("catalog store check before filling: %+v", c)
	}
	etcd, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(p.EtcdURL(), ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	value := strings.Repeat("x", 64<<10)
	warned := false
	for i := 0; ; i++ {
		if i > 4000 { // 250 MiB: far past the quota
			t.Fatal("the quota was never reached")
		}
		_, err := etcd.Put(ctx, fmt.Sprintf("filler/%d", i%10), value)
		if errors.Is(err, rpctypes.ErrNoSpace) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		// Past 80% of the quota, readiness warns and stays ready.
		if c := check(); !warned && strings.HasPrefix(c.Detail, "warning: ") {
			if !c.OK || !strings.Contains(c.Detail, "standalone.etcd_quota_bytes") {
				t.Fatalf("catalog store check near the quota: %+v", c)
			}
			warned = true
		}
	}
	if !warned {
		t.Fatal("no warning before the quota was reached")
	}
	if c := check(); c.OK || !strings.Contains(c.Detail, "NOSPACE") || !strings.Contains(c.Detail, "standalone.etcd_quota_bytes") {
		t.Fatalf("catalog store check with etcd full: %+v", c)
	}
	m := scrape(t, p.MetricsAddr())
	if !strings.Contains(m, "\nwalcast_catalog_store_ok 0\n") || !strings.Contains(m, "\nwalcast_catalog_db_quota_bytes 6.7108864e+07\n") {
		t.Fatalf("gauges with etcd full: %q", grepLines(m, "walcast_catalog_"))
	}
	taskKeys := func() int {
		resp, err := etcd.Get(ctx, "", clientv3.WithFromKey(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, kv := range resp.Kvs {
			if strings.Contains(string(kv.Key), "/tasks/") {
				n++
			}
		}
		return n
	}
	before := taskKeys()
	c := walcastv1connect.NewBroadcastServiceClient(http.DefaultClient, "http://"+p.APIAddr())
	_, err = c.Broadcast(ctx, connect.NewRequest(&walcastv1.BroadcastRequest{Type: app.GenericType.String(), Payload: []byte("x"),
		Vchannels: []string{"wal-1/a"}, ResourceKeys: []string{"Collection:db:full@X"}}))
	if err == nil || !strings.Contains(err.Error(), "database space exceeded") {
		t.Fatalf("broadcast with etcd full: %v, want a refusal naming etcd's reason", err)
	}
	t.Logf("refused: %v", err)
	if after := taskKeys(); after != before {
		t.Fatalf("task keys %d before the refused broadcast, %d after", before, after)
	}
}

// TestR9_10_StandaloneWarnsOfANearlyFullWAL: standalone's WAL streams are
// kept whole, so the embedded JetStream's store (standalone.nats_max_store)
// fills with the broadcasts; past 80% of it /readyz's "wal store" check warns
// (and stays ready) and the gauges show the use against the limit.
func TestR9_10_StandaloneWarnsOfANearlyFullWAL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, walStore := storeStandalone(t, ctx, "wal store", func(cfg *server.Config) { cfg.Standalone.NATSMaxStore = 1 << 20 })
	if c := walStore(); !c.OK || strings.HasPrefix(c.Detail, "warning") {
		t.Fatalf("wal store check at start: %+v", c)
	}
	c := walcastv1connect.NewBroadcastServiceClient(http.DefaultClient, "http://"+p.APIAddr())
	payload := strings.Repeat("p", 200<<10)
	for i := 0; !strings.HasPrefix(walStore().Detail, "warning: "); i++ {
		if i == 8 { // 8 × 2 copies × 200 KiB: past the 1 MiB store
			t.Fatalf("no warning after %d broadcasts of 200 KiB: %+v", i, walStore())
		}
		if _, err := c.Broadcast(ctx, connect.NewRequest(&walcastv1.BroadcastRequest{Type: app.GenericType.String(), Payload: []byte(payload),
			Vchannels: []string{"wal-1/a"}, ResourceKeys: []string{fmt.Sprintf("Collection:db:w%d@X", i)}})); err != nil {
			t.Fatalf("broadcast %d: %v", i, err)
		}
	}
	if st := walStore(); !st.OK || !strings.Contains(st.Detail, "standalone.nats_max_store") {
		t.Fatalf("wal store check near the limit: %+v", st)
	}
	m := scrape(t, p.MetricsAddr())
	if !strings.Contains(m, "\nwalcast_wal_store_limit_bytes 1.048576e+06\n") || !strings.Contains(m, "\nwalcast_wal_store_used_bytes ") {
		t.Fatalf("wal store gauges: %q", grepLines(m, "walcast_wal_store_"))
	}
}

// storeStandalone starts a standalone with metrics, mod applied, and returns
// it with a function reading its readiness check of that name.
func storeStandalone(t *testing.T, ctx context.Context, name string, mod func(*server.Config)) (*server.Process, func() server.Check) {
	p := standaloneWith(t, ctx, "walcast", func(cfg *server.Config) {
		cfg.Metrics.Addr = "127.0.0.1:0"
		cfg.Audit.File = "off"
		mod(cfg)
	})
	return p, func() server.Check {
		for _, c := range p.Ready(ctx).Checks {
			if c.Name == name {
				return c
			}
		}
		t.Fatalf("no %s check", name)
		return server.Check{}
	}
}
