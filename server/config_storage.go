package server

import (
	"os"
	"runtime/debug"
	"time"

	"github.com/walcast/walcast/internal/embedetcd"
)

// The sections of the settings of where a process keeps its data:
// standalone's embedded etcd and NATS, the disk they write to, and the
// durability a coordinator checks its backends for.

// StandaloneConfig is standalone's embedded etcd and NATS (section
// standalone).
type StandaloneConfig struct {
	// NATSAddr and EtcdAddr are where standalone's embedded NATS and
	// etcd listen for clients (127.0.0.1 only). Empty means next to
	// api.addr's port: port+2 for NATS, port+3 for etcd (a random
	// port if api.addr's port is 0). Fixed ports survive restarts, so
	// a secondary reading this cluster's NATS keeps reading it.
	NATSAddr string `yaml:"nats_addr"`
	// EtcdAddr is where the embedded etcd listens (see NATSAddr).
	EtcdAddr string `yaml:"etcd_addr"`
	// NATSMaxStore and NATSMaxMemory are the embedded JetStream's
	// limits on its file and memory storage, in bytes (not sized
	// from the disk space free at start, which a nearly full disk
	// would make too small for good). Appends beyond NATSMaxStore
	// fail with "insufficient resources".
	NATSMaxStore int64 `yaml:"nats_max_store"`
	// NATSMaxMemory is the embedded JetStream's memory limit, in bytes.
	NATSMaxMemory int64 `yaml:"nats_max_memory"`
	// EtcdCompactionRetention is how long the embedded etcd keeps
	// revision history before compacting it (it compacts every
	// retention, keeping one to two of them): its memory and database
	// grow with the writes of that long (a metadata DDL leaves about
	// 1.6 KB). It must outlast the longest catalog listing (a
	// recovery's), which pins one revision; nothing else of walcast
	// reads old revisions.
	EtcdCompactionRetention Duration `yaml:"etcd_compaction_retention"`
	// EtcdQuotaBytes bounds the embedded etcd's database file (etcd's
	// quota-backend-bytes; etcd refuses every write once it is full).
	// Once the file passes half of it, history older than a minute is
	// compacted at once instead of after etcd_compaction_retention.
	EtcdQuotaBytes int64 `yaml:"etcd_quota_bytes"`
	// EtcdMaxTxnOps bounds the operations of one transaction of the
	// embedded etcd (etcd's max-txn-ops), less one for the leader's
	// fence: what one task's TOMBSTONE and its callback's effects may
	// write. At least 64. Set it to a cluster's catalog.max_txn_ops (128,
	// etcd's default) to try what that cluster takes; the metadata
	// service bounds the grants of one database or collection by it.
	EtcdMaxTxnOps int `yaml:"etcd_max_txn_ops"`
	// WALRetention is how long standalone's WAL entries are kept at
	// least: an entry older than this that every streaming node of the
	// process has saved a state past is dropped (checked every tenth of
	// it, at most every minute). At least wal.nats.dedup_window. A
	// cluster in a replication topology keeps every entry: a secondary
	// reads them at a position this process does not know.
	WALRetention Duration `yaml:"wal_retention"`
	// MemoryLimit is the standalone process's soft memory limit, in
	// bytes (Go's runtime/debug.SetMemoryLimit): as the Go heap nears
	// it the garbage collector runs more often, instead of letting the
	// heap grow to twice its live data (GOGC=100), so that at a million
	// collections (about 1.1 GB live) the process stays within 2 GiB
	// with the embedded etcd's database file mapped beside it. It is
	// soft: a live heap above it is kept, at the cost of more garbage
	// collection. The GOMEMLIMIT environment variable, when set, takes
	// precedence; 0 sets none.
	MemoryLimit int64 `yaml:"memory_limit"`
}

// DiskConfig is the free-space guard of data_dir (section disk).
type DiskConfig struct {
	// ReserveBytes is the free space of data_dir's file system below
	// which standalone refuses catalog and WAL writes (a definite
	// error: nothing was written; the broadcast fails as not
	// created, or is retried until space is freed) and reports not
	// ready, while it keeps serving reads, so that its embedded etcd
	// never runs into a full disk (etcd cannot go on after a failed
	// write). Keep it above etcd's WAL segment (64 MiB) plus a
	// snapshot; 0 disables the check.
	ReserveBytes int64 `yaml:"reserve_bytes"`
	// WarnBytes is the free space below which every process warns
	// (log, /readyz detail, walcast_disk_level): at least
	// ReserveBytes.
	WarnBytes int64 `yaml:"warn_bytes"`
	// CheckInterval is how often the free space is sampled.
	CheckInterval Duration `yaml:"check_interval"`
}

