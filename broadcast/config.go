package broadcast

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/walcast/walcast/broadcast/internal/simrt"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/clock"
	"github.com/walcast/walcast/internal/retry"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// Clock is the engine's source of time: Now and timers. Every backoff,
// callback retry and GC check waits on its timers, and every time the
// engine records comes from its Now. Default: the wall clock.
type Clock = clock.Clock

// Config configures a Broadcaster. Catalog, WAL, Types and ControlChannel are
// required; every other field has the default SPEC.md gives it.
type Config struct {
	// Catalog holds the task records. Wrap it in catalog.NewGroup (the etcd
	// catalog does so itself) to let concurrent broadcasts share commits; a
	// catalog.AsyncCommitter (a Group is one) is handed writes without a
	// goroutine waiting for each.
	Catalog catalog.Catalog
	// WAL receives the copies.
	WAL *wal.WAL
	// Types are the message types the broadcaster accepts.
	Types *message.Registry
	// Callbacks are the ack callbacks per type. Register every callback
	// before New: recovery may run callbacks of recovered tasks at once, and
	// a type without a callback completes without one; a registration after
	// New is refused.
	Callbacks *Callbacks
	// ControlChannel is the cluster's control channel (R2.2, R5.4).
	ControlChannel message.VChannel
	// PChannels, if set, are the cluster's pchannels: a broadcast to a
	// vchannel on any other pchannel is refused as invalid, since its copy
	// could never be appended.
	PChannels []message.PChannel
	// ClusterName names this cluster in replication topologies (SPEC §8).
	// Default "walcast".
	ClusterName string
	// Prefix is prepended to every catalog key the broadcaster writes.
	// Default "walcast/".
	Prefix string

	// ConcurrencyRatio × CPUs bounds concurrent WAL appends (R4.3).
	// Default 4.
	ConcurrencyRatio float64
	// Backoff paces append, persist and callback retries: Initial 10 ms,
	// Multiplier 2, Max 10 s by default (R4.3, R5.2).
	Backoff Backoff
	// Tombstone retention (R6.1).
	Tombstone TombstoneConfig
	// MaxKeyLength bounds new client idempotency keys, in bytes. Default 256.
	// Lowering it never breaks retries of keys already accepted.
	MaxKeyLength int
	// MaxMessageBytes bounds an encoded broadcast message. Default 256 KiB;
	// it must leave room in one catalog transaction and one WAL entry.
	MaxMessageBytes int
	// Txn bounds broadcast transactions (R13.4).
	Txn TxnLimits

	// CheckRole, if set, is called first on every request; an error refuses
	// it (the replication role check returns ErrNotPrimary there, R8.1).
	CheckRole func(ctx context.Context) error
	// Admit, if set, is called for new work only, after an idempotent
	// request's key was found new and before its locks are taken; an error
	// refuses the broadcast. Retries of accepted requests skip it, so a full
	// quota never rejects a retry (R7.5).
	Admit func(ctx context.Context) error
	// Logger receives structured logs; idempotency keys appear only as
	// fingerprints. Default slog.Default().
	Logger *slog.Logger
	// Clock tells the time and times retries and GC checks. Default the wall
	// clock.
	Clock Clock
	// CallbackConcurrency bounds the callbacks (and ack-once callbacks) that
	// run at once. Default 1024.
	CallbackConcurrency int
	// Observer receives events for metrics. Default none.
	Observer Observer
	// TracerProvider creates the engine's spans (R9.6; span names in
	// tracing). Default otel.GetTracerProvider(), which does
	// nothing until the process installs a provider.
	TracerProvider trace.TracerProvider

	// rt runs the driver's goroutines for the simulator, with salt as the
	// WAL entries' salt (simrt.WithRuntime); nil in production.
	rt   simrt.Runtime
	salt string
}

// Backoff is an exponential retry schedule.
type Backoff struct {
	Initial    time.Duration
	Multiplier float64
	Max        time.Duration
}

// WithDefaults fills zero fields with the defaults: Initial 10 ms,
// Multiplier 2, Max 10 s.
func (b Backoff) WithDefaults() Backoff {
	if b.Initial == 0 {
		b.Initial = 10 * time.Millisecond
	}
	if b.Multiplier == 0 {
		b.Multiplier = 2
	}
	if b.Max == 0 {
		b.Max = 10 * time.Second
	}
	return b
}

