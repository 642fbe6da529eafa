package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/walcast/walcast/internal/diskspace"
	"github.com/walcast/walcast/internal/embedetcd"
	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// ErrStorage is wrapped by the fatal error of a process whose embedded
// etcd or NATS server failed for good (its storage failed: a full disk, an
// I/O error). The process stops; `walcast standalone` exits with status 3.
var ErrStorage = errors.New("storage failed")

// storage watches the free space of a process's data directory and, on
// standalone, whether the embedded JetStream can store. It refuses writes
// (guard) below the reserve, reports readiness checks and exports gauges.
type storage struct {
	disk  *diskspace.Monitor
	nats  *embednats.Server // standalone's, nil otherwise
	etcd  *embedetcd.Server // standalone's, nil otherwise
	guard bool              // refuse catalog and WAL writes below the reserve
}

// startStorage samples dir's file system every disk.check_interval until
// the process closes, and registers its gauges.
func (p *Process) startStorage(cfg Config, dir string, guard bool) error {
	m, err := diskspace.New(diskspace.Config{
		Dirs:     []diskspace.Dir{{Name: "data_dir", Path: dir}},
		Reserve:  uint64(cfg.Disk.ReserveBytes),
		Warn:     uint64(cfg.Disk.WarnBytes),
		Interval: cfg.Disk.CheckInterval.D(),
		Logger:   p.log,
	})
	if err != nil {
		return err
	}
	p.storage = &storage{disk: m, guard: guard}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(ctx)
	}()
	p.onClose(func() error { cancel(); <-done; return nil })
	return p.reg.Register(storageCollector{p.storage})
}

// writeGuard refuses a write (definitely: before it is sent) while the
// data directory has less than the reserve free, or the embedded JetStream
// cannot store; nil otherwise.
func (s *storage) writeGuard() error {
	if err := s.disk.Check(); err != nil {
		return err
	}
	if s.nats != nil {
		if err := s.nats.JetStreamStatus(); err != nil {
			return fmt.Errorf("the embedded NATS cannot store: %w", err)
		}
	}
	return nil
}

// checks are the readiness checks of the storage: "disk" fails below the
// reserve on a process that refuses writes there, "wal store" while the
// embedded JetStream cannot store, "catalog store" while the embedded etcd's
// database is full (its NOSPACE alarm).
func (s *storage) checks() []Check {
	var out []Check
	for _, st := range s.disk.Status() {
		c := Check{Name: "disk", OK: true}
		switch st.Level {
		case diskspace.Unknown:
			c.Detail = fmt.Sprintf("%s: free space unknown: %v", st.Path, st.Err)
		case diskspace.Low:
			c.OK = !s.guard
			c.Detail = fmt.Sprintf("%s has %s free, below disk.reserve_bytes (%s)", st.Path, diskspace.Bytes(st.Free), diskspace.Bytes(s.disk.Reserve()))
			if s.guard {
				c.Detail += ": catalog and WAL writes are refused until space is freed; reads go on"
			}
		case diskspace.Warning:
			c.Detail = fmt.Sprintf("warning: %s has %s free, below disk.warn_bytes (%s)", st.Path, diskspace.Bytes(st.Free), diskspace.Bytes(s.disk.WarnAt()))
		default:
			c.Detail = fmt.Sprintf("%s free", diskspace.Bytes(st.Free))
		}
		out = append(out, c)
	}
	if s.nats != nil {
		c := Check{Name: "wal store", OK: true, Detail: "the embedded JetStream stores"}
		if err := s.nats.JetStreamStatus(); err != nil {
			c.OK, c.Detail = false, err.Error()+": appends are refused"
		} else if used, limit := s.nats.StoreUsage(); nearlyFull(used, limit) {
			c.Detail = fmt.Sprintf("warning: the embedded JetStream holds %s of its %s (standalone.nats_max_store): appends are refused once it is full, and standalone's WAL is kept whole",
				diskspace.Bytes(used), diskspace.Bytes(limit))
		}
		out = append(out, c)
	}
	if s.etcd != nil {
		c := Check{Name: "catalog store", OK: true, Detail: "the embedded etcd stores"}
		if s.etcd.NoSpace() {
			c.OK, c.Detail = false, "the embedded etcd's database is full (NOSPACE alarm, standalone.etcd_quota_bytes): "+
				"catalog writes are refused until its space guard has compacted and defragmented it"
		} else if size, quota := s.etcd.DatabaseSize(); nearlyFull(uint64(size), uint64(quota)) {
			c.Detail = fmt.Sprintf("warning: the embedded etcd's database is %s of its %s quota (standalone.etcd_quota_bytes)",
				diskspace.Bytes(uint64(size)), diskspace.Bytes(uint64(quota)))
		}
		out = append(out, c)
	}
	return out
}

// nearlyFullShare is the share of a store's limit past which readiness
// warns (it stays ready).
const nearlyFullShare = 0.8

