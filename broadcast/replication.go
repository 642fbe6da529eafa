package broadcast

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// Role is a cluster's part in replication (SPEC §8).
type Role int32

const (
	// Primary clusters accept DDL/DCL.
	Primary Role = 1
	// Secondary clusters follow a primary's WAL and refuse DDL/DCL.
	Secondary Role = 2
)

// String returns the role's name: "primary", "secondary" ("unknown"
// otherwise).
func (r Role) String() string {
	switch r {
	case Primary:
		return "primary"
	case Secondary:
		return "secondary"
	}
	return "unknown"
}

// Role errors.
var (
	// ErrNotPrimary refuses DDL/DCL on a secondary (R8.1).
	ErrNotPrimary = errors.New("cluster is not primary, cannot do any DDL/DCL")
	// ErrNotSecondary refuses a force promote on a primary (R8.3).
	ErrNotSecondary = errors.New("cluster is not secondary, cannot perform force promote")
)

// AlterReplicateConfig is the built-in message type that changes the
// replication topology. Every broadcaster registers it, with a callback that
// stores the topology (effect-once) and, after the TOMBSTONE, applies the
// role it gives this cluster. It holds the exclusive Cluster key and goes to
// the control channel of every pchannel.
var AlterReplicateConfig = message.Type{Name: "AlterReplicateConfig", Version: 1}

// ReplicateConfig is the replication topology. Every cluster in it has the
// same view; its role follows from its name: the named primary is primary,
// every other cluster is secondary. A primary broadcasts its topology
// changes, so its secondaries (which replicate them) follow.
type ReplicateConfig struct {
	// Primary names the primary cluster; "" means no replication: every
	// cluster is primary.
	Primary string `json:"primary"`
	// Secondaries are the clusters following the primary.
	Secondaries []SecondaryConfig `json:"secondaries,omitempty"`
	// ForcePromote marks the message of a force promote (never set in a
	// stored topology).
	ForcePromote bool `json:"force_promote,omitempty"`
}

// SecondaryConfig is one secondary cluster.
type SecondaryConfig struct {
	Name string `json:"name"`
	// Source is where the secondary's replicator reads the primary's WAL
	// (a NATS URL, for instance).
	Source string `json:"source,omitempty"`
}

// RoleOf returns the role the topology gives the cluster named name.
func (c ReplicateConfig) RoleOf(name string) Role {
	if c.Primary == "" || c.Primary == name {
		return Primary
	}
	return Secondary
}

// Secondary returns the settings of the secondary named name.
func (c ReplicateConfig) Secondary(name string) (SecondaryConfig, bool) {
	for _, s := range c.Secondaries {
		if s.Name == name {
			return s, true
		}
	}
	return SecondaryConfig{}, false
}

// ReservedPropertyPrefix starts the message properties walcast sets itself.
// A broadcast whose caller sets one is refused as invalid (Check), so no
// caller can, say, keep a DDL from replicating.
const ReservedPropertyPrefix = "walcast."

const (
	// unreplicableProperty marks a message the replicator must not copy.
	unreplicableProperty = ReservedPropertyPrefix + "unreplicable"
	// forcePromoteMark is unreplicableProperty's value on a force promote.
	forcePromoteMark = "force-promote"
	// requestDigestProperty carries the hex of the caller's request digest
	// (Idempotent.Digest), so that it replicates with the message (R7.6,
	// R8.4).
	requestDigestProperty = ReservedPropertyPrefix + "request-digest"
)

// Unreplicable reports whether m must stay in its cluster: its type says so,
// or it is a force promote.
func Unreplicable(types *message.Registry, m *message.Message) bool {
	if m.Properties[unreplicableProperty] != "" {
		return true
	}
	info, ok := types.Lookup(m.Type)
	return ok && info.Unreplicable
}

// replication is the broadcaster's replication state.
type replication struct {
	role atomic.Int32
	// fenced is set once a force promote has every pchannel's ack: no
	// replicated copy may create a task any more.
	fenced atomic.Bool
	cfg    atomic.Pointer[ReplicateConfig]
}

