package bench

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	catmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/internal/durablepb"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	walmem "github.com/walcast/walcast/wal/memory"
)

// BenchmarkB6MemoryPerTombstone is B6's memory figure without etcd: the
// heap a broadcaster holds after recovering n of B6's tombstone records
// from the in-memory catalog, per tombstone, beyond its 64-byte payload
// (the B/tombstone metric; SPEC B6: <= 300 B, at 1M too). It reads the
// heap, not the clock, so it does not depend on the machine's load:
//
//	go test ./cmd/walcast/internal/bench -run '^$' -bench B6Memory -benchtime 1x
func BenchmarkB6MemoryPerTombstone(b *testing.B) {
	for _, n := range []int{100_000, 920_000, 1_000_000} {
		b.Run(fmt.Sprintf("tombstones=%d", n), func(b *testing.B) {
			for range b.N {
				b.ReportMetric(memoryPerTombstone(b, n), "B/tombstone")
			}
		})
	}
}

func memoryPerTombstone(b *testing.B, n int) float64 {
	const payload = 64
	ctx := context.Background()
	store := catmem.NewStore()
	cat := store.Open()
	pay := make([]byte, payload)
	digest := broadcast.PayloadDigest(pay)
	now := time.Now()
	var ops []catalog.Op
	for i := range n {
		id := 1 + uint64(i)
		raw, err := benchRecord(id, uint64(i), durablepb.TaskState_TASK_STATE_TOMBSTONE, now, pay, digest)
		if err != nil {
			b.Fatal(err)
		}
		ops = append(ops, catalog.Put(fmt.Sprintf("bc/tasks/%020d", id), raw))
		if len(ops) == catalog.DefaultMaxOps || i == n-1 {
			if err := cat.Commit(ctx, ops...); err != nil {
				b.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	pchans := []message.PChannel{"wal-0", "wal-1", "wal-2", "wal-3"}
	types := message.NewRegistry()
	types.MustRegister(message.TypeInfo{Type: BenchType})
	bc, err := broadcast.New(ctx, broadcast.Config{Catalog: store.Open(), WAL: wal.New(walmem.New(pchans...), wal.WithLanes(1, pchans)),
		Types: types, ControlChannel: pchans[0].Control(), PChannels: pchans, Prefix: "bc/",
		Logger: slog.New(slog.DiscardHandler), Tombstone: broadcast.TombstoneConfig{MaxCount: 1 << 30, MaxLifetime: 24 * time.Hour}})
	if err != nil {
		b.Fatal(err)
	}
	live := bc.Stats().Tombstones
	held := heapHeld(func() { err = bc.Close(); bc = nil })
	runtime.KeepAlive(store) // the records the catalog holds are not the broadcaster's
	if err != nil {
		b.Fatal(err)
	}
	if live != n {
		b.Fatalf("recovered %d tombstones of %d", live, n)
	}
	return held/float64(live) - payload
}
