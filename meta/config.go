package meta

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/walcast/walcast/message"
)

// Limits of the service.
const (
	// MaxNameLength bounds database, collection, index, field and user
	// names, in bytes.
	MaxNameLength = 128
	// MaxShards bounds the shards (vchannels) of a collection.
	MaxShards = 256
	// MaxFields bounds the fields of a collection's schema.
	MaxFields = 64
	// MaxIndexes bounds the indexes of a collection, so that dropping it
	// deletes them all in the transaction of its TOMBSTONE.
	MaxIndexes = 32
	// MaxImportFiles bounds the files of one import job.
	MaxImportFiles = 64
	// MaxFileLength bounds one import file name, in bytes.
	MaxFileLength = 1024
	// MaxGrantsPerObject bounds the grants on one database or collection,
	// so that dropping (or renaming) it rewrites them all in the
	// transaction of its TOMBSTONE. A catalog with smaller transactions
	// allows fewer (45 under etcd's default 128 ops; see grantsPerObject).
	MaxGrantsPerObject = 64
	// MaxRowBytes bounds one row (line) of an import file.
	MaxRowBytes = 1 << 20
	// MaxReasonLength bounds the reason of a failed import job, in bytes.
	MaxReasonLength = 1024
	// MaxSplitInto bounds how many shards SplitShard splits one into (at
	// least 2).
	MaxSplitInto = 16
	// MaxFencedShards bounds the splits a collection records, so that its
	// record stays small.
	MaxFencedShards = 64
	// MaxListPage bounds one page of ListDatabases, ListCollections,
	// ListImportJobs and ListUsers: a request without a limit, or with a larger one,
	// gets pages of this many.
	MaxListPage = 1000
)

// Config configures the metadata service. PChannels and ImportRoot are
// required; the other fields have defaults (those of the process's meta.*
// settings, for the fields that are settings).
type Config struct {
	// PChannels are the cluster's pchannels, over which collections' shards
	// are spread: shard i of collection id is on PChannels[(id+i) mod P].
	PChannels []message.PChannel
	// CollectionShards is the shard count of a collection created without
	// one (meta.collection_shards). Default 2.
	CollectionShards int
	// MaxImportJobNum bounds the unfinished (pending or running) import
	// jobs; a new import beyond it is refused with ErrTooManyImportJobs
	// (meta.max_import_job_num). Default 1024.
	MaxImportJobNum int
	// ImportJobRetention is how long a finished import job is kept
	// (meta.import_job_retention). It must outlive the idempotency window,
	// so that a retry finds its job. Default 48h.
	ImportJobRetention time.Duration
	// ImportRoot is the directory import files are read from
	// (meta.import_root): an import's paths are relative to it, and none
	// may lead out of it. The leader's importer creates it when it first
	// runs a job. Required; a process's is its setting or
	// "<data dir>/imports" (server.Config.ImportRoot).
	ImportRoot string
	// ImporterInterval is how often the importer looks for jobs to run
	// and deletes expired ones. Default 1s.
	ImporterInterval time.Duration
	// Logger receives structured logs; idempotency keys appear only as
	// fingerprints. Default slog.Default().
	Logger *slog.Logger
	// Clock returns the current time. Default time.Now.
	Clock func() time.Time
	// SerialPrivileges makes every user and grant change hold the one
	// exclusive Privilege key, as the reference system does, instead of
	// the privilege gate and the keys of its user and object (see
	// privilegeKeys): for a comparison (walcast bench --api, B14), not a
	// setting.
	SerialPrivileges bool
}

func (c Config) withDefaults() Config {
	if c.CollectionShards == 0 {
		c.CollectionShards = 2
	}
	if c.MaxImportJobNum == 0 {
		c.MaxImportJobNum = 1024
	}
	if c.ImportJobRetention == 0 {
		c.ImportJobRetention = 48 * time.Hour
	}
	if c.ImporterInterval == 0 {
		c.ImporterInterval = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	return c
}

func (c Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: meta config: %s: %s", ErrInvalidArgument, field, fmt.Sprintf(format, args...))
	}
	if len(c.PChannels) == 0 {
		return bad("PChannels", "at least one pchannel is required")
	}
	if c.ImportRoot == "" {
		return bad("ImportRoot", "the import root directory is required (meta.import_root)")
	}
	seen := make(map[message.PChannel]bool, len(c.PChannels))
	for _, p := range c.PChannels {
		if err := p.Validate(); err != nil {
			return bad("PChannels", "%v", err)
		}
		if seen[p] {
			return bad("PChannels", "%s named twice", p)
		}
		seen[p] = true
	}
	switch {
	case c.CollectionShards < 1 || c.CollectionShards > MaxShards:
		return bad("CollectionShards", "%d is outside 1..%d", c.CollectionShards, MaxShards)
	case c.MaxImportJobNum < 1:
		return bad("MaxImportJobNum", "%d is below 1", c.MaxImportJobNum)
	case c.ImportJobRetention < 0:
		return bad("ImportJobRetention", "%v is negative", c.ImportJobRetention)
	case c.ImporterInterval < 0:
		return bad("ImporterInterval", "%v is negative", c.ImporterInterval)
	}
	return nil
}
