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
