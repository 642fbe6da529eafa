package server_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/server"
)

// startWith starts a standalone on cfg (a copy of the test's defaults,
// adjusted by mod); closed when the test ends.
func startWith(t *testing.T, ctx context.Context, name string, dir string, mod func(*server.Config)) *server.Process {
	t.Helper()
	cfg := server.Default()
	cfg.DataDir = dir
	cfg.Cluster.Name = name
	cfg.API.Addr = "127.0.0.1:0"
	cfg.Metrics.Addr = ""
	cfg.Log.Level = "error"
	if mod != nil {
		mod(&cfg)
	}
	p, err := server.StartStandalone(ctx, cfg, app.Generic{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func genericDDL(i int) *client.BroadcastRequest {
	return &client.BroadcastRequest{Type: app.GenericType, Payload: []byte(fmt.Sprint("ddl-", i)),
		VChannels:    []message.VChannel{message.VChannel(fmt.Sprintf("wal-%d/c%d", i%4, i))},
		ResourceKeys: []resource.Key{resource.ExclusiveCollection("db", fmt.Sprint("c", i))}}
}

func onceClient(t *testing.T, p *server.Process) *client.Client {
	t.Helper()
	c, err := client.New([]string{p.APIAddr()}, client.WithMaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func replStatus(ctx context.Context, t *testing.T, p *server.Process) *walcastv1.ReplicationStatusResponse {
	t.Helper()
	st, err := replClient(p).Status(ctx, connect.NewRequest(&walcastv1.ReplicationStatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	return st.Msg
}

// followAndPromote has west follow east, broadcasts n DDL on east, waits
// until west holds them, and force-promotes west.
func followAndPromote(ctx context.Context, t *testing.T, east, west *server.Process, n int) {
	t.Helper()
	topo := &walcastv1.Topology{Primary: "east", Secondaries: []*walcastv1.SecondaryCluster{{Name: "west", Source: east.NATSURL()}}}
	if _, err := replClient(west).Follow(ctx, connect.NewRequest(&walcastv1.FollowRequest{Topology: topo})); err != nil {
		t.Fatal(err)
	}
	ec := onceClient(t, east)
	var last uint64
	for i := range n {
		r, err := ec.Broadcast(ctx, genericDDL(i))
		if err != nil {
			t.Fatal(err)
		}
		last = r.BroadcastID
	}
	wc := onceClient(t, west)
	waitUntil(t, "west to replicate east's DDL", func() bool {
		task, err := wc.GetTask(ctx, last)
		return err == nil && task.GetState() == "TOMBSTONE"
	})
	if _, err := replClient(west).ForcePromote(ctx, connect.NewRequest(&walcastv1.ForcePromoteRequest{})); err != nil {
		t.Fatal(err)
	}
}

// TestR8_5_WALMarkFencesARunningOldPrimary: east keeps running, unaware,
// while west is promoted (a partition: east has no peer to ask). West
// marks east's WAL superseded as soon as it reaches it, and east, reading
// its fence channel, refuses DDL from then on, also after a restart; its
// status says who superseded it and how it learned it.
func TestR8_5_WALMarkFencesARunningOldPrimary(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	eastDir := t.TempDir()
	east := startWith(t, ctx, "east", eastDir, nil)
	west := startWith(t, ctx, "west", t.TempDir(), nil)
	followAndPromote(ctx, t, east, west, 4)
	ec := onceClient(t, east)
	var err error
	waitUntil(t, "east to refuse DDL as superseded", func() bool {
		_, err = ec.Broadcast(ctx, genericDDL(100))
		return err != nil
	})
	if !errors.Is(err, client.ErrSuperseded) || !strings.Contains(err.Error(), "superseded by west's promote") {
		t.Fatalf("east's DDL after west's mark: %v, want ErrSuperseded", err)
	}
	st := replStatus(ctx, t, east)
	if st.GetSuperseded().GetBy() != "west" || st.GetSuperseded().GetVia() != "wal" || st.GetSuperseded().GetGeneration() == 0 {
		t.Fatalf("east's status: superseded %v", st.GetSuperseded())
	}
	ws := replStatus(ctx, t, west)
	if ws.GetPromotion().GetMarkedAt() == nil || ws.GetGeneration() != st.GetSuperseded().GetGeneration() || ws.GetReplaced() != "east" {
		t.Fatalf("west's status: generation %d, replaced %q, promotion %v", ws.GetGeneration(), ws.GetReplaced(), ws.GetPromotion())
	}
	if _, err := onceClient(t, west).Broadcast(ctx, genericDDL(101)); err != nil {
		t.Fatalf("DDL on west: %v", err)
	}
	// The supersession is in east's catalog: a restarted east refuses DDL
	// from its first request.
	if err := east.Close(); err != nil {
		t.Fatal(err)
	}
	east = startWith(t, ctx, "east", eastDir, nil)
	if _, err := onceClient(t, east).Broadcast(ctx, genericDDL(102)); !errors.Is(err, client.ErrSuperseded) {
		t.Fatalf("restarted east on DDL: %v, want ErrSuperseded", err)
	}
}

// TestR8_5_UnreachableSecondariesPolicy: a primary that learned of its
// secondary from its peers, restarted while the secondary cannot be
// reached, refuses DDL by default until it answers
// (replication.unreachable_secondaries: refuse), and accepts it with the
// policy accept, saying in its status that it is unconfirmed; a primary
// that has no secondary to ask is confirmed at once.
func TestR8_5_UnreachableSecondariesPolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	west := startWith(t, ctx, "west", t.TempDir(), nil)
	eastDir := t.TempDir()
	policy := server.RefuseUnconfirmed
	startEast := func() *server.Process {
		return startWith(t, ctx, "east", eastDir, func(c *server.Config) {
			c.Replication.Peers = []string{west.APIAddr()}
			c.Replication.UnreachableSecondaries = policy
		})
	}
	east := startEast()
	if st := replStatus(ctx, t, east); !st.GetPrimaryCheck().GetConfirmed() {
		t.Fatalf("a primary without secondaries is unconfirmed: %v", st.GetPrimaryCheck())
	}
	topo := &walcastv1.Topology{Primary: "east", Secondaries: []*walcastv1.SecondaryCluster{{Name: "west", Source: east.NATSURL()}}}
	if _, err := replClient(west).Follow(ctx, connect.NewRequest(&walcastv1.FollowRequest{Topology: topo})); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "east to learn of its secondary west", func() bool {
		return slices.Contains(replStatus(ctx, t, east).GetPrimaryCheck().GetSecondaries(), "west")
	})
	if err := west.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{server.RefuseUnconfirmed, server.AcceptUnconfirmed} {
		if err := east.Close(); err != nil {
			t.Fatal(err)
		}
		policy = p
		east = startEast()
		_, err := onceClient(t, east).Broadcast(ctx, genericDDL(1))
		pc := replStatus(ctx, t, east).GetPrimaryCheck()
		switch p {
		case server.RefuseUnconfirmed:
			if !errors.Is(err, client.ErrTaskNotCreated) || !strings.Contains(err.Error(), "cannot confirm that it is still the primary") || pc.GetConfirmed() {
				t.Fatalf("refuse: DDL %v, check %v", err, pc)
			}
		case server.AcceptUnconfirmed:
			if err != nil || !strings.Contains(pc.GetDetail(), "accepted unconfirmed") || !strings.Contains(pc.GetDetail(), "west") {
				t.Fatalf("accept: DDL %v, check %v", err, pc)
			}
		}
	}
}
