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
	store, bc := recoveredTombstones(b, n, payload)
	var err error
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

// recoveredTombstones is a broadcaster that recovered n of B6's tombstone
// records (each with an idempotency key, a payload of payload bytes) from
// the in-memory catalog it returns.
func recoveredTombstones(b *testing.B, n, payload int) (*catmem.Store, *broadcast.Broadcaster) {
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
	return store, bc
}

// BenchmarkR7_5_KeysPage is the cost of one page of 1,000 remembered keys
// (Broadcaster.Keys, what ListKeys serves) among n recovered keyed
// tombstones, from a cursor in the middle: its time and its allocations
// (B/op) stay flat from 100,000 to 1,000,000 tombstones, since a page
// walks the index from its cursor and copies none of it. For comparison,
// ListTasks's page of 1,000 tombstones (Broadcaster.Tasks), which copies
// every tombstone's record header and sorts them per page:
//
//	go test ./cmd/walcast/internal/bench -run '^$' -bench R7_5_KeysPage -benchtime 20x
func BenchmarkR7_5_KeysPage(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		_, bc := recoveredTombstones(b, n, 64)
		after := uint64(n / 2)
		b.Run(fmt.Sprintf("keys/tombstones=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				keys, next, err := bc.Keys(context.Background(), after, 1000)
				if err != nil || len(keys) != 1000 || next == 0 {
					b.Fatalf("%d keys, next %d, %v", len(keys), next, err)
				}
			}
		})
		b.Run(fmt.Sprintf("tasks/tombstones=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				tasks, err := bc.Tasks(broadcast.Filter{AfterID: after, Limit: 1000})
				if err != nil || len(tasks) != 1000 {
					b.Fatalf("%d tasks, %v", len(tasks), err)
				}
			}
		})
		if err := bc.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
