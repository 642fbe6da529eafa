package server_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/internal/wait"
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
	p, err := server.StartStandalone(ctx, cfg, app.Generic{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func replClient(p *server.Process) walcastv1connect.ReplicationServiceClient {
	return walcastv1connect.NewReplicationServiceClient(http.DefaultClient, "http://"+p.APIAddr())
}

// waitUntil waits for an event: see wait.For.
var waitUntil = wait.For

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
		return &client.BroadcastRequest{Type: app.GenericType, Payload: []byte(fmt.Sprint("ddl-", i)),
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
			r, err := wc.LookupKey(ctx, app.GenericType, message.ClusterKey(fmt.Sprint("key-", i)))
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
	if st.Msg.GetRole() != "secondary" || !st.Msg.GetReplicating() || len(st.Msg.GetPchannels()) != 4 ||
		st.Msg.GetPchannelCount() != 4 || st.Msg.GetLanes() != 1 || !st.Msg.GetSource().GetReachable() {
		t.Fatalf("west status %+v", st.Msg)
	}

	// East is lost: west says so, with the error and since when, and no
	// longer claims to replicate or to know its lag.
	if err := east.Close(); err != nil {
		t.Fatal(err)
	}
	eastOpen = false
	lost := time.Now()
	waitUntil(t, "west to report east unreachable", func() bool {
		st, err = replClient(west).Status(ctx, connect.NewRequest(&walcastv1.ReplicationStatusRequest{}))
		return err == nil && !st.Msg.GetSource().GetReachable()
	})
	src := st.Msg.GetSource()
	if st.Msg.GetReplicating() || src.GetLastError() == "" || src.GetUnreachableSince().AsTime().Before(lost.Add(-time.Second)) ||
		src.GetUrl() != topo.Secondaries[0].Source {
		t.Fatalf("west with east lost: replicating %v, source %+v", st.Msg.GetReplicating(), src)
	}
	for _, pc := range st.Msg.GetPchannels() {
		if pc.GetLagKnown() || pc.GetLag() != 0 || pc.GetSourceEnd() != 0 {
			t.Errorf("%s: lag known %v (%d of %d) while east is unreachable", pc.GetPchannel(), pc.GetLagKnown(), pc.GetLag(), pc.GetSourceEnd())
		}
	}
	if _, err := replClient(west).ForcePromote(ctx, connect.NewRequest(&walcastv1.ForcePromoteRequest{})); err != nil {
		t.Fatal(err)
	}
	st, err = replClient(west).Status(ctx, connect.NewRequest(&walcastv1.ReplicationStatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if st.Msg.GetRole() != "primary" || st.Msg.GetReplicating() || len(st.Msg.GetIncomplete()) != 0 || st.Msg.GetSource() != nil {
		t.Fatalf("west after promote %+v", st.Msg)
	}
	if st.Msg.GetPromoteBroadcastId() == 0 || st.Msg.GetPromotedAt().AsTime().Before(lost) {
		t.Fatalf("west after promote: promote broadcast %d at %v", st.Msg.GetPromoteBroadcastId(), st.Msg.GetPromotedAt())
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

// TestR8_FollowValidatesBeforeChangingAnything: a follow that could not
// replicate is refused, and the cluster stays primary: a topology that does
// not list this cluster as a secondary, an empty or malformed source URL, a
// source nobody serves (unless allow_unreachable), and a NATS server without
// this cluster's WAL streams (another layout, or no walcast WAL).
func TestR8_FollowValidatesBeforeChangingAnything(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	west := standalone(t, ctx, "west")
	defer west.Close()
	bare, err := embednats.Start(ctx, embednats.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	closed := "nats://" + closedAddr(t)
	follow := func(allow bool, secondaries ...*walcastv1.SecondaryCluster) error {
		_, err := replClient(west).Follow(ctx, connect.NewRequest(&walcastv1.FollowRequest{AllowUnreachable: allow,
			Topology: &walcastv1.Topology{Primary: "east", Secondaries: secondaries}}))
		return err
	}
	sec := func(name, src string) *walcastv1.SecondaryCluster {
		return &walcastv1.SecondaryCluster{Name: name, Source: src}
	}
	for _, c := range []struct {
		name  string
		err   error
		code  connect.Code
		words string
	}{
		{"another cluster's name", follow(false, sec("wset", bare.ClientURL())), connect.CodeInvalidArgument, `this cluster is named "west"`},
		{"no secondaries", follow(false), connect.CodeInvalidArgument, `this cluster is named "west"`},
		{"empty URL", follow(false, sec("west", "")), connect.CodeInvalidArgument, "source URL"},
		{"malformed URL", follow(false, sec("west", "east:4222")), connect.CodeInvalidArgument, "is not a URL"},
		{"listed twice", follow(false, sec("west", bare.ClientURL()), sec("west", bare.ClientURL())), connect.CodeInvalidArgument, "twice"},
		{"unreachable", follow(false, sec("west", closed)), connect.CodeFailedPrecondition, "cannot reach the primary's WAL"},
		{"no walcast streams", follow(false, sec("west", bare.ClientURL())), connect.CodeFailedPrecondition, "no stream WALCAST_lane-0"},
	} {
		if connect.CodeOf(c.err) != c.code || c.err == nil || !strings.Contains(c.err.Error(), c.words) {
			t.Errorf("%s: %v, want %v saying %q", c.name, c.err, c.code, c.words)
		}
	}
	st, err := replClient(west).Status(ctx, connect.NewRequest(&walcastv1.ReplicationStatusRequest{}))
	if err != nil || st.Msg.GetRole() != "primary" || st.Msg.GetTopology().GetPrimary() != "" {
		t.Fatalf("west after refused follows: %+v, %v", st.Msg, err)
	}
	// Told to, it follows an unreachable primary, and says it cannot
	// reach it.
	if err := follow(true, sec("west", closed)); err != nil {
		t.Fatalf("follow with allow_unreachable: %v", err)
	}
	waitUntil(t, "west to report its primary unreachable", func() bool {
		st, err = replClient(west).Status(ctx, connect.NewRequest(&walcastv1.ReplicationStatusRequest{}))
		return err == nil && st.Msg.GetSource() != nil
	})
	if src := st.Msg.GetSource(); st.Msg.GetRole() != "secondary" || st.Msg.GetReplicating() || src.GetReachable() ||
		src.GetLastError() == "" || src.GetUnreachableSince() == nil || src.GetUrl() != closed {
		t.Fatalf("west following an unreachable primary: %+v", st.Msg)
	}
}

// closedAddr returns a 127.0.0.1 address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}
