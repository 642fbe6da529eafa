package server_test

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/server"
)

// TestR9_1_StandaloneThatCannotStartLeavesItsDataFree: a standalone whose
// embedded NATS or etcd cannot listen fails naming the setting to change,
// and leaves nothing of itself on its data directory (the etcd started
// beside the NATS that failed, the nodes that loaded their state while etcd
// started): started again with the port free, it starts.
func TestR9_1_StandaloneThatCannotStartLeavesItsDataFree(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	// A first start saves the nodes' state, so that the next ones load some.
	if err := startWith(t, ctx, "c", dir, nil).Close(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		setting string
		set     func(*server.Config, string)
	}{
		{"standalone.nats_addr", func(cfg *server.Config, addr string) { cfg.Standalone.NATSAddr = addr }},
		{"standalone.etcd_addr", func(cfg *server.Config, addr string) { cfg.Standalone.EtcdAddr = addr }},
	} {
		busy, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cfg := server.Default()
		cfg.DataDir, cfg.Cluster.Name = dir, "c"
		cfg.API.Addr, cfg.Metrics.Addr, cfg.Log.Level = "127.0.0.1:0", "", "error"
		c.set(&cfg, busy.Addr().String())
		p, err := server.StartStandalone(ctx, cfg, app.Generic{})
		_ = busy.Close()
		if err == nil {
			_ = p.Close()
			t.Fatalf("%s on a port in use: started", c.setting)
		}
		if !strings.Contains(err.Error(), c.setting) {
			t.Errorf("%s on a port in use: %v, want an error naming %s", c.setting, err, c.setting)
		}
		if err := startWith(t, ctx, "c", dir, nil).Close(); err != nil {
			t.Fatalf("after the failed start with %s: %v", c.setting, err)
		}
	}
}
