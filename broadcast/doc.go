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
//  3. The appender writes the copies, one entry per pchannel holding the
//     copies of every broadcast queued for it, retrying failed pchannels with
//     backoff ahead of new work (R4.3).
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
// deduplicate by broadcast id per vchannel. Callbacks are at-least-once in
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
// (internal/metrics exports them to Prometheus). Config.TracerProvider
// traces each broadcast: Broadcast starts "walcast.broadcast" from the
// caller's context and, unless the message already carries a W3C trace
// context, stores that span's context in the message before the task is
// persisted. The task's later spans — "walcast.persist", "walcast.append",
// "walcast.callback" (one per attempt; the callback's context carries it) and
// "walcast.tombstone" — are children of the stored context, so they join the
// caller's trace even after a restart, and streaming nodes join it from the
// copies they read (internal/tracing). Spans carry the idempotency key's
// fingerprint, never the key.
package broadcast
