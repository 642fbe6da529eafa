package broadcast

import (
	"errors"

	"github.com/walcast/walcast/broadcast/internal/engine"
)

var (
	errInvalidConfig = errors.New("invalid broadcaster config")
	errHandleUsed    = errors.New("broadcast handle already used")
	errorsIs         = errors.Is
)

// State is a task's persisted state (R4.1): Pending, Replicated or
// Tombstone. String gives "PENDING", "REPLICATED", "TOMBSTONE" ("UNKNOWN"
// otherwise), as records and the admin API show them.
type State = engine.State

const (
	// Pending tasks were created by this cluster's broadcasts: persisted,
	// being appended, acked, called back.
	Pending = engine.Pending
	// Replicated tasks were created on a secondary from replicated copies.
	Replicated = engine.Replicated
	// Tombstone tasks are finished and kept for deduplication until GC.
	Tombstone = engine.Tombstone
)

// ParseState reads a state name as State's String writes it.
func ParseState(s string) (State, error) {
	for _, st := range []State{Pending, Replicated, Tombstone} {
		if st.String() == s {
			return st, nil
		}
	}
	return 0, errorfInvalid("unknown task state %q", s)
}

// OutcomeStatus is how a task ended, as its callback (or an operator) said.
// String gives "succeeded", "failed", "force-completed", "ignored"
// ("unknown" otherwise).
type OutcomeStatus = engine.OutcomeStatus

const (
	// Succeeded is the default outcome of a callback that returned nil.
	Succeeded = engine.Succeeded
	// Failed is an application failure the callback recorded (the import
	// job it created failed, say): retries with the same key keep getting
	// it, so the client knows to mint a new key (R7.9).
	Failed = engine.Failed
	// ForceCompleted is set by an operator who completed a stuck callback
	// (R5.6); the callback's effects were not applied.
	ForceCompleted = engine.ForceCompleted
	// Ignored marks a task force promote skipped (R8.3).
	Ignored = engine.Ignored
)

// Outcome is what a finished task's callback recorded: Status, Detail and
// application Data (e.g. the id of the import job created).
type Outcome = engine.Outcome

// Role is a cluster's part in replication (SPEC §8): Primary or Secondary.
// String gives "primary", "secondary" ("unknown" otherwise).
type Role = engine.Role

const (
	// Primary clusters accept DDL/DCL.
	Primary = engine.Primary
	// Secondary clusters follow a primary's WAL and refuse DDL/DCL.
	Secondary = engine.Secondary
)

// ReplicateConfig is the replication topology. Every cluster in it has the
// same view; its role follows from its name (RoleOf): the named primary is
// primary, every other cluster is secondary. A primary broadcasts its
// topology changes, so its secondaries (which replicate them) follow.
type ReplicateConfig = engine.ReplicateConfig

// SecondaryConfig is one secondary cluster of a ReplicateConfig: its Name
// and the Source its replicator reads the primary's WAL from.
type SecondaryConfig = engine.SecondaryConfig

// AlterReplicateConfig is the built-in message type that changes the
// replication topology. Every broadcaster registers it and runs its
// callback itself: it stores the topology (effect-once) and, after the
// TOMBSTONE, applies the role it gives this cluster. It holds the
// exclusive Cluster key and goes to the control channel of every pchannel.
var AlterReplicateConfig = engine.AlterReplicateConfig

// ReservedPropertyPrefix starts the message properties walcast sets itself.
// A broadcast whose caller sets one is refused as invalid (Check), so no
// caller can, say, keep a DDL from replicating.
const ReservedPropertyPrefix = engine.ReservedPropertyPrefix

// PayloadDigest is the digest a task record keeps of its message's payload:
// a keyed retry whose payload has another digest is refused as a key reused
// for other work (R7.3). Tools that write task records themselves (the
// bench's recovery load) use it to make records a retry can hit.
func PayloadDigest(payload []byte) []byte { return engine.PayloadDigest(payload) }

// IDSpace returns the id space of broadcast id: 0 for a cluster that was
// never promoted, and one more per force promote, so that every id a
// promoted cluster allocates is above every id of the primary it replaced.
func IDSpace(id uint64) uint64 { return engine.Space(id) }
