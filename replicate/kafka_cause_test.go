package replicate_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/replicate"
	"github.com/walcast/walcast/wal"
	walkafka "github.com/walcast/walcast/wal/kafka"
	wmem "github.com/walcast/walcast/wal/memory"
)

// TestR9_10_KafkaPrimaryUnreachableNamedInStatus: when the primary's WAL
// is a Kafka cluster that stops, the replicator's status says which broker
// cannot be reached and why ("cannot reach Kafka at host:port: connection
// refused"), not a franz-go internal message.
func TestR9_10_KafkaPrimaryUnreachableNamedInStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	addr := kc.ListenAddrs()[0]
	src, err := walkafka.New(ctx, walkafka.Config{Brokers: kc.ListenAddrs(), PChannels: pchans, ReplicationFactor: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	east := wal.New(src, wal.WithCluster("east"))
	appendSource(t, east, 0, 4)
	west := wal.New(wmem.New(pchans...), wal.WithCluster("west"))
	r, err := replicate.New(replicate.Config{SourceCluster: "east", Source: east, Dest: west, PChannels: pchans, Types: types(),
		Catalog: cmem.New(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(rctx) }()
	defer func() { rcancel(); <-done }()
	waitFor(t, "the replicator caught up", func() bool {
		for _, s := range r.Status() {
			if !s.LagKnown || s.Lag != 0 || s.SourceEnd == 0 {
				return false
			}
		}
		return true
	})
	kc.Close()
	want := "cannot reach Kafka at " + addr + ": connection refused"
	waitFor(t, "the source error naming the broker", func() bool {
		for _, s := range r.Status() {
			if !strings.Contains(s.SourceError, want) {
				return false
			}
		}
		return true
	})
	for _, s := range r.Status() {
		if strings.Contains(s.SourceError, "unable to dial") {
			t.Errorf("%s: source error %q repeats franz-go's words", s.PChannel, s.SourceError)
		}
	}
}
