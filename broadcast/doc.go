// Package broadcast is walcast's engine: it broadcasts a control message to
// many WAL channels atomically, makes it take effect through ordered ack
// callbacks, and answers client retries from the original.
//
// # Using it
//
//	b, err := broadcast.New(ctx, broadcast.Config{Catalog: cat, WAL: w, Types: types,
//		Callbacks: cbs, ControlChannel: "wal-0/_control"})    // recovers every task
//	h, err := b.WithResourceKeys(ctx, resource.SharedDatabase("db"),
//		resource.ExclusiveCollection("db", "orders"))         // blocks for the keys
//	defer h.Close()                                          // releases them unless Broadcast ran
//	// ... validate under the locks, build msg ...
//	res, err := h.Broadcast(ctx, msg)                        // returns after the callback
//
// # What happens to a broadcast
//
//  1. The caller holds its resource keys (plus the shared Cluster key) in the
//     issuance locker; conflicting broadcasts wait (SPEC §3).
//  2. Broadcast stamps the message (id, control channel, keys), registers the
//     task and, for a keyed message, its idempotency scope in one critical
//     section (R7.3), and persists the PENDING record before any append
//     (R4.2). From here the task owns the keys and completes even across
//     crashes: New recovers it.
//  3. The copies go to the WAL through lanes (backend channels that
//     pchannels may share): per lane one append at a time, its entry holding
//     the copies of every broadcast queued for the lane; a failed append is
//     retried as the same entry, with backoff, ahead of new work, and only
//     its lane waits (R4.3).
//  4. Without AckSyncUp the copies are acked from the append results
//     (FastAck, R4.4); with it, consumers' acks count (Ack).
//  5. The callback scheduler runs the type's ack callback in control-channel
//     order among conflicting tasks (R5.4), retrying until it succeeds (R5.2).
//  6. The TOMBSTONE record, the checkpoints and the callback's staged catalog
//     writes commit in one transaction (R5.3): two catalog commits on the
//     critical path in all (R4.9). Then the keys are released and the caller
//     answered (R4.6).
//  7. Tombstones stay for MaxLifetime or the newest MaxCount, whichever is
//     shorter, then GC deletes them in batches (§6); that is the idempotency
//     window (§7).
//
// # Crashes
//
// Appends are at-least-once: a crash after an append but before the
// TOMBSTONE leads recovery to append the copies again, so consumers
// deduplicate by broadcast id per vchannel. (A force promote records where
// its copies landed and persists its acks instead: it appends none twice.) Callbacks are at-least-once in
// their external effects and exactly-once in their staged catalog effects.
// Every catalog write is idempotent and retried on ambiguous failures; a
// definite failure before the PENDING record is durable is reported as
// ErrTaskNotCreated. A catalog that reports a newer coordinator term
// (catalog.ErrFenced) stops the broadcaster: a deposed coordinator writes
// nothing more.
//
// # Idempotency
//
// A message with an idempotency key is deduplicated within its scope
// (message type + scoped key). WithIdempotentResourceKeys resolves the key
// before taking locks (R7.5): a retry of an accepted request gets a duplicate
// handle that waits for the original and returns its id, its per-vchannel
// results and its outcome, with Result.Duplicated set (R7.4), and a Window
// saying how long the key is remembered (R7.7). Lookup answers without
// waiting.
//
// # Observability
//
// Config.Observer receives the events behind the metrics of R9.6
// (server/internal/metrics exports them to Prometheus). Config.TracerProvider
// traces each broadcast: Broadcast starts "walcast.broadcast" from the
// caller's context and, unless the message already carries a W3C trace
// context, stores that span's context in the message before the task is
// persisted. The task's later spans — "walcast.persist", "walcast.append",
// "walcast.callback" (one per attempt; the callback's context carries it) and
// "walcast.tombstone" — are children of the stored context, so they join the
// caller's trace even after a restart, and streaming nodes join it from the
// copies they read (tracing). Spans carry the idempotency key's
// fingerprint, never the key.
//
// # Implementation notes
//
// The engine's rules live in a decision core (broadcast/internal/engine): a state
// machine with no goroutines, no I/O and no clock, which takes events and
// returns actions. This package is its face and driver, in the manner of the
// loop a user of etcd's raft package writes:
//
//   - One loop goroutine drives the core. It steps it with every event — an
//     API request, an I/O result, a timer tick — draining what is queued
//     before it performs the actions, and re-arms one timer on the core's
//     earliest deadline (Config.Clock's, so a test or the simulator moves
//     time).
//   - Bounded pools perform the actions: catalog commits, WAL appends,
//     callbacks and ack-once callbacks (at most CallbackConcurrency at once),
//     WAL scans. Each sends its result back to the loop as an event. Workers
//     start on demand and exit when idle; Close cancels their I/O and waits
//     for them.
//   - An API call sends its request to the loop with a reply channel and
//     waits for the reply, its context or the broadcaster's end. For a
//     request usually answered without I/O (a key's original, a lock, a
//     handle's close, a look at the core), when the core is free and no
//     event waits for the loop, the caller steps the core with its request
//     itself (a TryLock of the driver's mutex): if
//     the step only answers callers (a duplicate found in the index, a
//     lock granted at once), the caller delivers the answers and no
//     goroutine handoff happens; anything else the step asked for is left
//     for the loop to perform with its batch. A Submit goes to the loop,
//     whose batches of drained requests share catalog commits, unless no
//     task is in flight (there is no batch to join): then its caller steps
//     the core with it the same way and hands the first write to a commits
//     worker or the group-committing catalog itself, never running the I/O
//     on its own goroutine (its context must still end its wait). The
//     loop holds the mutex while it steps and performs, so under load
//     requests go to it and keep being batched. What a
//     caller can do alone it does in its own goroutine: validating, stamping
//     and encoding its message, decoding a tombstone it got as an original.
//     A call whose context ends withdraws what it holds (a lock wait, an
//     admission slot); a created task goes on.
//   - Nothing else is shared: the core's state is touched only under the
//     driver's mutex, which is never held while taking another lock that
//     waits on the core (pool submissions and reply sends do not block),
//     so there is no lock order to keep. The Handle's mutex guards only the
//     handle's own fields; the tracing spans of tasks have a mutex of their
//     own (written by the loop and by commit workers).
//
// The task state machine is one table (broadcast/internal/engine/types.go, also
// in docs/design.md); the durable-write policy, what every outcome of every
// catalog or WAL write means, is another (broadcast/internal/engine/writes.go). The
// deterministic simulator (broadcast/internal/sim) drives the same core with a virtual
// clock and seeded faults; a rule of the engine is tested there, this
// package's tests check the driver and the backends.
package broadcast
