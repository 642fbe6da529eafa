// Package node is walcast's streaming node (SPEC R9.3): it consumes the
// pchannels assigned to it, applies every broadcast copy to the application's
// per-vchannel state exactly once, and acks each copy to the coordinator.
//
// # Using it
//
//	n, err := node.New(node.Config{Name: "node-1", WAL: w,
//		PChannels: []message.PChannel{"wal-0", "wal-1"},
//		Applier: app, Acker: coordinator, StateDir: dir}) // restores app from dir
//	if err := n.Start(ctx); err != nil { ... }           // ctx bounds start-up only
//	defer n.Close()                                      // stops, saves the state
//
// The Acker is the *broadcast.Broadcaster itself in process, or an API
// client of the coordinator.
//
// # Processing model
//
// Each pchannel has one reader goroutine and one worker goroutine; pchannels
// proceed independently. The worker handles one WAL entry at a time, and the
// copies in it in WAL order:
//
//  1. apply every copy of the entry that the state has not seen, retrying a
//     failing Apply with backoff, never skipping it;
//  2. if the entry holds an AckSyncUp copy, save the state (below) first, so
//     an AckSyncUp ack always means "applied and durable on the node";
//  3. ack every copy that carries a broadcast id, in WAL order, re-acking
//     copies that were not applied because they were duplicates;
//  4. move the resume offset past the entry.
//
// The next entry waits for all of this: strict per-pchannel order is what
// makes the coordinator see control-channel acks in WAL order, which orders
// the enrolment of REPLICATED tasks on a secondary (R5.4, R8.2).
//
// # Exactly once per vchannel
//
// Every pchannel has a durable state in StateDir: the resume offset, the
// position (message id) of the last copy handled, the set of broadcast ids
// applied per vchannel, and the Applier's state of the same pchannel (a
// VChannelApplier's per vchannel). These parts are captured together by the
// worker, between two copies, so they always agree with each other. A copy is
// applied unless one of two records says it already was:
//
//   - its position is at or below the last handled position: the copy is being
//     re-read from an older resume offset (a restart, or a read that resumed
//     mid-entry), and its effect is in the restored state;
//   - its broadcast id is in its vchannel's applied set: the coordinator
//     appended the broadcast again (recovery re-appends copies whose append
//     results it had not persisted), at a new position.
//
// Either way the copy is acked again, since acks are idempotent and a
// recovered coordinator may need them again (R4.5).
//
// "Exactly once" therefore holds for the state the Applier snapshots: Apply
// is never called twice for a (vchannel, broadcast id) within one state
// lineage. After a clean Close the state is saved and nothing is re-applied.
// After a crash the node restores the last saved state and re-applies the
// copies after it to that restored state — the Applier sees those calls
// again, but its state never holds an effect twice. Effects an Applier keeps
// outside its snapshot are at-least-once across crashes; SnapshotEvery and
// SnapshotInterval bound how much is replayed.
//
// Apply must be atomic: on error it must leave no effect, because the copy
// is applied again later. Calls for one pchannel are sequential; calls for
// different pchannels are concurrent.
//
// # Why the snapshot is per pchannel
//
// Applier.Snapshot and Restore take a pchannel, instead of snapshotting the
// whole Applier: a vchannel lives on exactly one pchannel, so the state
// partitions cleanly, and each pchannel can save its state at its own entry
// boundaries without pausing the others. A whole-Applier snapshot would have
// to stop every pchannel at a boundary at once, and a pchannel stuck retrying
// an Apply or an ack would block every other pchannel's snapshot. A worker
// only sees copies of its own pchannel's vchannels: the WAL reader of a
// pchannel returns those alone. (With lanes, wal.WithLanes, one lane's
// entries routinely hold copies for other pchannels too; the reader skips
// them.)
//
// # Acks
//
// Acks carry the copy's checkpoint and its message, so a secondary cluster
// creates REPLICATED tasks from them (R8.2). They run on the node's own
// lifetime context, never a caller's (R9.3): only Close stops them. An ack is
// retried with backoff until it succeeds; each attempt is bounded by
// AckTimeout so a hung call is retried too. An ack refused with
// broadcast.ErrVChannelNotInTask or broadcast.ErrInvalidArgument can never
// succeed: it is logged, counted in Status and not retried. A remote Acker
// must map the coordinator's status codes back to those errors. An Acker that
// is an AllAcker (the *broadcast.Broadcaster is) gets the acks of an entry in
// one call, and a retry sends only the acks that failed.
//
// # Durability and restart
//
// A pchannel's state is two files: a base, the whole state at some point
// (written to a temporary file, fsynced, renamed over the old one, the
// directory fsynced), and a journal of the saves since, each save one batch
// appended and fsynced that holds what changed: the position, and the
// vchannels applied to since the save before, each with its applied ids
// and, for a VChannelApplier, its snapshot (SnapshotVChannel). A save thus
// costs what changed, not every vchannel the pchannel ever had (a plain
// Applier's whole snapshot is written at every save: a new base). Once the
// journal outgrows the base, a save writes a new base and starts an empty
// journal. Checksums guard every record; a save cut short by a crash at the
// end of the journal did not happen. It is saved every SnapshotEvery
// entries, SnapshotInterval after the first unsaved change, before acking
// an AckSyncUp copy, and on Close (also in the middle of an entry: the
// copies applied so far are then re-read, deduplicated by position, and
// acked). New restores each pchannel's state into the Applier (Restore, or
// RestoreVChannel per vchannel) and Start resumes reading at the saved
// offset. A pchannel without a state starts at offset 0 (the beginning of
// the retained log) with no Restore call, so a pchannel moved to a new node
// is rebuilt from the WAL, never from its end. New reads a state file of
// the format before (one JSON file per pchannel, rewritten at every save);
// the first save replaces it. One StateDir serves one node at a time.
//
// A node knows which log it read (R9.14): the state saves, with the
// position, the identity of the pchannel's log (wal.Identified: the NATS
// stream's name and creation time, the Kafka topic's id). A log of another
// identity is not the one the state was read from (the stream or topic was
// deleted and created again, or the brokers lost their data), however long
// it has grown since: reading on at the saved position would skip every
// entry the new log holds before it, applying later ones to views that miss
// them, while the skipped entries' tasks wait for acks forever. So does a
// saved position past the end of the log, on a backend that cannot tell
// identities. Such a pchannel halts instead — at Start, before the first
// entry of every reader it opens or reopens is delivered (a NATS cursor
// whose stream was recreated fails with wal.ErrLogReplaced; franz-go stops
// reading a topic whose id changed), and after LogCheckInterval without an
// entry (the end is believed past the position once three reads of it a
// second apart agree: a new Kafka partition leader may report a lower high
// watermark for a moment) — with StageHalted and the reason in Status
// (Halted), an error log, and a halted gauge in the process's metrics.
// Nothing of the new log is applied before. Resync (`walcast node resync`)
// makes the stopped node's state read the log again from its start, and
// take its identity, keeping what it applied: copies of broadcasts it
// applied are deduplicated by id and acked again, and since nothing of the
// new log was applied before, its copies apply in log order.
//
// The applied-id sets are kept as sorted id ranges: the control channel,
// which receives every broadcast, costs a few ranges instead of one entry per
// broadcast.
//
// Requirement ids (SPEC R2.5, R3.2, ...) refer to docs/spec.md, walcast's
// specification, in the repository.
package node