// DurabilityConfig is the check of the backends' durability a
// coordinator makes at start (section durability).
type DurabilityConfig struct {
	// AllowUnsafe lets a coordinator start on backends that can lose
	// a DDL reported done (a NATS server that does not sync every
	// write or cannot be checked, a one-replica stream on a NATS
	// cluster, a Kafka topic whose acks=all a single broker can
	// satisfy). The coordinator prints what it found at start
	// either way.
	AllowUnsafe bool `yaml:"allow_unsafe"`
}

// DefaultMemoryLimit is standalone.memory_limit's default: 1.25 GiB.
const DefaultMemoryLimit = 1280 << 20

// minMemoryLimit is the least standalone.memory_limit: below it the
// garbage collector would run all the time.
const minMemoryLimit = 64 << 20

func defaultStandaloneConfig() StandaloneConfig {
	return StandaloneConfig{
		NATSMaxStore:            64 << 30,
		NATSMaxMemory:           256 << 20,
		EtcdCompactionRetention: Duration(time.Minute),
		EtcdQuotaBytes:          embedetcd.DefaultQuotaBytes,
		EtcdMaxTxnOps:           embedetcd.DefaultMaxTxnOps,
		WALRetention:            Duration(10 * time.Minute),
		MemoryLimit:             DefaultMemoryLimit,
	}
}

func defaultDiskConfig() DiskConfig {
	return DiskConfig{ReserveBytes: 256 << 20, WarnBytes: 1 << 30, CheckInterval: Duration(time.Second)}
}

// Validate checks the embedded servers' limits.
func (s StandaloneConfig) Validate() error {
	switch {
	case s.NATSMaxStore < 1<<20 || s.NATSMaxMemory < 0:
		return badSetting("standalone.nats_max_store", "nats_max_store (%d) must be at least 1 MiB and nats_max_memory (%d) not negative", s.NATSMaxStore, s.NATSMaxMemory)
	case s.EtcdCompactionRetention < Duration(time.Minute):
		return badSetting("standalone.etcd_compaction_retention", "%v is below 1m", s.EtcdCompactionRetention.D())
	case s.MemoryLimit != 0 && s.MemoryLimit < minMemoryLimit:
		return badSetting("standalone.memory_limit", "%d is below 64 MiB (0 sets no limit)", s.MemoryLimit)
	case s.EtcdQuotaBytes < 64<<20 || s.EtcdQuotaBytes > 8<<30:
		return badSetting("standalone.etcd_quota_bytes", "%d is outside 64 MiB..8 GiB (etcd's largest supported quota)", s.EtcdQuotaBytes)
	case s.EtcdMaxTxnOps < 64:
		return badSetting("standalone.etcd_max_txn_ops", "%d is below 64", s.EtcdMaxTxnOps)
	}
	return nil
}

// Validate checks the disk guard's thresholds.
func (d DiskConfig) Validate() error {
	switch {
	case d.ReserveBytes < 0 || d.WarnBytes < 0:
		return badSetting("disk.reserve_bytes", "reserve_bytes (%d) and warn_bytes (%d) must not be negative", d.ReserveBytes, d.WarnBytes)
	case d.CheckInterval < Duration(10*time.Millisecond):
		return badSetting("disk.check_interval", "%v is below 10ms", d.CheckInterval.D())
	}
	return nil
}

// ApplyMemoryLimit sets the process's soft memory limit to MemoryLimit
// (runtime/debug.SetMemoryLimit) unless the GOMEMLIMIT environment variable
// sets one or MemoryLimit is 0. It returns the limit in force afterwards
// (math.MaxInt64: none) and where it comes from: "standalone.memory_limit",
// "GOMEMLIMIT" or "" (none). A standalone process calls it once as it
// starts; it changes the whole process.
func (s StandaloneConfig) ApplyMemoryLimit() (limit int64, from string) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return debug.SetMemoryLimit(-1), "GOMEMLIMIT"
	}
	if s.MemoryLimit <= 0 {
		return debug.SetMemoryLimit(-1), ""
	}
	debug.SetMemoryLimit(s.MemoryLimit)
	return s.MemoryLimit, "standalone.memory_limit"
}