func (b *Broadcaster) replicateKey() string { return b.cfg.Prefix + "replicate" }

func (b *Broadcaster) promoteKey(id uint64) string {
	return b.cfg.Prefix + "promote/" + strconv.FormatUint(id, 10)
}

// loadReplication reads the stored topology; none means primary.
func (b *Broadcaster) loadReplication(ctx context.Context) error {
	raw, err := b.cat.Get(ctx, b.replicateKey())
	cfg := &ReplicateConfig{}
	switch {
	case errors.Is(err, catalog.ErrNotFound):
	case err != nil:
		return fmt.Errorf("read replication config: %w", err)
	default:
		if err := json.Unmarshal(raw, cfg); err != nil {
			return fmt.Errorf("%w: replication config: %w", ErrCorruptCatalog, err)
		}
	}
	b.setReplication(cfg)
	return nil
}

func (b *Broadcaster) setReplication(cfg *ReplicateConfig) {
	b.repl.cfg.Store(cfg)
	r := cfg.RoleOf(b.cfg.ClusterName)
	if old := Role(b.repl.role.Swap(int32(r))); old != r && old != 0 {
		b.log.Warn("cluster role changed", "from", old.String(), "to", r.String(), "primary", cfg.Primary)
	}
	if r == Primary {
		b.repl.fenced.Store(false)
	}
}

// Role returns the cluster's current role.
func (b *Broadcaster) Role() Role { return Role(b.repl.role.Load()) }

// ReplicateConfig returns the current topology.
func (b *Broadcaster) ReplicateConfig() ReplicateConfig { return *b.repl.cfg.Load() }

// Promoting reports whether a force promote is under way (a replicator must
// not run then).
func (b *Broadcaster) Promoting() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, t := range b.tasks {
		if t.promote {
			return true
		}
	}
	return false
}

// registerReplication adds the built-in type and its callback.
func (b *Broadcaster) registerReplication() error {
	if _, ok := b.cfg.Types.Lookup(AlterReplicateConfig); !ok {
		if err := b.cfg.Types.Register(message.TypeInfo{Type: AlterReplicateConfig}); err != nil {
			return err
		}
	}
	if b.cfg.Callbacks.ack(AlterReplicateConfig) == nil {
		return OnAck(b.cfg.Callbacks, AlterReplicateConfig, JSON[ReplicateConfig](), b.replicateCallback)
	}
	return nil
}

