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
	"github.com/walcast/walcast/server"
)

// TestR9_10_StandaloneReportsAFullCatalog fills a standalone's embedded etcd to
// its quota (standalone.etcd_quota_bytes, at its 64 MiB minimum) faster than
// the space guard's one-minute floor lets it compact: /readyz fails with the
// "catalog store" check, walcast_catalog_store_ok is 0, and a broadcast is
// refused at once with etcd's reason, creating nothing.
func TestR9_10_StandaloneReportsAFullCatalog(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := standaloneWith(t, ctx, "walcast", func(cfg *server.Config) {
		cfg.Metrics.Addr = "127.0.0.1:0"
		cfg.Audit.File = "off"
		cfg.Standalone.EtcdQuotaBytes = 64 << 20
	})
	check := func() server.Check {
		for _, c := range p.Ready(ctx).Checks {
			if c.Name == "catalog store" {
				return c
			}
		}
		t.Fatal("no catalog store check")
		return server.Check{}
	}
	if c := check(); !c.OK {
		t.Fatalf("catalog store check before filling: %+v", c)
	}
	etcd, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(p.EtcdURL(), ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	value := strings.Repeat("x", 64<<10)
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
	}
	if c := check(); c.OK || !strings.Contains(c.Detail, "NOSPACE") || !strings.Contains(c.Detail, "standalone.etcd_quota_bytes") {
		t.Fatalf("catalog store check with etcd full: %+v", c)
	}
	if m := scrape(t, p.MetricsAddr()); !strings.Contains(m, "\nwalcast_catalog_store_ok 0\n") {
		t.Fatalf("gauge with etcd full: %q", grepLines(m, "walcast_catalog_store_ok"))
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
	_, err = c.Broadcast(ctx, connect.NewRequest(&walcastv1.BroadcastRequest{Type: server.GenericType.String(), Payload: []byte("x"),
		Vchannels: []string{"wal-1/a"}, ResourceKeys: []string{"Collection:db:full@X"}}))
	if err == nil || !strings.Contains(err.Error(), "database space exceeded") {
		t.Fatalf("broadcast with etcd full: %v, want a refusal naming etcd's reason", err)
	}
	t.Logf("refused: %v", err)
	if after := taskKeys(); after != before {
		t.Fatalf("task keys %d before the refused broadcast, %d after", before, after)
	}
}
