package client_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/server"
)

// ExampleClient_Broadcast sends a keyed broadcast to a walcast server (a
// standalone one, started here) and repeats it: the repeat, with the same
// request and so the same key, is answered by the original instead of
// broadcasting again, however often a client retries it.
func ExampleClient_Broadcast() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, _ := os.MkdirTemp("", "walcast-example-")
	defer os.RemoveAll(dir)
	cfg := server.Default()
	cfg.DataDir, cfg.API.Addr, cfg.Metrics.Addr, cfg.Log.Level, cfg.Audit.File = dir, "127.0.0.1:0", "", "error", "off"
	p, err := server.StartStandalone(ctx, cfg, server.GenericApp{})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()

	c, err := client.New([]string{p.APIAddr()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	req := &client.BroadcastRequest{
		Type:         server.GenericType,
		Payload:      []byte("create shop.orders"),
		VChannels:    []message.VChannel{"wal-1/c1v0", "wal-2/c1v1"},
		ResourceKeys: []resource.Key{resource.SharedDatabase("shop"), resource.ExclusiveCollection("shop", "orders")},
		Scope:        client.ClusterScope(), // idempotent: the client mints the key once, in req.ClientKey
	}
	for range 2 {
		res, err := c.Broadcast(ctx, req)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("broadcast %d duplicated=%v copies=%d\n", res.BroadcastID, res.Duplicated, len(res.Appends))
	}
	// Output:
	// broadcast 1 duplicated=false copies=3
	// broadcast 1 duplicated=true copies=3
}
