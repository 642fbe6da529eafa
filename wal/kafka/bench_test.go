package kafka

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walcast/walcast/message"
)

// benchSizes are the entry sizes benchmarked: a few small broadcasts, and a
// large packed entry.
var benchSizes = []int{256, 64 << 10}

// payload returns n random bytes: zeros would let the producer's default
// snappy compression shrink the large entries to nothing.
func payload(n int) []byte {
	p := make([]byte, n)
	rand.Read(p)
	return p
}

// BenchmarkRawProduceSync is the floor under BenchmarkAppend: one kgo
// ProduceSync of one record per op, with the producer settings the log uses
// (acks from all in-sync replicas, idempotent, no linger, manual
// partitioning), against kfake.
func BenchmarkRawProduceSync(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprint(size, "B"), func(b *testing.B) {
			c := newCluster(b, kfake.SeedTopics(1, "raw"))
			cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RequiredAcks(kgo.AllISRAcks()),
				kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.ManualPartitioner()))
			if err != nil {
				b.Fatal(err)
			}
			defer cl.Close()
			ctx := context.Background()
			value := payload(size)
			produce := func() {
				if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "raw", Value: value}).FirstErr(); err != nil {
					b.Fatal(err)
				}
			}
			produce() // connect and get a producer id
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				produce()
			}
		})
	}
}

// BenchmarkAppend is Log.Append, one entry per op, against kfake.
func BenchmarkAppend(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprint(size, "B"), func(b *testing.B) {
			l := open(b, newCluster(b), Config{PChannels: []message.PChannel{"p"}})
			ctx := context.Background()
			data := payload(size)
			sum := sha256.Sum256(data)
			id := hex.EncodeToString(sum[:])
			if _, err := l.Append(ctx, "p", id, data); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := l.Append(ctx, "p", id, data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAppendParallel is Log.Append from concurrent goroutines on one
// pchannel: the producer packs their records into shared batches.
func BenchmarkAppendParallel(b *testing.B) {
	l := open(b, newCluster(b), Config{PChannels: []message.PChannel{"p"}})
	ctx := context.Background()
	data := payload(benchSizes[0])
	if _, err := l.Append(ctx, "p", "warm", data); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(8)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.Append(ctx, "p", "x", data); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkRawProduceSyncParallel is BenchmarkRawProduceSync from
// concurrent goroutines, the floor under BenchmarkAppendParallel.
func BenchmarkRawProduceSyncParallel(b *testing.B) {
	c := newCluster(b, kfake.SeedTopics(1, "raw"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	value := payload(benchSizes[0])
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "raw", Value: value}).FirstErr(); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(8)
	b.SetBytes(int64(len(value)))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "raw", Value: value}).FirstErr(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