// replicateCallback stores a topology. A replicated topology change that a
// force promote overtook is ignored, so an old configuration cannot
// overwrite the promoted one (R8.3).
func (b *Broadcaster) replicateCallback(_ context.Context, ev *TypedEvent[ReplicateConfig]) error {
	cfg := ev.Payload
	if ev.Message.Replicate != nil && (b.repl.fenced.Load() || b.Role() == Primary) {
		ev.Effects.SetOutcome(Outcome{Status: Ignored, Detail: "replicated configuration superseded by a force promote"})
		return nil
	}
	if cfg.ForcePromote {
		cfg = ReplicateConfig{Primary: b.cfg.ClusterName}
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	ev.Effects.stageOwn(catalog.Put(b.replicateKey(), raw))
	ev.Effects.SetOutcome(Outcome{Detail: "cluster " + b.cfg.ClusterName + " is " + cfg.RoleOf(b.cfg.ClusterName).String(), Data: raw})
	return nil
}

// applyFinished applies a topology whose task just became TOMBSTONE.
func (b *Broadcaster) applyFinished(t *task, out Outcome) {
	if t.msg.Type != AlterReplicateConfig || out.Status != Succeeded || out.Data == nil {
		return
	}
	var cfg ReplicateConfig
	if err := json.Unmarshal(out.Data, &cfg); err != nil {
		b.log.Error("applied replication config does not decode", "broadcast", t.id, "err", err)
		return
	}
	b.setReplication(&cfg)
}

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

// Follow makes an empty cluster a secondary under topology cfg (which must
// name another primary): it stores the topology and takes the secondary
// role, refusing DDL from then on. A cluster joins empty, so the broadcast
// ids it will take from its primary cannot meet ids of its own (its nodes
// skip ids they applied): a primary that ever allocated a broadcast id
// (the persisted id floor outlives its tombstones) is refused with
// ErrFailedPrecondition. A secondary may follow again (a new topology).
func (b *Broadcaster) Follow(ctx context.Context, cfg ReplicateConfig) error {
	if cfg.ForcePromote || cfg.RoleOf(b.cfg.ClusterName) != Secondary {
		return fmt.Errorf("%w: the topology must name a primary other than %q", ErrInvalidArgument, b.cfg.ClusterName)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	g, err := b.lockAll(ctx, resource.ExclusiveCluster())
	if err != nil {
		return err
	}
	defer g.Unlock()
	if b.Role() == Primary && b.ids.used() {
		return fmt.Errorf("%w: cluster %s has broadcast before; a cluster joins as a secondary empty", ErrFailedPrecondition, b.cfg.ClusterName)
	}
	if err := b.commit(ctx, "replicate", nil, catalog.Put(b.replicateKey(), raw)); err != nil {
		if errors.Is(err, catalog.ErrFenced) {
			b.depose(err)
		}
		return err
	}
	b.setReplication(&cfg)
	return nil
}

// Configure broadcasts a new replication topology (exclusive Cluster key, to
// every pchannel). On a secondary it is refused with ErrNotPrimary: a
// secondary follows its primary's topology (Follow), or is force-promoted.
func (b *Broadcaster) Configure(ctx context.Context, cfg ReplicateConfig) (*Result, error) {
	if cfg.ForcePromote {
		return nil, fmt.Errorf("%w: use ForcePromote", ErrInvalidArgument)
	}
	payload, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	h, err := b.WithResourceKeys(ctx, resource.ExclusiveCluster())
	if err != nil {
		return nil, err
	}
	defer h.Close()
	m, err := message.NewBroadcast(AlterReplicateConfig, payload, b.controlTargets())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return h.Broadcast(ctx, m)
}

// ForcePromote makes this secondary the primary after its primary was lost
// (R8.3). It takes the exclusive Cluster key, broadcasts a force-promote
// AlterReplicateConfig to every pchannel and waits until the streaming nodes
// acked it everywhere: replication is then fenced (later replicated copies
// create no task). Then it finishes every incomplete task in broadcast-id
// order: copies that never arrived are appended without their replicate
// header, and each task's callback runs and its TOMBSTONE is durable before
// the next starts; replicated topology changes are ignored. Finally the
// promote's own callback stores this cluster as primary.
//
// Copies are never appended twice, also when a promote crashed midway and
// runs again (on recovery, or when called again): before appending, the
// pchannels are read from where the first run's force-promote copies landed
// and the copies found there are acked instead.
//
// Stop the replicator before calling it. A call that finds a promote task
// running (or recovered) waits for it; a call that got the Cluster key only
// after another promote made the cluster primary fails with
// ErrNotSecondary, like any call on a primary.
func (b *Broadcaster) ForcePromote(ctx context.Context) (*Result, error) {
	b.mu.Lock()
	for _, t := range b.tasks {
		if t.promote {
			b.mu.Unlock()
			return b.wait(ctx, t, nil)
		}
	}
	b.mu.Unlock()
	if b.Role() != Secondary {
		return nil, ErrNotSecondary
	}
	payload, _ := json.Marshal(ReplicateConfig{Primary: b.cfg.ClusterName, ForcePromote: true})
	// Broadcast marks it unreplicable (a reserved property callers cannot
	// set).
	m, err := message.NewBroadcast(AlterReplicateConfig, payload, b.controlTargets(), message.WithAckSyncUp())
	if err != nil {
		return nil, err
	}
	// The exclusive Cluster key is taken directly: the role check that
	// refuses DDL on a secondary must not refuse this.
	g, err := b.lockAll(ctx, resource.ExclusiveCluster())
	if err != nil {
		return nil, err
	}
	h := &Handle{b: b, guard: g, promote: true}
	defer h.Close()
	// Another promote may have run while this one waited for the key; it
	// applied the primary role before releasing the key.
	if b.Role() != Secondary {
		return nil, ErrNotSecondary
	}
	return h.Broadcast(ctx, m)
}

// lockAll takes keys in the issuance locker, bounded by ctx and Close.
func (b *Broadcaster) lockAll(ctx context.Context, keys ...resource.Key) (*resource.Guard, error) {
	if err := b.closedErr(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTaskNotCreated, err)
	}
	lctx, stop := b.bound(ctx)
	defer stop()
	g, err := b.locker.Lock(lctx, keys...)
	if err != nil {
		if cerr := b.closedErr(); cerr != nil {
			return nil, fmt.Errorf("%w: %w", ErrTaskNotCreated, cerr)
		}
		return nil, err
	}
	return g, nil
}

// runPromote is a force-promote task's work once its copies are appended:
// see ForcePromote. It gives up only when the broadcaster stops; recovery
// resumes it.
func (b *Broadcaster) runPromote(t *task) {
	ctx := b.ctx
	select {
	case <-t.ackedAll:
	case <-ctx.Done():
		return
	}
	b.repl.fenced.Store(true)
	from, ok := b.promotePositions(ctx, t)
	if !ok {
		return
	}
	found, ok := b.scanSupplements(ctx, from)
	if !ok {
		return
	}
	b.mu.Lock()
	var incomplete []*task
	for _, x := range b.tasks {
		if x != t {
			incomplete = append(incomplete, x)
		}
	}
	b.mu.Unlock()
	slices.SortFunc(incomplete, func(x, y *task) int { return compareTicks(x.id, y.id, 0, 0) })
	b.log.Warn("force promote: finishing incomplete tasks", "count", len(incomplete), "promote", t.id)
	for _, x := range incomplete {
		if !b.supplement(ctx, x, found) {
			return
		}
	}
	t.mu.Lock()
	t.enrolled = true
	t.mu.Unlock()
	b.sched.enroll(t)
}

// promotePositions returns, per pchannel, the entry offset where the first
// run of this promote landed its copy, recording it on the first run. It
// retries failures until it succeeds, and returns false only if the
// broadcaster stopped.
func (b *Broadcaster) promotePositions(ctx context.Context, t *task) (map[message.PChannel]uint64, bool) {
	key := b.promoteKey(t.id)
	bo := b.cfg.Backoff.New()
	for {
		m, err := b.readPromotePositions(ctx, key)
		if err == nil {
			if m != nil {
				return m, true
			}
			break
		}
		if errors.Is(err, ErrCorruptCatalog) {
			b.log.Error("force promote: cannot read where its copies landed; retrying", "key", key, "err", err)
		} else {
			b.log.Warn("force promote: cannot read where its copies landed; retrying", "key", key, "err", err)
		}
		if !wait.Sleep(ctx, bo.NextBackOff()) {
			return nil, false
		}
	}
	m := map[message.PChannel]uint64{}
	t.mu.Lock()
	for i, v := range t.msg.Broadcast.VChannels {
		cp := t.appendCP[i]
		if !t.appended[i] {
			cp = t.ackCP[i]
		}
		if cp.MessageID != 0 {
			m[v.PChannel()] = wal.EntryOffset(cp.MessageID)
		}
	}
	t.mu.Unlock()
	raw, _ := json.Marshal(m)
	bo.Reset()
	for {
		err := b.commit(ctx, "promote", t, catalog.Put(key, raw))
		if err == nil {
			return m, true
		}
		if errors.Is(err, catalog.ErrFenced) {
			b.depose(err)
			return nil, false
		}
		b.log.Warn("force promote: cannot record where its copies landed; retrying", "key", key, "err", err)
		if !wait.Sleep(ctx, bo.NextBackOff()) {
			return nil, false
		}
	}
}

// readPromotePositions reads what promotePositions recorded; nil, nil if
// nothing.
func (b *Broadcaster) readPromotePositions(ctx context.Context, key string) (map[message.PChannel]uint64, error) {
	raw, err := b.cat.Get(ctx, key)
	if errors.Is(err, catalog.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	m := map[message.PChannel]uint64{}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrCorruptCatalog, key, err)
	}
	return m, nil
}

