package broadcast_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/broadcast/broadcastbench"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/cputime"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// benchTargets is the SPEC §12 setup: 4 vchannels on 4 pchannels (plus the
// control channel the broadcaster adds).
var benchTargets = []message.VChannel{vch(0, "v"), vch(1, "v"), vch(2, "v"), vch(3, "v")}

// BenchmarkBroadcast is one uncontended broadcast at a time on the in-memory
// backends, a lane per pchannel: the engine's own cost (B10; the same body
// as walcast bench's, package broadcastbench).
func BenchmarkBroadcast(b *testing.B) { broadcastbench.Uncontended(0)(b) }

// BenchmarkBroadcastOneLane is BenchmarkBroadcast with the pchannels folded
// into one WAL lane, the server's default (wal.lanes: 1): one entry per
// broadcast holds its copies for every pchannel.
func BenchmarkBroadcastOneLane(b *testing.B) { broadcastbench.Uncontended(1)(b) }

// BenchmarkBroadcastParallel runs 64 goroutines of non-conflicting
// broadcasts through a group-commit catalog.
func BenchmarkBroadcastParallel(b *testing.B) { benchBroadcastParallel(b, newEnv(b)) }

// BenchmarkBroadcastParallelOneLane is BenchmarkBroadcastParallel with the
// server's default of one WAL lane.
func BenchmarkBroadcastParallelOneLane(b *testing.B) { benchBroadcastParallel(b, newEnvLanes(b, 1)) }

func benchBroadcastParallel(b *testing.B, e *env) {
	var g *catalog.Group
	bc := e.open(func(c *broadcast.Config) {
		g = e.group(c.Catalog)
		c.Catalog = g
	})
	ctx := context.Background()
	m, _ := message.NewBroadcast(typPlain, []byte("payload"), benchTargets)
	var n atomic.Int64
	b.SetParallelism(32) // 64 goroutines on 2 CPUs
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cputime.Process()
	b.RunParallel(func(pb *testing.PB) {
		key := resource.ExclusiveCollection("db", fmt.Sprint("c", n.Add(1)))
		for pb.Next() {
			if _, err := do(ctx, bc, m, key); err != nil {
				b.Fatal(err)
			}
		}
	})
	cputime.ReportPerOp(b, cpu, b.N)
	trips, commits := g.RoundTrips()
	b.ReportMetric(float64(commits)/float64(b.N), "commits/op")
	b.ReportMetric(float64(trips)/float64(b.N), "roundtrips/op")
	st := bc.Stats()
	b.ReportMetric(float64(st.AppendRounds)/float64(b.N), "appends/op")
}