// New returns a fresh schedule (no jitter) that retries forever.
func (b Backoff) New() *backoff.ExponentialBackOff { return b.Policy().Schedule() }

// Policy returns the schedule as the module's retry helper takes it.
func (b Backoff) Policy() retry.Policy {
	return retry.Policy{Initial: b.Initial, Multiplier: b.Multiplier, Max: b.Max}.WithDefaults()
}

// TombstoneConfig says how long finished tasks are kept for deduplication.
// A tombstone is deleted when it is older than its retention class's
// MaxLifetime or beyond the class's newest MaxCount, whichever comes first,
// checked every CheckInterval and after each new tombstone (R6.1).
//
// MaxLifetime and MaxCount are the default class's, which every type not
// named by one of Classes belongs to. A burst of one class never evicts
// another class's tombstones (R6.4), so an application gives the types
// whose windows matter most (an import) a class of their own.
type TombstoneConfig struct {
	MaxLifetime   time.Duration // default 24h
	MaxCount      int           // default 8192
	CheckInterval time.Duration // default 5m
	// Classes are further retention classes.
	Classes []RetentionClass
}

// MaxRetentionClasses bounds TombstoneConfig.Classes: a tombstone stores
// its class in 15 bits, and every class is a queue GC walks.
const MaxRetentionClasses = 1024

// RetentionClass is a retention class of its own for some message types:
// their tombstones are kept until older than MaxLifetime or beyond the
// class's newest MaxCount. The memory tombstones take is bounded by the sum
// of every class's MaxCount.
type RetentionClass struct {
	// Name names the class in metrics and key lookups; "default" is the
	// default class's.
	Name        string
	Types       []message.Type
	MaxCount    int           // default: the default class's
	MaxLifetime time.Duration // default: the default class's
}

// TxnLimits bound broadcast transactions (R13.4); exceeding one is refused
// with ErrInvalidArgument (a member too large, too many targets) or
// ErrTxnFull (too many members).
type TxnLimits struct {
	// MaxMembers bounds a transaction's members, Begin and end included;
	// the last is kept for its Commit or Rollback. Default 64 (or the
	// catalog's transaction ops less two, if fewer); at most that, since GC
	// deletes a finished transaction in one catalog transaction.
	MaxMembers int
	// MaxMemberBytes bounds one member's payload. Default 256 KiB.
	MaxMemberBytes int
	// MaxVChannels bounds a transaction's targets, the control channel
	// included. Default 128.
	MaxVChannels int
}

// DefaultClass is the name of the default retention class.
const DefaultClass = "default"

