package server_test

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/internal/embedetcd"
	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/internal/tcpproxy"
	"github.com/walcast/walcast/server"
)

// TestR9_13_LeaderCutFromTheWALGivesUp runs two coordinators whose
// connections to NATS go through proxies the test cuts. With both cut, the
// leader keeps its term (no standby could serve: nothing flaps). Once the
// standby's WAL answers again, the leader, whose WAL still does not,
// gives up its term after election.ttl and the standby leads; the old
// leader's /readyz says why it gave up.
func TestR9_13_LeaderCutFromTheWALGivesUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	etcd, err := embedetcd.Start(ctx, embedetcd.Config{Dir: filepath.Join(dir, "etcd")})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	ns, err := embednats.Start(ctx, embednats.Config{Dir: filepath.Join(dir, "nats"), SyncAlways: true, Monitor: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	const ttl = 2 * time.Second
	coord := func() (*server.Process, *tcpproxy.Proxy) {
		p, err := tcpproxy.Start(strings.TrimPrefix(ns.ClientURL(), "nats://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		cfg := server.Default()
		cfg.DataDir = t.TempDir()
		cfg.API.Addr = "127.0.0.1:0"
		cfg.Metrics.Addr = ""
		cfg.Log.Level = "error"
		cfg.Catalog.Endpoints = etcd.Endpoints()
		cfg.Catalog.MaxTxnOps = etcd.MaxTxnOps()
		cfg.WAL.NATS.URL = "nats://" + p.Addr()
		cfg.WAL.NATS.MonitorURLs = []string{ns.MonitorURL()}
		cfg.Election.TTL = server.Duration(ttl)
		proc, err := server.StartCoordinator(ctx, cfg, app.Generic{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = proc.Close() })
		return proc, p
	}
	leader, lwal := coord()
	waitUntil(t, "a leader", func() bool { _, err := leader.Coord.Current(); return err == nil })
	standby, swal := coord()
	surl := "http://" + standby.APIAddr()
	waitUntil(t, "the standby ready", func() bool { code, _ := get(t, surl+"/readyz"); return code == http.StatusOK })

	// Neither reaches the WAL: the leader stays, for several TTLs.
	lwal.Cut()
	swal.Cut()
	select {
	case <-time.After(4 * ttl):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if _, err := leader.Coord.Current(); err != nil || leader.Coord.Terms() != 1 {
		t.Fatalf("leader without a standby that could serve: %v, %d terms", err, leader.Coord.Terms())
	}
	if why, _ := leader.Coord.GaveUp(); why != "" {
		t.Fatalf("gave up with no standby that could serve: %s", why)
	}

	// The standby reaches the WAL again: the leader gives up.
	swal.Heal()
	waitUntil(t, "the standby to lead", func() bool { _, err := standby.Coord.Current(); return err == nil })
	why, _ := leader.Coord.GaveUp()
	if !strings.Contains(why, "the WAL has not answered for") || !strings.Contains(why, standby.APIAddr()) {
		t.Errorf("why the leader gave up: %q", why)
	}
	_, body := get(t, "http://"+leader.APIAddr()+"/readyz")
	if !strings.Contains(body, "gave up its leadership") || !strings.Contains(body, "FAIL wal") {
		t.Errorf("old leader's /readyz: %q", body)
	}
	// It stands by behind the new leader, and does not take the term
	// back once its WAL answers again.
	lwal.Heal()
	lurl := "http://" + leader.APIAddr()
	waitUntil(t, "the old leader ready as a standby", func() bool {
		code, body := get(t, lurl+"/readyz")
		return code == http.StatusOK && strings.HasPrefix(body, "ready: standby")
	})
	if _, err := standby.Coord.Current(); err != nil {
		t.Fatalf("the new leader: %v", err)
	}
}
