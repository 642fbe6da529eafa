package server

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/walcast/walcast/wal"
)

// foreignEntries hears the WAL entries of other clusters that this
// process's readers skipped (wal.WithForeign): clusters left on one stream
// or topic prefix of a shared NATS or Kafka, or a replicator whose topology
// names the primary wrongly. Each is counted in
// walcast_wal_foreign_entries_total; the first of each lane and writer is
// logged as an error, then at most one a minute with the count since.
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

func newForeignEntries(reg prometheus.Registerer, log *slog.Logger) *foreignEntries {
	f := &foreignEntries{log: log, logged: map[foreignKey]*foreignLog{},
		total: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walcast_wal_foreign_entries_total",
			Help: "WAL entries skipped because another cluster wrote them (clusters sharing a stream or topic prefix), by lane and writing cluster."},
			[]string{"lane", "cluster"})}
	reg.MustRegister(f.total)
	return f
}

// seen records one skipped entry; what says who read it.
func (f *foreignEntries) seen(what string, e wal.Foreign) {
	f.total.WithLabelValues(string(e.Lane), e.Cluster).Inc()
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