// withDefaults returns cfg with every unset field at its default.
func (cfg Config) withDefaults() Config {
	if cfg.ClusterName == "" {
		cfg.ClusterName = "walcast"
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "walcast/"
	}
	if cfg.ConcurrencyRatio == 0 {
		cfg.ConcurrencyRatio = 4
	}
	cfg.Backoff = cfg.Backoff.WithDefaults()
	if cfg.Tombstone.MaxLifetime == 0 {
		cfg.Tombstone.MaxLifetime = 24 * time.Hour
	}
	if cfg.Tombstone.MaxCount == 0 {
		cfg.Tombstone.MaxCount = 8192
	}
	if cfg.Tombstone.CheckInterval == 0 {
		cfg.Tombstone.CheckInterval = 5 * time.Minute
	}
	if cfg.MaxKeyLength == 0 {
		cfg.MaxKeyLength = message.DefaultMaxKeyLength
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = 256 << 10
	}
	if cfg.Txn.MaxMembers == 0 {
		cfg.Txn.MaxMembers = 64
		if cfg.Catalog != nil {
			cfg.Txn.MaxMembers = max(2, min(64, cfg.Catalog.Limits().MaxOps-2))
		}
	}
	if cfg.Txn.MaxMemberBytes == 0 {
		cfg.Txn.MaxMemberBytes = 256 << 10
	}
	if cfg.Txn.MaxVChannels == 0 {
		cfg.Txn.MaxVChannels = 128
	}
	if cfg.Callbacks == nil {
		cfg.Callbacks = NewCallbacks()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.CallbackConcurrency == 0 {
		cfg.CallbackConcurrency = 1024
	}
	for i := range cfg.Tombstone.Classes {
		cl := &cfg.Tombstone.Classes[i]
		if cl.MaxCount == 0 {
			cl.MaxCount = cfg.Tombstone.MaxCount
		}
		if cl.MaxLifetime == 0 {
			cl.MaxLifetime = cfg.Tombstone.MaxLifetime
		}
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	return cfg
}

// entryOverhead is room left in a WAL entry and a catalog transaction beyond
// the message itself: vchannel lists, checkpoints, record fields.
const entryOverhead = 64 << 10

func (cfg Config) validate() error {
	bad := func(setting, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, setting, fmt.Sprintf(format, args...))
	}
	switch {
	case cfg.Catalog == nil:
		return bad("Catalog", "required")
	case cfg.WAL == nil:
		return bad("WAL", "required")
	case cfg.Types == nil:
		return bad("Types", "required")
	}
	if err := cfg.ControlChannel.Validate(); err != nil {
		return bad("ControlChannel", "%v", err)
	}
	if cfg.ConcurrencyRatio < 0 {
		return bad("ConcurrencyRatio", "%v is negative", cfg.ConcurrencyRatio)
	}
	if cfg.Backoff.Initial < 0 || cfg.Backoff.Multiplier < 1 || cfg.Backoff.Max < cfg.Backoff.Initial {
		return bad("Backoff", "need 0 < Initial <= Max and Multiplier >= 1, got %+v", cfg.Backoff)
	}
	if cfg.Tombstone.MaxLifetime < 0 || cfg.Tombstone.MaxCount < 0 || cfg.Tombstone.CheckInterval < 0 {
		return bad("Tombstone", "negative values in %+v", cfg.Tombstone)
	}
	if n := len(cfg.Tombstone.Classes); n > MaxRetentionClasses {
		return bad("Tombstone.Classes", "%d classes, more than %d", n, MaxRetentionClasses)
	}
	names := map[string]bool{DefaultClass: true}
	typed := map[message.Type]string{}
	for _, cl := range cfg.Tombstone.Classes {
		switch {
		case cl.Name == "" || names[cl.Name]:
			return bad("Tombstone.Classes", "class name %q is empty or used twice", cl.Name)
		case cl.MaxCount < 0 || cl.MaxLifetime < 0:
			return bad("Tombstone.Classes", "class %s has negative limits", cl.Name)
		case len(cl.Types) == 0:
			return bad("Tombstone.Classes", "class %s names no message type", cl.Name)
		}
		names[cl.Name] = true
		for _, t := range cl.Types {
			if other, dup := typed[t]; dup {
				return bad("Tombstone.Classes", "type %s is in classes %s and %s", t, other, cl.Name)
			}
			typed[t] = cl.Name
		}
	}
	if cfg.CallbackConcurrency < 0 {
		return bad("CallbackConcurrency", "%d is negative", cfg.CallbackConcurrency)
	}
	if cfg.MaxKeyLength < 0 {
		return bad("MaxKeyLength", "%d is negative", cfg.MaxKeyLength)
	}
	if cfg.MaxMessageBytes < 1024 {
		return bad("MaxMessageBytes", "%d is below 1 KiB", cfg.MaxMessageBytes)
	}
	if lim := cfg.Catalog.Limits(); cfg.Txn.MaxMembers < 2 || cfg.Txn.MaxMembers > lim.MaxOps-2 {
		return bad("Txn.MaxMembers", "%d: need 2 to %d (the catalog's transaction ops less two)", cfg.Txn.MaxMembers, lim.MaxOps-2)
	}
	if cfg.Txn.MaxMemberBytes < 0 || cfg.Txn.MaxVChannels < 2 {
		return bad("Txn", "MaxMemberBytes %d must not be negative, MaxVChannels %d at least 2", cfg.Txn.MaxMemberBytes, cfg.Txn.MaxVChannels)
	}
	if lim := cfg.Catalog.Limits(); cfg.MaxMessageBytes+entryOverhead > lim.MaxBytes {
		return bad("MaxMessageBytes", "%d plus %d bytes of record overhead exceeds the catalog's transaction limit of %d bytes",
			cfg.MaxMessageBytes, entryOverhead, lim.MaxBytes)
	}
	if max := cfg.WAL.Log().MaxEntryBytes(); cfg.MaxMessageBytes+entryOverhead > max {
		return bad("MaxMessageBytes", "%d plus %d bytes of entry overhead exceeds the WAL's entry limit of %d bytes",
			cfg.MaxMessageBytes, entryOverhead, max)
	}
	return nil
}

func (cfg Config) appendConcurrency() int {
	n := int(cfg.ConcurrencyRatio * float64(runtime.NumCPU()))
	return max(n, 1)
}
