package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestR10_4_ViewInClusterMode: in cluster mode the coordinator runs no
// streaming node; `walcast view` at the coordinator says where to ask, and
// at the node that consumes the vchannel's pchannel (its --metrics-addr) it
// shows the view the node built from what it applied.
func TestR10_4_ViewInClusterMode(t *testing.T) {
	startShared(t)
	prefix := fmt.Sprintf("view%d/", time.Now().UnixNano())
	t.Setenv("WALCAST_CATALOG_PREFIX", prefix)
	streams := fmt.Sprintf("VIEW%d", time.Now().UnixNano()%1e9) // a WAL of its own on the shared NATS
	coord := start(t, "coord", "coord", "--api-addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--etcd", strings.Join(shared.etcd.Endpoints(), ","),
		"--nats", shared.nats.ClientURL(), "--nats-stream-prefix", streams, "--nats-monitor", shared.nats.MonitorURL(), "--metrics-addr", "")
	node := start(t, "node", "node", "--name", "n0", "--consume", "0,1,2,3", "--coordinators", coord.api, "--data-dir", t.TempDir(),
		"--nats", shared.nats.ClientURL(), "--nats-stream-prefix", streams, "--metrics-addr", "127.0.0.1:0")
	m := regexp.MustCompile(`metrics=http://(\S+)/metrics`).FindStringSubmatch(node.out())
	if m == nil {
		t.Fatalf("no metrics address in the node's ready line:\n%s", node.out())
	}
	nodeAddr := m[1]
	cli := func(args ...string) string {
		t.Helper()
		out, err := run(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	cli("db", "create", "shop", "--addr", coord.api)
	out := cli("collection", "create", "orders", "--db", "shop", "--shards", "1", "--addr", coord.api)
	vc := regexp.MustCompile(`vchannels (\S+)`).FindStringSubmatch(out)[1]

	_, err := run(t, "view", "--vchannel", vc, "--addr", coord.api)
	if err == nil || !strings.Contains(err.Error(), "ask the node that consumes "+vc+"'s pchannel") {
		t.Fatalf("view at the coordinator: %v", err)
	}
	var view string
	waitUntil(t, "the node's view of the collection", func() bool {
		view, err = run(t, "view", "--vchannel", vc, "--addr", nodeAddr)
		return err == nil && strings.Contains(view, "orders")
	})
	wantOutput(t, view, `(?m)^node\s+n0$`, `(?m)^collection\s+orders \(id \d+\)$`, `(?m)^database\s+shop \(id \d+\)$`)
	// The node holds no metadata: other calls are refused.
	if _, err := run(t, "db", "list", "--addr", nodeAddr); err == nil || !strings.Contains(err.Error(), "unimplemented") {
		t.Fatalf("db list at a node: %v", err)
	}
}
