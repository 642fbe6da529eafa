// Package broadcastbench is the engine's own benchmark (SPEC B10): one
// broadcast at a time through a Broadcaster on the in-memory catalog and
// WAL, nothing else running. It is one body that both measure:
// `go test -bench 'BenchmarkBroadcast(OneLane)?$' ./broadcast` and
// `walcast bench --only B10` (through testing.Benchmark), so that their
// figures are the same measurement.
package broadcastbench

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/internal/cputime"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// PChannels are the benchmark's pchannels (SPEC §12: 4 vchannels on 4
// pchannels, plus the control channel the broadcaster adds).
var PChannels = []message.PChannel{"wal-0", "wal-1", "wal-2", "wal-3"}

// Type is the benchmark's message type: no callback.
var Type = message.Type{Name: "NoCallback", Version: 1}

// Targets are the vchannels each broadcast targets, one per pchannel.
func Targets() []message.VChannel {
	vs := make([]message.VChannel, len(PChannels))
	for i, p := range PChannels {
		vs[i] = message.VChannel(fmt.Sprintf("%s/v", p))
	}
	return vs
}

// Uncontended returns B10's benchmark body with the pchannels folded into
// lanes WAL lanes (0: one lane per pchannel; the server's default is 1).
// It reports cpu-ns/op (the process's CPU per broadcast, the collector's
// work included) and commits/op besides the allocations.
func Uncontended(lanes int) func(b *testing.B) {
	return func(b *testing.B) {
		store := cmem.NewStore()
		types := message.NewRegistry()
		types.MustRegister(message.TypeInfo{Type: Type})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		bc, err := broadcast.New(ctx, broadcast.Config{
			Catalog: store.Open(), WAL: wal.New(wmem.New(wal.Lanes(lanes, PChannels)...), wal.WithLanes(lanes, PChannels)),
			Types: types, Callbacks: broadcast.NewCallbacks(), ControlChannel: PChannels[0].Control(),
			Backoff: broadcast.Backoff{Initial: time.Millisecond, Multiplier: 2, Max: 20 * time.Millisecond},
			Logger:  slog.New(slog.DiscardHandler),
		})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = bc.Close() })
		m, err := message.NewBroadcast(Type, []byte("payload"), Targets())
		if err != nil {
			b.Fatal(err)
		}
		key := resource.ExclusiveCollection("db", "c")
		bctx := context.Background()
		before := store.Applied()
		b.ReportAllocs()
		cpu := cputime.Process()
		for b.Loop() {
			if err := once(bctx, bc, m, key); err != nil {
				b.Fatal(err)
			}
		}
		cputime.ReportPerOp(b, cpu, b.N)
		b.ReportMetric(float64(store.Applied()-before)/float64(b.N), "commits/op")
	}
}

// once is one broadcast as an application makes it: take the key, send,
// release.
func once(ctx context.Context, bc *broadcast.Broadcaster, m *message.Message, key resource.Key) error {
	h, err := bc.WithResourceKeys(ctx, key)
	if err != nil {
		return err
	}
	defer h.Close()
	_, err = h.Broadcast(ctx, m)
	return err
}
