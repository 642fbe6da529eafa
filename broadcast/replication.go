package broadcast

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// Unreplicable reports whether m must stay in its cluster: its type says so,
// or it is a force promote.
func Unreplicable(types *message.Registry, m *message.Message) bool {
	if m.Properties[engine.UnreplicableProperty] != "" {
		return true
	}
	info, ok := types.Lookup(m.Type)
	return ok && info.Unreplicable
}

// Promoting reports whether a force promote is under way (a replicator must
// not run then).
func (b *Broadcaster) Promoting() bool {
	var p bool
	b.d.inspect(func(c engine.View) { p = c.Promoting() })
	return p
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
	if _, err := json.Marshal(cfg); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	if err := b.closedErr(); err != nil {
		return fmt.Errorf("%w: %w", ErrTaskNotCreated, err)
	}
	h := b.newHandle(nil)
	if err := h.lock(ctx, []resource.Key{resource.ExclusiveCluster()}, false, 0); err != nil {
		return err
	}
	r, err := b.d.call(ctx, func(to engine.Target) engine.Event { return engine.Follow{To: to, Handle: h.id, Config: cfg} })
	if err != nil {
		return err
	}
	return r.Err
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
// runs again (on recovery, or when called again): where the promote's copies
// landed is recorded once they are appended, and before supplementing, the
// pchannels are read from there and the copies found are acked instead of
// appended again.
//
// Stop the replicator before calling it. A call that finds a promote task
// running (or recovered) waits for it; a call that got the Cluster key only
// after another promote made the cluster primary fails with
// ErrNotSecondary, like any call on a primary.
func (b *Broadcaster) ForcePromote(ctx context.Context) (*Result, error) {
	var running uint64
	if !b.d.inspect(func(c engine.View) { running = c.PromoteTask() }) {
		return nil, fmt.Errorf("%w: %w", ErrTaskNotCreated, b.closedErr())
	}
	if running != 0 {
		return b.waitTask(ctx, running)
	}
	if b.Role() != Secondary {
		return nil, ErrNotSecondary
	}
	payload, _ := json.Marshal(ReplicateConfig{Primary: b.cfg.ClusterName, ForcePromote: true})
	m, err := message.NewBroadcast(AlterReplicateConfig, payload, b.controlTargets(), message.WithAckSyncUp())
	if err != nil {
		return nil, err
	}
	// The exclusive Cluster key is taken directly: the role check that
	// refuses DDL on a secondary must not refuse this. Another promote may
	// have run while this one waited for the key; it applied the primary
	// role before releasing the key, and the grant checks the role again.
	h := b.newHandle(nil)
	h.promote = true
	if err := h.lock(ctx, []resource.Key{resource.ExclusiveCluster()}, false, Secondary); err != nil {
		return nil, err
	}
	defer h.Close()
	return h.Broadcast(ctx, m)
}

// waitTask waits for live task id's result.
func (b *Broadcaster) waitTask(ctx context.Context, id uint64) (*Result, error) {
	r, err := b.d.call(ctx, func(to engine.Target) engine.Event { return engine.Wait{To: to, ID: id} })
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Errorf("broadcast %d continues in the background: %w", id, err)
	case err != nil:
		return nil, fmt.Errorf("broadcast %d was created and completes after recovery: %w", id, err)
	case r.Err != nil:
		return nil, r.Err
	case r.Original != nil:
		res, err := tombResult(r.Original)
		if res != nil {
			res.Duplicated, res.Deduplicated = nil, false
		}
		return res, err
	}
	return resultOf(r.Result, nil), nil
}