func nearlyFull(used, limit uint64) bool {
	return limit > 0 && float64(used) > nearlyFullShare*float64(limit)
}

// guardedLog refuses appends while the storage guard fails, as definite
// failures: nothing was sent.
type guardedLog struct {
	wal.Log
	guard func() error
}

func (g guardedLog) Append(ctx context.Context, p message.PChannel, dedupID string, data []byte) (uint64, error) {
	if err := g.guard(); err != nil {
		return 0, fmt.Errorf("%w: refused before sending: %w", wal.ErrNotApplied, err)
	}
	return g.Log.Append(ctx, p, dedupID, data)
}

var (
	descDiskFree = prometheus.NewDesc("walcast_disk_free_bytes",
		"Bytes free (available to walcast) in the file system of the data directory.", []string{"dir"}, nil)
	descDiskTotal = prometheus.NewDesc("walcast_disk_total_bytes",
		"Size of the file system of the data directory.", []string{"dir"}, nil)
	descDiskLevel = prometheus.NewDesc("walcast_disk_level",
		"0: free space above disk.warn_bytes; 1: below it (warning); 2: below disk.reserve_bytes (standalone refuses writes); 3: unknown.", []string{"dir"}, nil)
	descDiskReserve = prometheus.NewDesc("walcast_disk_reserve_bytes", "disk.reserve_bytes.", nil, nil)
	descDiskWarn    = prometheus.NewDesc("walcast_disk_warn_bytes", "disk.warn_bytes.", nil, nil)
	descWALStore    = prometheus.NewDesc("walcast_wal_store_ok",
		"1 while the embedded JetStream stores (standalone); 0 after a failed write until it is repaired.", nil, nil)
	descWALStoreUsed = prometheus.NewDesc("walcast_wal_store_used_bytes",
		"Bytes the embedded JetStream's file store holds (standalone; its WAL streams are kept whole).", nil, nil)
	descWALStoreLimit = prometheus.NewDesc("walcast_wal_store_limit_bytes",
		"The embedded JetStream's file store limit, standalone.nats_max_store (standalone).", nil, nil)
	descCatalogSize = prometheus.NewDesc("walcast_catalog_db_size_bytes",
		"Size of the embedded etcd's database file (standalone).", nil, nil)
	descCatalogQuota = prometheus.NewDesc("walcast_catalog_db_quota_bytes",
		"The embedded etcd's database quota, standalone.etcd_quota_bytes (standalone).", nil, nil)
	descCatalogStore = prometheus.NewDesc("walcast_catalog_store_ok",
		"1 while the embedded etcd stores (standalone); 0 while its database is full (NOSPACE) until its space guard makes room.", nil, nil)
)

type storageCollector struct{ s *storage }

func (c storageCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descDiskFree
	ch <- descDiskTotal
	ch <- descDiskLevel
	ch <- descDiskReserve
	ch <- descDiskWarn
	ch <- descWALStore
	ch <- descWALStoreUsed
	ch <- descWALStoreLimit
	ch <- descCatalogStore
	ch <- descCatalogSize
	ch <- descCatalogQuota
}

func (c storageCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.s.disk.Status() {
		ch <- prometheus.MustNewConstMetric(descDiskFree, prometheus.GaugeValue, float64(st.Free), st.Name)
		ch <- prometheus.MustNewConstMetric(descDiskTotal, prometheus.GaugeValue, float64(st.Total), st.Name)
		ch <- prometheus.MustNewConstMetric(descDiskLevel, prometheus.GaugeValue, float64(st.Level), st.Name)
	}
	ch <- prometheus.MustNewConstMetric(descDiskReserve, prometheus.GaugeValue, float64(c.s.disk.Reserve()))
	ch <- prometheus.MustNewConstMetric(descDiskWarn, prometheus.GaugeValue, float64(c.s.disk.WarnAt()))
	if c.s.nats != nil {
		ch <- prometheus.MustNewConstMetric(descWALStore, prometheus.GaugeValue, okGauge(c.s.nats.JetStreamStatus() == nil))
		used, limit := c.s.nats.StoreUsage()
		ch <- prometheus.MustNewConstMetric(descWALStoreUsed, prometheus.GaugeValue, float64(used))
		ch <- prometheus.MustNewConstMetric(descWALStoreLimit, prometheus.GaugeValue, float64(limit))
	}
	if c.s.etcd != nil {
		ch <- prometheus.MustNewConstMetric(descCatalogStore, prometheus.GaugeValue, okGauge(!c.s.etcd.NoSpace()))
		size, quota := c.s.etcd.DatabaseSize()
		ch <- prometheus.MustNewConstMetric(descCatalogSize, prometheus.GaugeValue, float64(size))
		ch <- prometheus.MustNewConstMetric(descCatalogQuota, prometheus.GaugeValue, float64(quota))
	}
}

// okGauge is a 1-or-0 gauge's value.
func okGauge(ok bool) float64 {
	if ok {
		return 1
	}
	return 0
}
