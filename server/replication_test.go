package server_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/server"
)

func standalone(t *testing.T, ctx context.Context, name string) *server.Process {
	t.Helper()
	cfg := server.Default()
	cfg.DataDir = t.TempDir()
	cfg.Cluster.Name = name
	cfg.API.Addr = "127.0.0.1:0"
	cfg.Metrics.Addr = ""
	cfg.Log.Level = "error"
	p, err := server.StartStandalone(ctx, cfg, server.GenericApp{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func replClient(p *server.Process) walcastv1connect.ReplicationServiceClient {
	return walcastv1connect.NewReplicationServiceClient(http.DefaultClient, "http://"+p.APIAddr())
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestR8_ReplicationAndForcePromoteBetweenStandalones runs two standalone
// clusters: west follows east, east's keyed broadcasts complete on west
// (DDL on west is refused), east is lost, west is force-promoted and then
// answers retries of east's keys with east's originals (R8.4) and takes new
// DDL.
func TestR8_ReplicationAndForcePromoteBetweenStandalones(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	east := standalone(t, ctx, "east")
	eastOpen := true
	defer func() {
		if eastOpen {
			_ = east.Close()
		}
	}()
	west := standalone(t, ctx, "west")
	defer west.Close()
	topo := &walcastv1.Topology{Primary: "east", Secondaries: []*walcastv1.SecondaryCluster{{Name: "west", Source: east.NATSURL()}}}
	if _, err := replClient(west).Follow(ctx, connect.NewRequest(&walcastv1.FollowRequest{Topology: topo})); err != nil {
		t.Fatal(err)
	}
	ec, err := client.New([]string{east.APIAddr()})
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	wc, err := client.New([]string{west.APIAddr()}, client.WithMaxAttempts(3))
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close()
	req := func(i int) *client.BroadcastRequest {
		return &client.BroadcastRequest{Type: server.GenericType, Payload: []byte(fmt.Sprint("ddl-", i)),
			VChannels:    []message.VChannel{message.VChannel(fmt.Sprintf("wal-%d/c%d", i%4, i))},
			ResourceKeys: []resource.Key{resource.ExclusiveCollection("db", fmt.Sprint("c", i%3))},
			Scope:        client.ClusterScope(), ClientKey: fmt.Sprint("key-", i)}
	}
	ids := map[int]uint64{}
	for i := range 8 {
		r, err := ec.Broadcast(ctx, req(i))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = r.BroadcastID
	}
	waitUntil(t, "west to apply east's broadcasts", func() bool {
		for i := range 8 {
			r, err := wc.LookupKey(ctx, server.GenericType, message.ClusterKey(fmt.Sprint("key-", i)))
			if err != nil || r.GetState() != "TOMBSTONE" || r.GetBroadcastId() != ids[i] {
				return false
			}
		}
		return true
	})
	if _, err := wc.Broadcast(ctx, req(100)); !errors.Is(err, client.ErrNotPrimary) {
		t.Fatalf("DDL on the secondary: %v, want not primary", err)
	}
	st, err := replClient(west).Status(ctx, connect.NewRequest(&walcastv1.ReplicationStatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if st.Msg.GetRole() != "secondary" || !st.Msg.GetReplicating() || len(st.Msg.GetPchannels()) != 4 {
		t.Fatalf("west status %+v", st.Msg)
	}

	// East is lost; west takes over.
	if err := east.Close(); err != nil {
		t.Fatal(err)
	}
	eastOpen = false
	if _, err := replClient(west).ForcePromote(ctx, connect.NewRequest(&walcastv1.ForcePromoteRequest{})); err != nil {
		t.Fatal(err)
	}
	st, err = replClient(west).Status(ctx, connect.NewRequest(&walcastv1.ReplicationStatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if st.Msg.GetRole() != "primary" || st.Msg.GetReplicating() || len(st.Msg.GetIncomplete()) != 0 {
		t.Fatalf("west after promote %+v", st.Msg)
	}
	// Retries of keys accepted on east get east's originals (R8.4).
	for i := range 8 {
		r, err := wc.Broadcast(ctx, req(i))
		if err != nil {
			t.Fatal(err)
		}
		if !r.Duplicated || r.BroadcastID != ids[i] {
			t.Fatalf("retry of key-%d on the promoted cluster: %+v, want duplicate of %d", i, r, ids[i])
		}
	}
	r, err := wc.Broadcast(ctx, req(100))
	if err != nil || r.Duplicated {
		t.Fatalf("new DDL on the promoted cluster: %+v, %v", r, err)
	}
	for _, id := range ids {
		if r.BroadcastID <= id {
			t.Fatalf("new broadcast id %d is not above replicated %d", r.BroadcastID, id)
		}
	}
	if _, err := replClient(west).ForcePromote(ctx, connect.NewRequest(&walcastv1.ForcePromoteRequest{})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("second promote: %v", err)
	}
}
