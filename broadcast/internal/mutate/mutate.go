// Package mutate is the list of bugs the simulator plants to show that its
// checkers can fail (SPEC R11.4): each Bug breaks one rule a checker claims
// to enforce, and TestMutationsCaught runs each for a bounded number of
// seeds and fails if one survives.
//
// A planted bug is compiled only into a build with the tag walcast_mutate:
// without it Enabled is false and every Bug.Is is the constant false, so
// the hooks in the engine and the driver vanish from a production binary
// (no string is compared, nothing is read). Run the mutation tests with
//
//	go test -tags walcast_mutate -run TestMutationsCaught -v ./broadcast/internal/sim
package mutate

import "fmt"

// Bug is one planted bug; None plants nothing.
type Bug uint8

// The planted bugs. Each breaks the rule named in its Info.
const (
	None Bug = iota
	// AppendBeforePersist starts the appends before the PENDING record is
	// durable (§11.1, R4.2).
	AppendBeforePersist
	// CallbackTwice runs the callback again after a TOMBSTONE write that
	// may have applied, instead of retrying the same ops (R5.3).
	CallbackTwice
	// ReleaseBeforeTombstone releases the issuance keys when the callback
	// succeeds, before the TOMBSTONE is durable (§11.3).
	ReleaseBeforeTombstone
	// ForgetReplicatedIndex leaves REPLICATED tasks out of the
	// idempotency index (R7.8, §11.4).
	ForgetReplicatedIndex
	// RetireBeforeDelete retires GC's index entries before their delete
	// commits (R6.2, §11.4).
	RetireBeforeDelete
	// SecondPhaseEarly appends a two-phase broadcast's rest before its
	// first copies' acks are durable (R13.11).
	SecondPhaseEarly
	// GroupKeysReleasedAtBegin releases a group's keys at its Begin's
	// TOMBSTONE, like a plain broadcast's (R13.1).
	GroupKeysReleasedAtBegin
	// GroupUnordered runs a member's callback without waiting for the
	// members before it (R13.2).
	GroupUnordered
	// WaiterNotWithdrawn leaves a Resolve that waits for another
	// request's admission in place when its handle is closed: a caller
	// that gave up is admitted later and holds the scope for ever (R11.3).
	WaiterNotWithdrawn
	// EarlyCollect collects tombstones at half their lifetime without
	// counting them as early evictions (R6.3).
	EarlyCollect
	// CountEvictsNewest evicts the newest tombstones of a class beyond its
	// MaxCount instead of the oldest (R6.4).
	CountEvictsNewest
	// WindowMovesOnRestart restarts every recovered tombstone's window at
	// the recovery (R6.3).
	WindowMovesOnRestart
	// AnswerBeforeDurable answers a broadcast's callers when its callback
	// succeeds, before its TOMBSTONE is durable (§11.4, R4.6).
	AnswerBeforeDurable
	// TombstoneWithCopyQueued writes the TOMBSTONE while a copy of its
	// task still waits to be appended (§11.1).
	TombstoneWithCopyQueued
	// AppendBoundOffByOne lets one append more than AppendConcurrency be
	// in flight (R4.3).
	AppendBoundOffByOne
	// AbortKeepsKeys keeps the keys of a task whose PENDING record was
	// never written (§11.5).
	AbortKeepsKeys
	// RetryOutsideTable moves a task from its callback's backoff straight
	// to calling along a row the transition table does not have.
	RetryOutsideTable
	// GroupKeysKeptAfterEnd keeps a group's keys after its end's TOMBSTONE
	// (R13.3).
	GroupKeysKeptAfterEnd
	// SupplementTwice makes a force promote append a supplement again
	// after its first append was answered (R8.3).
	SupplementTwice
	// FastPathOvertakes lets a caller or a worker step the core itself
	// while an event it (or another) sent waits for the loop, so that its
	// request overtakes that event: a Withdraw overtaking its own Resolve
	// leaves the Resolve to be admitted for a caller that is gone (R11.3).
	FastPathOvertakes
	// CancelledNotWithdrawn leaves a request whose caller's context ended
	// with the core: the driver sends no Withdraw (R11.3).
	CancelledNotWithdrawn
	// PermanentRetried retries a callback that failed with an error the
	// application marked permanent instead of ending its task failed
	// (R11.6).
	PermanentRetried
	// PoisonBlocksOthers makes every callback wait while another task's
	// callback fails and waits to be retried, as the reference system's
	// bug #47629 blocks all DDL (R11.6: caught by the latency of the
	// broadcasts on other keys, TestR11_6_PoisonKeepsOthersLatency).
	PoisonBlocksOthers
	// WaitIgnoresContext makes a caller's wait for its reply deaf to its
	// context (R11.5).
	WaitIgnoresContext
	// UnknownPChannelAccepted lets a broadcast to a pchannel the WAL does
	// not have through when Config.PChannels is unset: its task is created
	// and its append retried for ever, holding its keys (R2.3).
	UnknownPChannelAccepted
	// WithdrawnStillAnswered reports a request waiting for its task's
	// result withdrawn but leaves it among the task's waiters, so that its
	// caller, gone, is answered when the task ends (R11.5).
	WithdrawnStillAnswered
	// WaitDeafToClose makes a caller's wait for its reply deaf to the
	// broadcaster's Close: a caller waiting when Close returns waits on
	// (R11.5).
	WaitDeafToClose
	numBugs
)

