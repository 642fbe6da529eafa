// Package resource names the things a DDL/DCL broadcast works on and serialises
// conflicting broadcasts with shared/exclusive locks on them.
//
// # Keys
//
// A [Key] is a (domain, name, mode) triple: "Collection db1:orders, exclusive",
// "Database db1, shared", "Cluster, shared". Two keys conflict when they name the
// same (domain, name) and at least one of them is exclusive (SPEC R3.2).
//
// Domains have a fixed place in a global lock order (R3.1). The built-in domains
// are, in order: [Collection], [Database], [Privilege], [Snapshot], [ImportJob],
// and [Cluster], which is always last. An application registers further domains
// with [RegisterDomain], choosing their place in the order by their number.
//
// # Locking
//
// A [Locker] hands out [Guard]s. [Locker.Lock] normalises the keys it is given
// ([Normalize]: deduplicate, sort by (domain order, name), and upgrade a key
// named both shared and exclusive to exclusive), then acquires them one at a
// time in that order. Because every caller acquires in the same global order,
// multi-key lockers never deadlock, whatever order they pass keys in (R3.3).
//
//	g, err := locker.Lock(ctx, resource.SharedDatabase("db1"), resource.ExclusiveCollection("db1", "orders"))
//	if err != nil {
//		return err // ctx ended while waiting; nothing is held
//	}
//	defer g.Unlock()
//
// Lock is fair: each key has a FIFO queue of waiters, and a new request waits
// behind any queued request, so a stream of shared lockers cannot starve a
// waiting exclusive locker (R3.5). Lock honours context cancellation: a waiter
// whose context ends leaves the queue, gives back the keys it already holds, and
// lets the requests queued behind it proceed.
//
// [Locker.TryLock] never blocks. It fails, with an error wrapping
// [ErrConflict], only when a key is actually held in a conflicting mode. It
// deliberately ignores queued waiters: a shared TryLock succeeds while an
// exclusive Lock is queued behind shared holders. This is the choice the
// broadcaster's callback scheduler needs (a failure must mean "someone holds
// it", or the scheduler would stall, as the reference system's TryRLock did),
// and its price is that TryLock callers can overtake a queued exclusive waiter;
// the queued waiter is not starved as long as TryLock holders come and go,
// because the waiter is granted the moment the last holder leaves.
//
// A caller that locks the same keys again and again interns them once with
// [Locker.Intern]: the [KeySet] it returns holds them validated, normalised
// and resolved to the Locker's table entries, and [KeySet.Lock] and
// [KeySet.TryLock] skip that work (about half of an uncontended Lock and
// Unlock). The entries stay in the table until [KeySet.Close].
//
// [Guard.Unlock] releases every key exactly once, in reverse acquisition order;
// further calls are no-ops. A Guard is a small value, not a pointer: copies of
// it are the same guard, and the zero Guard (which Lock and TryLock return
// with an error) holds nothing. An uncontended Lock and Unlock allocate
// nothing: the Locker reuses the state a released guard had, and a guard kept
// after its Unlock can neither release nor relabel the state's next user.
//
// # Introspection
//
// [Locker.Snapshot] lists every key that is held or waited for, with its holders
// and waiters, their modes and how long they have held or waited (R3.7).
// [Guard.SetOwner] attaches a label (such as "broadcast 42") that appears there.
//
// # The Cluster key
//
// Every broadcast also holds the shared Cluster key unless it already holds
// the Cluster key ([WithClusterKey], R3.4), so the exclusive Cluster key is a
// barrier against all other DDL/DCL. The Cluster domain has exactly one key,
// the empty name: a named Cluster key ("Cluster:foo@R") is invalid
// ([ErrInvalidKey]) wherever a key is built, parsed, normalised or locked, so
// no request can replace the implicit shared key by one that does not
// conflict with the barrier.
//
// # Names
//
// [Key.Validate] is the one rule for names: at most [MaxNameLength] bytes of
// UTF-8, no '@' (it ends the name in the "<Domain>:<name>@R|X" form, so
// "Database:a@R@X" is refused instead of naming "a@R"), no control
// characters; Collection, Database, Snapshot and ImportJob keys need a
// non-empty name; Cluster keys must have the empty one.
//
// Requirement ids (SPEC R2.5, R3.2, ...) refer to docs/spec.md, walcast's
// specification, in the repository.
package resource
