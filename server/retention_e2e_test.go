package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/server"
	"github.com/walcast/walcast/wal/waltest"
)

// TestR9_1_StandaloneWALRetention: a standalone drops the WAL entries
// older than standalone.wal_retention that its nodes saved past (its
// stream's first entry moves on), its nodes keep applying what comes after,
// and it starts again on its data with the entries gone.
func TestR9_1_StandaloneWALRetention(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := server.Default()
	cfg.DataDir = t.TempDir()
	cfg.API.Addr = "127.0.0.1:0"
	cfg.Metrics.Addr = ""
	cfg.Log.Level = "error"
	cfg.WAL.NATS.DedupWindow = server.Duration(time.Second)
	cfg.Standalone.WALRetention = server.Duration(time.Second)
	start := func() *server.Process {
		t.Helper()
		p, err := server.StartStandalone(ctx, cfg, app.Generic{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := start()
	defer func() { _ = p.Close() }()
	n := 0
	var sent []message.VChannel
	send := func(count int) {
		t.Helper()
		c, err := client.New([]string{p.APIAddr()})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for range count {
			n++
			v := message.VChannel(fmt.Sprintf("wal-%d/c%d", n%4, n))
			sent = append(sent, v)
			if _, err := c.Broadcast(ctx, &client.BroadcastRequest{Type: app.GenericType, Payload: []byte("x"),
				VChannels:    []message.VChannel{v},
				ResourceKeys: []resource.Key{resource.ExclusiveCollection("db", fmt.Sprint("c", n))}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	js := waltest.JetStream(t, p.NATSURL())
	stream := func() jetstream.StreamState {
		t.Helper()
		s, err := js.Stream(ctx, "WALCAST_lane-0")
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().State
	}
	// Every vchannel sent to, applied by a node of the process.
	applied := func() bool {
	next:
		for _, v := range sent {
			for _, nd := range p.Nodes {
				if vs, ok := nd.VChannel(v); ok && vs.Applied == 1 {
					continue next
				}
			}
			return false
		}
		return true
	}
	send(20)
	waitUntil(t, "the retention to drop the first entries", func() bool { return stream().FirstSeq > 1 })
	if st := stream(); st.Msgs == 0 || st.FirstSeq > st.LastSeq {
		t.Fatalf("the lane's last entry was dropped too: %+v", st)
	}
	send(10)
	waitUntil(t, "the nodes to apply what came after", applied)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = start()
	sent = nil
	send(5)
	waitUntil(t, "the restarted nodes to apply", applied)
}
