package replicate_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/replicate"
	"github.com/walcast/walcast/wal"
	walkafka "github.com/walcast/walcast/wal/kafka"
	wmem "github.com/walcast/walcast/wal/memory"
	walnats "github.com/walcast/walcast/wal/nats"
)

// TestR8_6_SalvageListsTheUnreplicatedTail: a replicator copies east's WAL
// (on NATS, on Kafka) into west's and is stopped, as a promote stops it;
// the positions it reached are recorded (Replicated); east writes on (the
// tail the promote loses), another cluster's entry among it. Salvage lists
// exactly the broadcasts of the tail, with their copies and times, and
// nothing west has.
func TestR8_6_SalvageListsTheUnreplicatedTail(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	backends := map[string]func(t *testing.T) wal.Log{
		"nats": func(t *testing.T) wal.Log {
			srv, err := embednats.Start(ctx, embednats.Config{Dir: t.TempDir(), SyncAlways: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Close)
			l, err := walnats.New(ctx, walnats.Config{URL: srv.ClientURL(), PChannels: pchans})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			return l
		},
		"kafka": func(t *testing.T) wal.Log {
			kc, err := kfake.NewCluster(kfake.NumBrokers(1))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(kc.Close)
			l, err := walkafka.New(ctx, walkafka.Config{Brokers: kc.ListenAddrs(), PChannels: pchans, ReplicationFactor: 1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			return l
		},
	}
	for name, open := range backends {
		t.Run(name, func(t *testing.T) {
			src := open(t)
			east := wal.New(src, wal.WithCluster("east"))
			appendSource(t, east, 0, 10)
			dst := wmem.New(pchans...)
			west := wal.New(dst, wal.WithCluster("west"))
			cat := cmem.New()
			cfg := replicate.Config{SourceCluster: "east", Source: east, Dest: west, PChannels: pchans, Types: types(), Catalog: cat,
				Logger: slog.New(slog.DiscardHandler)}
			stop := run(t, cfg)
			// West has copied everything, past east's local broadcast 10
			// too (its checkpoint says so once the replicator is idle).
			waitFor(t, "west to copy east's first ten", func() bool {
				pos, err := replicate.Replicated(ctx, cfg)
				if err != nil {
					t.Fatal(err)
				}
				for _, p := range pchans {
					if end, err := east.End(ctx, p); err != nil || pos[p] != end {
						return false
					}
				}
				return true
			})
			stop()
			pos, err := replicate.Replicated(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			// The tail: east's broadcasts 11 to 16, and north's entry.
			appendSource(t, east, 10, 6)
			appendSource(t, wal.New(src, wal.WithCluster("north")), 50, 1)
			lost, err := replicate.Salvage(ctx, src, pchans, 0, replicate.Promotion{Cluster: "west", Replaced: "east", Positions: pos})
			if err != nil {
				t.Fatal(err)
			}
			var ids []uint64
			for _, l := range lost {
				ids = append(ids, l.Message.Broadcast.ID)
				if l.First.IsZero() || time.Since(l.First) > time.Minute || len(l.Copies) == 0 {
					t.Errorf("broadcast %d: first seen %v, copies %v", l.Message.Broadcast.ID, l.First, l.Copies)
				}
				for _, c := range l.Copies {
					if c.Offset < pos[c.VChannel.PChannel()] {
						t.Errorf("broadcast %d: a copy at %s@%d, before the position %d", l.Message.Broadcast.ID, c.VChannel, c.Offset, pos[c.VChannel.PChannel()])
					}
				}
			}
			if want := []uint64{11, 12, 13, 14, 15, 16}; !slices.Equal(ids, want) {
				t.Fatalf("salvage listed %v, want the tail %v", ids, want)
			}
			if l := lost[0]; l.Message.Type != typDDL || !slices.Contains(l.Message.Broadcast.VChannels, message.VChannel("wal-0/_control")) {
				t.Fatalf("broadcast 11 as salvaged: %+v", l.Message)
			}
		})
	}
}
