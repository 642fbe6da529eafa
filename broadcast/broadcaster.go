package broadcast

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/tracing"
	"github.com/walcast/walcast/wal"
)

// Broadcaster is the broadcast engine. Create it with New, which recovers
// every task from the catalog; stop it with Close. It is safe for concurrent
// use.
type Broadcaster struct {
	cfg    Config
	cat    catalog.Catalog
	log    *slog.Logger
	obs    Observer
	tracer trace.Tracer
	spans  *spans
	pchans map[message.PChannel]bool // the cluster's pchannels (Config.PChannels); nil: the WAL's
	// walPChans caches the pchannels the WAL said it has, when
	// Config.PChannels is unset (checkPChannels).
	walPChans sync.Map
	// salt makes this broadcaster's WAL entries distinct from a
	// predecessor's: after a crash, recovered AckSyncUp tasks must reach
	// their consumers again (who acked the lost instance), so their
	// re-appends must not be deduplicated into the old entries.
	salt    string
	d       *driver
	handles atomic.Uint64

	role atomic.Int32
	topo atomic.Pointer[ReplicateConfig]

	life struct {
		sync.Mutex
		closing bool
		fenced  error
	}
	// deposed is closed when the broadcaster stops: closed or fenced.
	deposed   chan struct{}
	closeOnce sync.Once

	duplicates atomic.Int64
}

// Result is what Broadcast returns.
type Result struct {
	BroadcastID uint64
	// Appends says where each copy landed, control channel included, in
	// the message's target order (Get, All, or Map for a map). It is
	// rebuilt from the original's checkpoints for a duplicate (R7.4). It may
	// be the slice the callback got as Event.Results: read it, do not
	// modify it.
	Appends wal.Landings
	// Deduplicated reports that the call was answered by an earlier
	// broadcast with the same idempotency scope (R7.4): nothing new was
	// persisted or appended, and the rest of the Result is the original's.
	Deduplicated bool
	// Duplicated is that original's message when Deduplicated is set (nil
	// otherwise; where only the id and outcome of the original are known,
	// Deduplicated is set and it may be nil).
	Duplicated *message.Message
	// Outcome is what the (original's) callback recorded.
	Outcome Outcome
	// Window describes the idempotency window of a keyed broadcast (R7.7).
	Window *Window
	// Extras are what consumers returned with their acks (R13.12), by
	// vchannel; nil if none did.
	Extras map[message.VChannel][]byte
}

// New recovers a broadcaster from the catalog (R4.8): pending tasks re-take
// their resource keys and resume appending, replicated tasks wait for acks,
// tombstones re-enter GC with their persisted completion time, and the
// idempotency index is rebuilt for every state. A conflict between the keys
// of two recovered pending tasks is reported as ErrCorruptCatalog.
func New(ctx context.Context, cfg Config) (*Broadcaster, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &Broadcaster{
		cfg: cfg, cat: cfg.Catalog, log: cfg.Logger, obs: cfg.Observer,
		tracer:  cfg.TracerProvider.Tracer(tracing.TracerName),
		deposed: make(chan struct{}),
	}
	b.spans = newSpans(b.tracer)
	if len(cfg.PChannels) > 0 {
		b.pchans = make(map[message.PChannel]bool, len(cfg.PChannels))
		for _, p := range cfg.PChannels {
			b.pchans[p] = true
		}
		if !b.pchans[cfg.ControlChannel.PChannel()] {
			return nil, fmt.Errorf("%w: ControlChannel: pchannel %s is not in PChannels", ErrInvalidConfig, cfg.ControlChannel.PChannel())
		}
	}
	var salt [8]byte
	_, _ = rand.Read(salt[:])
	b.salt = hex.EncodeToString(salt[:])
	if cfg.salt != "" {
		b.salt = cfg.salt
	}
	if _, ok := cfg.Types.Lookup(AlterReplicateConfig); !ok {
		if err := cfg.Types.Register(message.TypeInfo{Type: AlterReplicateConfig}); err != nil {
			return nil, err
		}
	}
	cfg.Callbacks.use()
	snap, err := b.readSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	core, err := engine.New(b.coreConfig(), snap, cfg.Clock.Now())
	if err != nil {
		return nil, err
	}
	b.d = newDriver(b, core)
	b.d.start()
	return b, nil
}

