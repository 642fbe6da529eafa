package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/walcast/walcast/internal/retry"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// foreignEntries hears the WAL entries of other clusters that this
// process's readers skipped (wal.WithForeign): clusters left on one stream
// or topic prefix of a shared NATS or Kafka, or a replicator whose topology
// names the primary wrongly. Each is counted in
// walcast_wal_foreign_entries_total{lane} (exported at zero for every lane
// from the start); the first of each lane and writer is logged as an error,
// with the writer's name, then at most one a minute with the count since.
type foreignEntries struct {
	log   *slog.Logger
	total *prometheus.CounterVec

	mu     sync.Mutex
	logged map[foreignKey]*foreignLog
}

type foreignKey struct{ lane, cluster string }

type foreignLog struct {
	at      time.Time
	skipped int
}

// foreignLogEvery is how often repeats are logged per lane and writer.
const foreignLogEvery = time.Minute

func newForeignEntries(reg prometheus.Registerer, log *slog.Logger, lanes []message.PChannel) *foreignEntries {
	f := &foreignEntries{log: log, logged: map[foreignKey]*foreignLog{},
		total: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walcast_wal_foreign_entries_total",
			Help: "WAL entries skipped because another cluster wrote them (clusters sharing a stream or topic prefix, or a replicator whose topology names its primary wrongly), by lane."},
			[]string{"lane"})}
	for _, l := range lanes {
		f.total.WithLabelValues(string(l))
	}
	reg.MustRegister(f.total)
	return f
}

// seen records one skipped entry; what says who read it.
func (f *foreignEntries) seen(what string, e wal.Foreign) {
	f.total.WithLabelValues(string(e.Lane)).Inc()
	k := foreignKey{string(e.Lane), e.Cluster}
	f.mu.Lock()
	l := f.logged[k]
	if l == nil {
		l = &foreignLog{}
		f.logged[k] = l
	}
	l.skipped++
	now := time.Now()
	if !l.at.IsZero() && now.Sub(l.at) < foreignLogEvery {
		f.mu.Unlock()
		return
	}
	skipped := l.skipped
	l.at, l.skipped = now, 0
	f.mu.Unlock()
	f.log.Error("WAL entry of another cluster skipped: clusters sharing a NATS server or Kafka cluster need their own wal.nats.stream_prefix or wal.kafka.topic_prefix, and every process of a cluster its cluster.name",
		"reader", what, "lane", e.Lane, "offset", e.Offset, "written_by", e.Cluster, "cluster", e.Own, "skipped", skipped)
}

// checkWALOwner refuses a cluster whose catalog holds nothing of the
// broadcaster yet (a new cluster, or a new catalog.prefix) while its WAL
// already holds entries written under its name: another cluster of the
// same name uses these streams or topics, or this cluster's catalog was
// lost. Either way its nodes would take those entries for its own —
// applying them, and skipping its own broadcasts as repeats of their ids —
// and its replicator could resume from another cluster's replicas. Only a
// new catalog pays for the read of the WAL. A catalog that cannot be read
// now skips the check (the coordinator waits for etcd anyway).
func checkWALOwner(ctx context.Context, cfg Config, client *clientv3.Client, l wal.Log, log *slog.Logger) error {
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	resp, err := client.Get(gctx, cfg.Catalog.Prefix+"bc/", clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly())
	cancel()
	if err != nil {
		log.Warn("cannot read the catalog to check that the WAL is this cluster's; not checked", "err", err)
		return nil
	}
	if len(resp.Kvs) > 0 {
		return nil
	}
	for _, lane := range wal.Lanes(cfg.WAL.Lanes, cfg.PChannelNames()) {
		var off uint64
		var found bool
		// A stream another coordinator has just created may not be
		// found yet (its replicas are still being placed): that is
		// retried for a while, anything else fails the start.
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		err := retry.Do(rctx, retry.Policy{Max: time.Second}, func(ctx context.Context) error {
			var err error
			off, found, err = firstEntryOf(ctx, l, lane, cfg.Cluster.Name)
			if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) && !strings.Contains(err.Error(), "stream not found") {
				return retry.Permanent(err)
			}
			return err
		})
		rcancel()
		if err != nil {
			return fmt.Errorf("wal: check that lane %s is this cluster's: %w", lane, err)
		}
		if found {
			where := "wal.nats.stream_prefix " + cfg.WAL.NATS.StreamPrefix
			if cfg.WAL.Kind == "kafka" {
				where = "wal.kafka.topic_prefix " + cfg.WAL.Kafka.TopicPrefix
			}
			return fmt.Errorf("%w: the WAL (%s) already holds entries written by a cluster named %q (lane %s, offset %d), but this cluster's catalog (catalog.prefix %q) is new: "+
				"another cluster of that name uses these streams or topics, or this cluster's catalog was lost; reading those entries as its own would apply them and skip its own broadcasts as repeats of their ids. "+
				"Give this cluster its own %s (or another cluster.name)",
				ErrConfig, where, cfg.Cluster.Name, lane, off, cfg.Catalog.Prefix, strings.Fields(where)[0])
		}
	}
	return nil
}

// firstEntryOf finds the first entry of lane written by cluster.
func firstEntryOf(ctx context.Context, l wal.Log, lane message.PChannel, cluster string) (uint64, bool, error) {
	end, err := l.End(ctx, lane)
	if err != nil || end == 0 {
		return 0, false, err
	}
	cur, err := l.Read(ctx, lane, 0)
	if err != nil {
		return 0, false, err
	}
	defer cur.Close()
	for {
		off, data, err := cur.Next(ctx)
		if err != nil {
			return 0, false, err
		}
		if h, err := wal.DecodeHeader(off, data); err == nil && h.Cluster == cluster {
			return off, true, nil
		}
		if off+1 >= end {
			return 0, false, nil
		}
	}
}
