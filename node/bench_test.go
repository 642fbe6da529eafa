package node

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// nopApplier applies nothing and snapshots an empty state.
type nopApplier struct{}

func (nopApplier) Apply(context.Context, wal.Copy) error     { return nil }
func (nopApplier) Snapshot(message.PChannel) ([]byte, error) { return nil, nil }
func (nopApplier) Restore(message.PChannel, []byte) error    { return nil }

// doneAcker counts acks and closes done once it has want of them.
type doneAcker struct {
	n, want atomic.Int64
	done    chan struct{}
}

func (a *doneAcker) Ack(context.Context, broadcast.Ack) error { a.add(1); return nil }

func (a *doneAcker) AckAll(_ context.Context, acks []broadcast.Ack) []error {
	a.add(len(acks))
	return nil
}

func (a *doneAcker) add(k int) {
	if a.n.Add(int64(k)) == a.want.Load() {
		close(a.done)
	}
}

// BenchmarkNodeConsume measures a node's cost per broadcast copy: reading
// the entries of one lane shared by two pchannels (as standalone lays its
// WAL out), decoding them, applying each copy (a no-op Applier) and acking
// each entry's copies in one call. Every broadcast has a copy on each
// pchannel, 16 broadcasts per entry.
func BenchmarkNodeConsume(b *testing.B) {
	const perEntry = 16
	lanes := wal.Lanes(1, pchans)
	log := wmem.New(lanes...)
	w := wal.New(log, wal.WithLanes(1, pchans))
	ctx := context.Background()
	broadcasts := b.N
	for first := 0; first < broadcasts; first += perEntry {
		var items []wal.Item
		for id := first; id < min(first+perEntry, broadcasts); id++ {
			m, err := message.NewBroadcast(typCreate, []byte("bench payload"), []message.VChannel{vA, vB})
			if err != nil {
				b.Fatal(err)
			}
			m.Broadcast.ID = uint64(id + 1)
			m.Broadcast.VChannels = []message.VChannel{vA, vB}
			data, err := message.Marshal(m)
			if err != nil {
				b.Fatal(err)
			}
			items = append(items, wal.Item{Message: data, VChannels: []message.VChannel{vA}},
				wal.Item{Message: data, VChannels: []message.VChannel{vB}})
		}
		if _, err := w.Append(ctx, lanes[0], items); err != nil {
			b.Fatal(err)
		}
	}
	acker := &doneAcker{done: make(chan struct{})}
	acker.want.Store(int64(2 * broadcasts))
	n, err := New(Config{Name: "bench", WAL: w, PChannels: pchans, Applier: nopApplier{}, Acker: acker,
		StateDir: b.TempDir(), Backoff: fastBackoff, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	if err := n.Start(ctx); err != nil {
		b.Fatal(err)
	}
	<-acker.done
	b.StopTimer()
	if err := n.Close(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*broadcasts), "ns/copy")
}