// coreConfig is the decision core's configuration.
func (b *Broadcaster) coreConfig() engine.Config {
	cfg := b.cfg
	classes := []engine.Class{{Name: DefaultClass, MaxCount: cfg.Tombstone.MaxCount, MaxLifetime: cfg.Tombstone.MaxLifetime}}
	classOf := map[message.Type]int{}
	for i, cl := range cfg.Tombstone.Classes {
		classes = append(classes, engine.Class{Name: cl.Name, MaxCount: cl.MaxCount, MaxLifetime: cl.MaxLifetime})
		for _, t := range cl.Types {
			classOf[t] = i + 1
		}
	}
	return engine.Config{
		ControlChannel: cfg.ControlChannel, ControlTargets: b.controlTargets(),
		ClusterName: cfg.ClusterName, Prefix: cfg.Prefix, Types: cfg.Types,
		HasAckOnce: func(t message.Type) bool { return cfg.Callbacks.ackOnce(t) != nil },
		Lane: func(p message.PChannel) message.PChannel {
			l, _ := cfg.WAL.Lane(p)
			return l
		},
		MaxEntryBytes: cfg.WAL.Log().MaxEntryBytes(), Limits: cfg.Catalog.Limits(),
		AppendConcurrency: cfg.appendConcurrency(), Backoff: cfg.Backoff.Policy(),
		Classes: classes, ClassOf: func(t message.Type) int { return classOf[t] },
		CheckInterval: cfg.Tombstone.CheckInterval, MaxKeyLength: cfg.MaxKeyLength, MaxGroupMembers: cfg.Txn.MaxMembers,
		Observer: coreObserver{b}, Logger: cfg.Logger,
	}
}

// readSnapshot reads what recovery needs from the catalog.
func (b *Broadcaster) readSnapshot(ctx context.Context) (engine.Snapshot, error) {
	var s engine.Snapshot
	prefix := b.cfg.Prefix
	err := b.cat.List(ctx, engine.TasksPrefix(prefix), func(key string, raw []byte) error {
		id, ok := engine.ParseTaskKey(prefix, key)
		if !ok {
			return fmt.Errorf("%w: unexpected key %q", ErrCorruptCatalog, key)
		}
		s.Tasks = append(s.Tasks, engine.RawRecord{ID: id, Raw: slices.Clone(raw)})
		return nil
	})
	if err != nil {
		return s, err
	}
	v, err := b.cat.Get(ctx, engine.IDsKey(prefix))
	switch {
	case errors.Is(err, catalog.ErrNotFound):
	case err != nil:
		return s, fmt.Errorf("read broadcast id block: %w", err)
	case len(v) != 8:
		return s, fmt.Errorf("%w: broadcast id block is %d bytes", ErrCorruptCatalog, len(v))
	default:
		s.IDFloor = binary.BigEndian.Uint64(v)
	}
	raw, err := b.cat.Get(ctx, engine.ReplicateKey(prefix))
	switch {
	case errors.Is(err, catalog.ErrNotFound):
	case err != nil:
		return s, fmt.Errorf("read replication config: %w", err)
	default:
		if err := json.Unmarshal(raw, &s.Topology); err != nil {
			return s, fmt.Errorf("%w: replication config: %w", ErrCorruptCatalog, err)
		}
	}
	s.Promotes = map[uint64][]byte{}
	err = b.cat.List(ctx, engine.PromotePrefix(prefix), func(key string, raw []byte) error {
		id, err := strconv.ParseUint(strings.TrimPrefix(key, engine.PromotePrefix(prefix)), 10, 64)
		if err != nil {
			return fmt.Errorf("%w: unexpected key %q", ErrCorruptCatalog, key)
		}
		s.Promotes[id] = slices.Clone(raw)
		return nil
	})
	if err != nil {
		return s, err
	}
	v, err = b.cat.Get(ctx, engine.CollectedKey(prefix))
	switch {
	case errors.Is(err, catalog.ErrNotFound):
		err = nil
	case err == nil:
		s.Collected = slices.Clone(v)
	default:
		err = fmt.Errorf("read collected replicated ids: %w", err)
	}
	return s, err
}

// closedErr returns ErrClosed (or the fencing error) once the broadcaster
// stops, nil before.
func (b *Broadcaster) closedErr() error {
	b.life.Lock()
	defer b.life.Unlock()
	if b.life.fenced != nil {
		return fmt.Errorf("%w: %w", ErrClosed, b.life.fenced)
	}
	if b.life.closing {
		return ErrClosed
	}
	return nil
}

// fenced stops the broadcaster after the catalog reported a newer term: a
// deposed coordinator must not write anything more (R9.2). The core has
// stopped itself already.
func (b *Broadcaster) fenced(err error) {
	b.life.Lock()
	if b.life.fenced == nil {
		b.life.fenced = err
		b.life.closing = true
	}
	b.life.Unlock()
	b.closeOnce.Do(func() { close(b.deposed) })
	b.d.stop(fmt.Errorf("%w: %w", ErrClosed, err))
}

