package server_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/server/apitest"
)

// BenchmarkAPIBroadcast is a broadcast through the Connect API (the Go
// client over HTTP/1.1 to the server's handler) on in-memory backends,
// from 64 goroutines on distinct keys: the API layer's CPU and allocations
// per broadcast, beside the engine's (broadcast.BenchmarkBroadcastParallel).
// B8 (walcast bench --api) measures the same path on embedded etcd and
// NATS.
func BenchmarkAPIBroadcast(b *testing.B) {
	env := apitest.New(b)
	srv := apitest.Serve(b, app.StaticLeader(env.Open()), nil)
	c, err := client.New([]string{srv.URL})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	var n atomic.Int64
	b.SetParallelism(32) // 64 goroutines on 2 CPUs
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		g := n.Add(1)
		req := &client.BroadcastRequest{Type: apitest.Create, Payload: []byte("payload"),
			VChannels:    []message.VChannel{message.VChannel(fmt.Sprintf("wal-%d/v%d", g%2, g))},
			ResourceKeys: []resource.Key{resource.ExclusiveCollection("db", fmt.Sprint("c", g))}}
		for pb.Next() {
			if _, err := c.Broadcast(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
}
