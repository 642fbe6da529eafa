package engine

import (
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
)

// Role is a cluster's part in replication (SPEC §8).
type Role int32

// Roles.
const (
	Primary   Role = 1
	Secondary Role = 2
)

// String returns "primary", "secondary" or "unknown".
func (r Role) String() string {
	switch r {
	case Primary:
		return "primary"
	case Secondary:
		return "secondary"
	}
	return "unknown"
}

// ReplicateConfig is the replication topology: every cluster in it has the
// same view, and its role follows from its name.
type ReplicateConfig struct {
	// Primary names the primary cluster; "" means no replication: every
	// cluster is primary.
	Primary string `json:"primary"`
	// Secondaries are the clusters following the primary.
	Secondaries []SecondaryConfig `json:"secondaries,omitempty"`
	// ForcePromote marks the message of a force promote (never set in a
	// stored topology).
	ForcePromote bool `json:"force_promote,omitempty"`
	// Generation is the replication generation of the primary (R8.5): 0
	// for a cluster that was primary from the start, and for a promoted
	// one the id space of the force promote that made it primary, which is
	// above the space of every id it knew of, so each promote along a
	// chain of clusters raises it. A topology change the primary
	// broadcasts keeps it, so its secondaries learn it. A cluster whose
	// generation is below another primary's that replaced it is
	// superseded.
	Generation uint64 `json:"generation,omitempty"`
	// Replaced names the primary the force promote that set Generation
	// replaced ("" if none).
	Replaced string `json:"replaced,omitempty"`
}

