package nats

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/internal/embednats"
)

// benchEntry is the payload of every benchmark append: a small packed entry.
const benchEntry = 256

// syncModes runs b once with JetStream syncing every write (what walcast
// needs) and once with the default two-minute interval, for comparison.
func syncModes(b *testing.B, f func(b *testing.B, srv *embednats.Server)) {
	for _, always := range []bool{true, false} {
		name := "sync=always"
		if !always {
			name = "sync=interval"
		}
		b.Run(name, func(b *testing.B) {
			f(b, startServerSync(b, embednats.Config{SyncAlways: always}))
		})
	}
}

func dedupID(i int64) string { return fmt.Sprintf("%064x", i) }

// BenchmarkRawPublishSync is the floor: plain JetStream publishes, one at a
// time, each waiting for its acknowledgement.
func BenchmarkRawPublishSync(b *testing.B) {
	syncModes(b, func(b *testing.B, srv *embednats.Server) {
		ctx := context.Background()
		nc, err := natsgo.Connect(srv.ClientURL())
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RAW", Subjects: []string{"raw"},
			Storage: jetstream.FileStorage}); err != nil {
			b.Fatal(err)
		}
		data := make([]byte, benchEntry)
		b.SetBytes(benchEntry)
		b.ResetTimer()
		for b.Loop() {
			if _, err := js.Publish(ctx, "raw", data); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkAppend is Log.Append, sequential, each with its own dedup id.
func BenchmarkAppend(b *testing.B) {
	syncModes(b, func(b *testing.B, srv *embednats.Server) {
		l := open(b, srv, "p")
		ctx := context.Background()
		data := make([]byte, benchEntry)
		b.SetBytes(benchEntry)
		var i int64
		b.ResetTimer()
		for b.Loop() {
			i++
			if _, err := l.Append(ctx, "p", dedupID(i), data); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkAppendParallel is Log.Append from 64 goroutines on one pchannel;
// ns/op is wall time per append, so 1e9/ns/op is appends per second.
func BenchmarkAppendParallel(b *testing.B) {
	syncModes(b, func(b *testing.B, srv *embednats.Server) {
		l := open(b, srv, "p")
		data := make([]byte, benchEntry)
		var n atomic.Int64
		b.SetBytes(benchEntry)
		b.SetParallelism((64 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		start := time.Now()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				if _, err := l.Append(ctx, "p", dedupID(n.Add(1)), data); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(n.Load())/time.Since(start).Seconds(), "appends/s")
	})
}