// Info describes a Bug.
type Info struct {
	// Name is its flag name (-sim.mutate=Name).
	Name string
	// Rule is the rule it breaks, as the checker's failure names it.
	Rule string
	// Driver says the bug is in the driver (package broadcast): only seeds
	// that run the real driver can catch it.
	Driver bool
	// Latency says no invariant breaks, only the latency of broadcasts on
	// other keys than a poisoned callback's (R11.6).
	Latency bool
}

var infos = [numBugs]Info{
	None:                     {Name: "none"},
	AppendBeforePersist:      {Name: "append-before-persist", Rule: "§11.1"},
	CallbackTwice:            {Name: "callback-twice", Rule: "R5.3"},
	ReleaseBeforeTombstone:   {Name: "release-before-tombstone", Rule: "§11.3"},
	ForgetReplicatedIndex:    {Name: "forget-replicated-index", Rule: "§11.4"},
	RetireBeforeDelete:       {Name: "retire-before-delete", Rule: "§11.4"},
	SecondPhaseEarly:         {Name: "second-phase-early", Rule: "R13.11"},
	GroupKeysReleasedAtBegin: {Name: "group-keys-released-at-begin", Rule: "R13.1"},
	GroupUnordered:           {Name: "group-unordered", Rule: "R13.2"},
	WaiterNotWithdrawn:       {Name: "waiter-not-withdrawn", Rule: "R11.3"},
	EarlyCollect:             {Name: "early-collect", Rule: "R6.3"},
	CountEvictsNewest:        {Name: "count-evicts-newest", Rule: "R6.4"},
	WindowMovesOnRestart:     {Name: "window-moves-on-restart", Rule: "R6.3"},
	AnswerBeforeDurable:      {Name: "answer-before-durable", Rule: "§11.4"},
	TombstoneWithCopyQueued:  {Name: "tombstone-with-copy-queued", Rule: "§11.1"},
	AppendBoundOffByOne:      {Name: "append-bound-off-by-one", Rule: "R4.3"},
	AbortKeepsKeys:           {Name: "abort-keeps-keys", Rule: "§11.5"},
	RetryOutsideTable:        {Name: "retry-outside-table", Rule: "transition table"},
	GroupKeysKeptAfterEnd:    {Name: "group-keys-kept-after-end", Rule: "R13.3"},
	SupplementTwice:          {Name: "supplement-twice", Rule: "R8.3"},
	FastPathOvertakes:        {Name: "fast-path-overtakes", Rule: "R11.3", Driver: true},
	CancelledNotWithdrawn:    {Name: "cancelled-not-withdrawn", Rule: "R11.3", Driver: true},
	PermanentRetried:         {Name: "permanent-retried", Rule: "R11.6", Driver: true},
	PoisonBlocksOthers:       {Name: "poison-blocks-others", Rule: "R11.6", Latency: true},
	WaitIgnoresContext:       {Name: "wait-ignores-context", Rule: "R11.5", Driver: true},
	UnknownPChannelAccepted:  {Name: "unknown-pchannel-accepted", Rule: "R2.3", Driver: true},
	WithdrawnStillAnswered:   {Name: "withdrawn-still-answered", Rule: "R11.5"},
	WaitDeafToClose:          {Name: "wait-deaf-to-close", Rule: "R11.5", Driver: true},
}

// All returns every planted bug, None excluded, in declaration order.
func All() []Bug {
	out := make([]Bug, 0, numBugs-1)
	for b := None + 1; b < numBugs; b++ {
		out = append(out, b)
	}
	return out
}

// Info returns b's description.
func (b Bug) Info() Info {
	if b >= numBugs {
		return Info{Name: fmt.Sprintf("bug(%d)", uint8(b))}
	}
	return infos[b]
}

// String returns b's name.
func (b Bug) String() string { return b.Info().Name }

// Is reports whether b is x and planted bugs are compiled in: false in
// every build without the tag walcast_mutate, where the compiler removes
// the hook it guards.
func (b Bug) Is(x Bug) bool { return Enabled && b == x }

// Parse returns the bug named name ("" is None).
func Parse(name string) (Bug, error) {
	if name == "" {
		return None, nil
	}
	for b := None; b < numBugs; b++ {
		if infos[b].Name == name {
			return b, nil
		}
	}
	return None, fmt.Errorf("mutate: no planted bug %q", name)
}
