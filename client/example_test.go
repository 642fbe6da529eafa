package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/walcast/walcast/app"
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
	p, err := server.StartStandalone(ctx, cfg, app.Generic{})
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
		Type:         app.GenericType,
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

// ExampleClient_BeginTxn holds a collection's key across a transaction's
// separate calls: a broadcast that does not wait (NoWait) is refused while
// the transaction holds the key, naming the holder, and goes through once
// the Commit released it.
func ExampleClient_BeginTxn() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, _ := os.MkdirTemp("", "walcast-example-")
	defer os.RemoveAll(dir)
	cfg := server.Default()
	cfg.DataDir, cfg.API.Addr, cfg.Metrics.Addr, cfg.Log.Level, cfg.Audit.File = dir, "127.0.0.1:0", "", "error", "off"
	p, err := server.StartStandalone(ctx, cfg, app.Generic{})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	c, err := client.New([]string{p.APIAddr()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	key := resource.ExclusiveCollection("shop", "orders")
	x, err := c.BeginTxn(ctx, &client.BeginTxnRequest{Type: app.GenericType, Payload: []byte("import 7: begin"),
		VChannels: []message.VChannel{"wal-1/c1v0"}, ResourceKeys: []resource.Key{key},
		Scope: client.CollectionScope(1), ClientKey: "import-7"}) // a repeat returns this transaction
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.TxnBody(ctx, x.ID, &client.TxnMemberRequest{Type: app.GenericType, Payload: []byte("import 7: files")}); err != nil {
		log.Fatal(err)
	}
	ddl := &client.BroadcastRequest{Type: app.GenericType, Payload: []byte("drop shop.orders"),
		VChannels: []message.VChannel{"wal-1/c1v0"}, ResourceKeys: []resource.Key{key}, NoWait: true}
	_, err = c.Broadcast(ctx, ddl)
	var ce *client.Error
	if errors.Is(err, client.ErrBusy) && errors.As(err, &ce) {
		fmt.Println("busy, held by", ce.Holder)
	}
	if _, err := c.CommitTxn(ctx, x.ID, &client.TxnMemberRequest{Type: app.GenericType, Payload: []byte("import 7: commit")}); err != nil {
		log.Fatal(err)
	}
	if _, err := c.Broadcast(ctx, ddl); err == nil {
		fmt.Println("free after the commit")
	}
	// Output:
	// busy, held by transaction 1@X
	// free after the commit
}