// Close stops accepting work, stops every goroutine and waits for them.
// Tasks already persisted complete after the next recovery (R4.7). Close is
// idempotent.
func (b *Broadcaster) Close() error {
	b.life.Lock()
	b.life.closing = true
	b.life.Unlock()
	b.closeOnce.Do(func() { close(b.deposed) })
	b.d.stop(nil)
	if b.d.rt != nil {
		b.d.rt.Park(func() bool { return closed(b.d.done) })
	}
	<-b.d.done
	b.spans.closeAll()
	return nil
}

// setRole publishes the role the core applied.
func (b *Broadcaster) setRole(r Role, cfg ReplicateConfig) {
	b.role.Store(int32(r))
	b.topo.Store(&cfg)
}

// Role returns the cluster's current role.
func (b *Broadcaster) Role() Role { return Role(b.role.Load()) }

// ReplicateConfig returns the current topology.
func (b *Broadcaster) ReplicateConfig() ReplicateConfig { return *b.topo.Load() }

// Stats are counters of one broadcaster's life, for tests and benchmarks.
type Stats struct {
	// Broadcasts counts tasks created by Broadcast (not duplicates), since
	// New.
	Broadcasts int
	// Duplicates counts requests resolved to an earlier broadcast.
	Duplicates int
	// CatalogCommits counts commits the broadcaster made (before any group
	// commit below it coalesced them).
	CatalogCommits int
	// AppendRounds counts WAL appends; AppendRetries the failed ones.
	AppendRounds, AppendRetries int
	// CallbackFailures counts failed callback attempts, including attempts
	// whose callback succeeded but whose TOMBSTONE commit failed.
	CallbackFailures int
	// Evicted counts tombstones deleted by GC; EarlyEvicted those deleted by
	// MaxCount before MaxLifetime (R6.3).
	Evicted, EarlyEvicted int
	// Recovered counts tasks loaded by New.
	Recovered int
	// Live and Tombstones are the current task counts.
	Live, Tombstones int
	// StaleAcks counts re-acks of collected replicated broadcasts ignored
	// (they would have re-applied an old effect).
	StaleAcks int
}

// Stats returns a snapshot of the counters.
func (b *Broadcaster) Stats() Stats {
	var s Stats
	b.d.inspect(func(c engine.View) {
		cs := c.Stats()
		s = Stats{Broadcasts: cs.Broadcasts, CatalogCommits: cs.CatalogCommits, AppendRounds: cs.AppendRounds,
			AppendRetries: cs.AppendRetries, CallbackFailures: cs.CallbackFailures, Evicted: cs.Evicted,
			EarlyEvicted: cs.EarlyEvicted, Recovered: cs.Recovered, StaleAcks: cs.StaleAcks}
		s.Live, s.Tombstones = c.Counts()
	})
	s.Duplicates = int(b.duplicates.Load())
	return s
}

// EarlyEvictions returns, per retention class, how many tombstones MaxCount
// evicted before their MaxLifetime since New (R6.4).
func (b *Broadcaster) EarlyEvictions() map[string]int {
	var m map[string]int
	b.d.inspect(func(c engine.View) { m = c.EarlyEvictions() })
	return m
}

// Locks returns the issuance lock table (R3.7).
func (b *Broadcaster) Locks() []resource.KeyState {
	var ks []resource.KeyState
	b.d.inspect(func(c engine.View) { ks = c.Locks() })
	return ks
}

// ControlChannel returns the cluster's control channel.
func (b *Broadcaster) ControlChannel() message.VChannel { return b.cfg.ControlChannel }

// Done is closed when the broadcaster stops: closed, or deposed because the
// catalog reported a newer coordinator term.
func (b *Broadcaster) Done() <-chan struct{} { return b.deposed }

// Catalog returns the catalog the broadcaster writes (fenced to its term),
// for applications that read what their callbacks wrote.
func (b *Broadcaster) Catalog() catalog.Catalog { return b.cat }

// Types returns the message types the broadcaster accepts.
func (b *Broadcaster) Types() *message.Registry { return b.cfg.Types }

// Prefix returns the catalog prefix the broadcaster writes under.
func (b *Broadcaster) Prefix() string { return b.cfg.Prefix }

// ClusterName returns this cluster's name in replication topologies.
func (b *Broadcaster) ClusterName() string { return b.cfg.ClusterName }

// controlTargets is the control channel of every pchannel.
func (b *Broadcaster) controlTargets() []message.VChannel {
	if b.pchans == nil {
		return []message.VChannel{b.cfg.ControlChannel}
	}
	out := make([]message.VChannel, 0, len(b.pchans))
	for p := range b.pchans {
		out = append(out, p.Control())
	}
	slices.Sort(out)
	return out
}

var _ = time.Now
