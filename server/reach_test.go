package server_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/server"
)

// deadAddr is a loopback address where nothing listens (a port that was
// free a moment ago).
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestR9_2_UnreachableEtcdNamedAtStart: a coordinator whose etcd is not
// running (its NATS is) fails at start with the cause and the address, "cannot
// reach etcd at http://...: connection refused", not with whatever part met
// the missing catalog first.
func TestR9_2_UnreachableEtcdNamedAtStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns, err := embednats.Start(ctx, embednats.Config{Dir: filepath.Join(t.TempDir(), "nats"), SyncAlways: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	etcd := "http://" + deadAddr(t)
	cfg := coordConfig(t, []string{etcd}, ns.ClientURL())
	p, err := server.StartCoordinator(ctx, cfg, app.Generic{})
	if err == nil {
		p.Close()
		t.Fatal("a coordinator started without its etcd")
	}
	if !errors.Is(err, server.ErrUnreachable) || !strings.Contains(err.Error(), "cannot reach etcd at "+etcd+": connection refused") {
		t.Errorf("start without etcd: %v", err)
	}
}
