package etcd

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/walcast/walcast/catalog"
)

// The benchmarks write to the shared embedded member (fsync on, as in
// production). The Raw ones are the floors our Commit is measured against:
// compare BenchmarkCommit with BenchmarkRawPutSequential, and
// BenchmarkCommitParallel with BenchmarkRawTxnParallel, in one run.
//
//	go test -run xxx -bench . -count 3 ./catalog/etcd

// benchCallers is how many goroutines the parallel benchmarks run.
const benchCallers = 64

// parallelism is the b.SetParallelism factor giving benchCallers goroutines
// (RunParallel starts GOMAXPROCS × factor).
func parallelism() int {
	p := benchCallers / runtime.GOMAXPROCS(0)
	return max(p, 1)
}

var benchValue = []byte(`{"state":"PENDING","msg":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}`)

func BenchmarkRawPutSequential(b *testing.B) {
	client := newClient(b, server(b))
	prefix, _ := uniquePrefixes()
	ctx := context.Background()
	i := 0
	for b.Loop() {
		if _, err := client.Put(ctx, fmt.Sprintf("%s%d", prefix, i), string(benchValue)); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkRawTxnParallel(b *testing.B) {
	client := newClient(b, server(b))
	prefix, _ := uniquePrefixes()
	ctx := context.Background()
	var n atomic.Int64
	b.SetParallelism(parallelism())
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := fmt.Sprintf("%s%d", prefix, n.Add(1))
			if _, err := client.Txn(ctx).Then(clientv3.OpPut(key, string(benchValue))).Commit(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// benchCatalog is a fenced catalog, as the coordinator uses it.
func benchCatalog(b *testing.B) *Catalog {
	srv := server(b)
	client := newClient(b, srv)
	prefix, election := uniquePrefixes()
	term := campaign(b, client, election, "bench", 10*time.Second)
	b.Cleanup(func() { term.Resign(context.Background()) })
	return newCatalog(b, client, Config{Prefix: prefix, Limits: serverLimits(srv), Fence: term.Fence()})
}

func reportTrips(b *testing.B, c *Catalog) {
	trips, commits := c.RoundTrips()
	if commits > 0 {
		b.ReportMetric(float64(trips)/float64(commits), "trips/commit")
	}
}

func BenchmarkCommit(b *testing.B) {
	c := benchCatalog(b)
	ctx := context.Background()
	i := 0
	for b.Loop() {
		if err := c.Commit(ctx, catalog.Put(fmt.Sprintf("task/%d", i), benchValue)); err != nil {
			b.Fatal(err)
		}
		i++
	}
	reportTrips(b, c)
}

func BenchmarkCommitParallel(b *testing.B) {
	c := benchCatalog(b)
	ctx := context.Background()
	var n atomic.Int64
	b.SetParallelism(parallelism())
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := c.Commit(ctx, catalog.Put(fmt.Sprintf("task/%d", n.Add(1)), benchValue)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportTrips(b, c)
}

// BenchmarkList lists a prefix of n keys (as recovery lists the task
// records): the time per key listed should not grow with n.
//
//	go test -run xxx -bench List -benchtime 3x ./catalog/etcd
func BenchmarkList(b *testing.B) {
	for _, n := range []int{25_000, 100_000, 400_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			s := ownServer(b)
			cl := newClient(b, s)
			c, err := New(cl, Config{Prefix: "list/", Limits: catalog.Limits{MaxOps: s.MaxTxnOps(), MaxBytes: DefaultMaxBytes}})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			ops := make([]catalog.Op, 0, s.MaxTxnOps())
			for i := range n {
				ops = append(ops, catalog.Put(fmt.Sprintf("tasks/%020d", i), benchValue))
				if len(ops) == cap(ops) || i == n-1 {
					if err := c.Commit(ctx, ops...); err != nil {
						b.Fatal(err)
					}
					ops = ops[:0]
				}
			}
			b.ResetTimer()
			for b.Loop() {
				got := 0
				if err := c.List(ctx, "tasks/", func(string, []byte) error { got++; return nil }); err != nil {
					b.Fatal(err)
				}
				if got != n {
					b.Fatalf("listed %d keys of %d", got, n)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/key")
		})
	}
}