// SecondaryConfig is one secondary cluster.
type SecondaryConfig struct {
	Name string `json:"name"`
	// Source is where the secondary's replicator reads the primary's WAL.
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

// AlterReplicateConfig is the built-in message type that changes the
// replication topology. The core runs its callback itself: it stores the
// topology (effect-once) and, once TOMBSTONE, applies the role it gives
// this cluster, before releasing the exclusive Cluster key it holds.
var AlterReplicateConfig = message.Type{Name: "AlterReplicateConfig", Version: 1}

// Reserved message properties (callers cannot set walcast.* properties).
const (
	ReservedPropertyPrefix = "walcast."
	// UnreplicableProperty marks a message the replicator must not copy.
	UnreplicableProperty = ReservedPropertyPrefix + "unreplicable"
	// ForcePromoteMark is UnreplicableProperty's value on a force promote.
	ForcePromoteMark = "force-promote"
	// LocalMark is UnreplicableProperty's value on a local-only broadcast
	// (R13.13): accepted on any role, never replicated.
	LocalMark = "local"
	// RequestDigestProperty carries the hex of the caller's request digest,
	// so that it replicates with the message (R7.6, R8.4).
	RequestDigestProperty = ReservedPropertyPrefix + "request-digest"
)

// roles is the cluster's replication state and its rules: the role a
// topology gives this cluster, what AlterReplicateConfig's callback stores
// (a replicated change a force promote overtook ignored, a promote's new
// generation, a primary's change keeping its generation), and applying a
// stored topology. The core runs the callback and applies its result once
// the task is TOMBSTONE.
type roles struct {
	role Role
	cfg  ReplicateConfig
	// fenced is set once a force promote has every pchannel's ack: no
	// replicated copy may create a task any more (R8.3).
	fenced bool

	// cluster is this cluster's name, prefix the catalog prefix.
	cluster, prefix string
	// What the roles use of their core: the actions out and a task's
	// logger (the core's for nil).
	out *outbox
	log func(*task) *slog.Logger
}

// set makes cfg the topology and applies the role it gives this cluster.
func (r *roles) set(cfg ReplicateConfig) {
	role := cfg.RoleOf(r.cluster)
	if old := r.role; old != role && old != 0 {
		r.log(nil).Warn("cluster role changed", "from", old.String(), "to", role.String(), "primary", cfg.Primary)
	}
	r.role, r.cfg = role, cfg
	if role == Primary {
		r.fenced = false
	}
	r.out.roleChanged(RoleChanged{Role: role, Config: cfg})
}

// callback is AlterReplicateConfig's callback. A replicated topology
// change that a force promote overtook is ignored, so an old configuration
// cannot overwrite the promoted one (R8.3).
func (r *roles) callback(t *task) ([]catalog.Op, Outcome, error) {
	var cfg ReplicateConfig
	if err := json.Unmarshal(t.msg.Payload, &cfg); err != nil {
		return nil, Outcome{}, fmt.Errorf("decode %s payload: %w", AlterReplicateConfig, err)
	}
	if t.msg.Replicate != nil && (r.fenced || r.role == Primary) {
		return nil, Outcome{Status: Ignored, Detail: "replicated configuration superseded by a force promote"}, nil
	}
	switch {
	case cfg.ForcePromote:
		// A new generation: the promote's id space (R8.5).
		cfg = ReplicateConfig{Primary: r.cluster, Generation: Space(t.id), Replaced: r.cfg.Primary}
	case t.msg.Replicate == nil && cfg.Generation < r.cfg.Generation:
		// A topology change of this primary keeps its generation.
		cfg.Generation, cfg.Replaced = r.cfg.Generation, r.cfg.Replaced
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, Outcome{}, err
	}
	detail := "cluster " + r.cluster + " is " + cfg.RoleOf(r.cluster).String()
	return []catalog.Op{catalog.Put(ReplicateKey(r.prefix), raw)}, Outcome{Status: Succeeded, Detail: detail, Data: raw}, nil
}

// apply applies the topology a finished AlterReplicateConfig task stored.
func (r *roles) apply(t *task) {
	if t.msg.Type != AlterReplicateConfig || t.outcome.Status != Succeeded || t.outcome.Data == nil {
		return
	}
	var cfg ReplicateConfig
	if err := json.Unmarshal(t.outcome.Data, &cfg); err != nil {
		r.log(t).Error("applied replication config does not decode", "broadcast", t.id, "err", err)
		return
	}
	r.set(cfg)
}

// follow makes the cluster a secondary under e.Config (R8.1), from a handle
// holding the exclusive Cluster key. A cluster joins empty, so the broadcast
// ids it will take from its primary cannot meet ids of its own (its nodes
// skip ids they applied): a primary that ever allocated or saw a broadcast
// id (the persisted id floor outlives its tombstones) is refused with
// ErrFailedPrecondition. A secondary may follow again (a new topology).
func (c *Core) follow(e Follow, h HandleID) {
	hd := c.handles.byID[h]
	if hd == nil || !hd.granted {
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: follow needs the exclusive Cluster key", ErrFailedPrecondition)})
		return
	}
	if c.roles.role == Primary && (c.ids.used() || len(c.tasks) > 0 || c.tombs.count() > 0) {
		c.handles.drop(hd)
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: cluster %s has broadcast before; a cluster joins as a secondary empty", ErrFailedPrecondition, c.cfg.ClusterName)})
		return
	}
	raw, err := json.Marshal(e.Config)
	if err != nil {
		c.handles.drop(hd)
		c.out.reply(e.To, Reply{Err: fmt.Errorf("%w: %w", ErrInvalidArgument, err)})
		return
	}
	hd.busy = true
	c.writes.write(WriteTopology, nil, nil, []catalog.Op{catalog.Put(ReplicateKey(c.cfg.Prefix), raw)}, func(_ *Core, _ *writeOp, d Decision, err error) {
		hd.busy = false
		if d == Done {
			c.roles.set(e.Config)
		}
		c.handles.drop(hd)
		if d != Done {
			c.out.reply(e.To, Reply{Err: err})
			return
		}
		c.out.reply(e.To, Reply{})
	})
}

// check refuses what the cluster's role does not allow (R8.1, R8.3).
func (r *roles) check(need Role) error {
	switch {
	case need == Primary && r.role != Primary:
		return ErrNotPrimary
	case need == Secondary && r.role != Secondary:
		return ErrNotSecondary
	}
	return nil
}