// copyKey names one copy of one broadcast.
type copyKey struct {
	id uint64
	v  message.VChannel
}

// scanSupplements reads each pchannel from the promote's copy to the end and
// returns where copies already are, so none is appended twice (R8.3). A
// pchannel that cannot be read is read again, with backoff: a partial scan
// could append a copy a second time. It returns false only if the
// broadcaster stopped.
func (b *Broadcaster) scanSupplements(ctx context.Context, from map[message.PChannel]uint64) (map[copyKey]wal.Checkpoint, bool) {
	found := map[copyKey]wal.Checkpoint{}
	for p, off := range from {
		bo := b.cfg.Backoff.New()
		for {
			err := b.cfg.WAL.ReadToEnd(ctx, p, off, func(c wal.Copy) error {
				found[copyKey{c.Message.Broadcast.ID, c.VChannel}] = c.Checkpoint
				return nil
			})
			if err == nil {
				break
			}
			// Copies found before the failure are real; the next read finds
			// them again.
			b.log.Warn("force promote: cannot scan pchannel; retrying", "pchannel", p, "err", err)
			if !wait.Sleep(ctx, bo.NextBackOff()) {
				return nil, false
			}
		}
	}
	return found, true
}

// supplement finishes one incomplete task during a force promote: its
// missing copies are acked where a previous run appended them, or appended
// now without the replicate header; then its callback runs and it becomes
// TOMBSTONE. An AckSyncUp task's copies count only once consumers ack them
// (R4.4). It returns false if the broadcaster stopped.
func (b *Broadcaster) supplement(ctx context.Context, x *task, found map[copyKey]wal.Checkpoint) bool {
	syncUp := x.msg.Broadcast.AckSyncUp
	var need []int
	x.mu.Lock()
	for i := range x.msg.Broadcast.VChannels {
		if !x.acked[i] {
			need = append(need, i)
		}
	}
	x.mu.Unlock()
	groups := map[message.PChannel][]int{}
	n := 0
	for _, i := range need {
		v := x.msg.Broadcast.VChannels[i]
		if cp, ok := found[copyKey{x.id, v}]; ok {
			// Appended by an earlier run: its consumer acks it (AckSyncUp),
			// or it is acked here.
			if !syncUp && !b.ackRetrying(x, i, cp) {
				return false
			}
			continue
		}
		groups[v.PChannel()] = append(groups[v.PChannel()], i)
		n++
	}
	if n > 0 {
		wire, err := message.Marshal(x.msg.WithoutReplicateHeader())
		if err != nil {
			// The message was encoded when its task was created: this
			// cannot fail.
			b.log.Error("force promote: encode", "broadcast", x.id, "err", err)
			return false
		}
		x.mu.Lock()
		x.wire = wire
		x.mu.Unlock()
		if !b.appendCopies(x, groups, n) {
			return false
		}
		if !syncUp {
			for _, idx := range groups {
				for _, i := range idx {
					if !b.fastAck(x, i) {
						return false
					}
				}
			}
		}
	}
	x.mu.Lock()
	st := x.state
	x.mu.Unlock()
	if st == Replicated {
		if err := b.persistAcks(ctx, x); err != nil {
			// The TOMBSTONE will hold them; a crash before it runs the
			// promote again, which finds the copies again.
			b.log.Warn("force promote: persist acks", "broadcast", x.id, "err", err)
		}
		b.enrollReplicated(x, x.control)
	}
	b.sched.kick()
	select {
	case <-x.done:
		return true
	case <-ctx.Done():
		return false
	}
}
