// Package sim is walcast's deterministic simulator (SPEC R11.1, R11.2): it
// drives the engine's decision core (broadcast/internal/engine) on in-memory
// backends, stepped synchronously, with a virtual clock and one seeded
// random source that decides everything — the workload, the order in which
// every in-flight write, append, callback and ack completes, and every
// fault.
//
// # What a seed runs
//
// A primary cluster ("east"), sometimes with a secondary ("west") that
// follows it through a replicator; two to five clients, each running a few
// broadcasts of five types (FastAck, AckSyncUp, with an ack-once callback,
// without a callback, and one in a retention class of its own) with
// conflicting and non-conflicting resource keys and, often, an idempotency
// key from a small pool (retries and concurrent first requests meet in one
// scope); streaming nodes that read their pchannels in WAL order and ack;
// an operator who retries or completes a callback that keeps failing; GC
// under count pressure (MaxCount 3, 8 or 64). In the replication scenario
// the primary is lost at a point the seed picks and the secondary is
// force-promoted, after which clients retry there.
//
// Groups (R13): some clients run a transaction (a keyed Begin, up to four
// bodies, a Commit or a Rollback) or an owner (an import job owning
// "own/<n>", ended by its commit or rollback broadcast); members are keyed
// and retried until the group ends, across crashes and the promote. Some
// broadcasts append a fence copy first (two-phase, R13.11) and some are
// local-only (R13.13). After a promote, a reconciler rolls back the groups
// begun on the old primary that the promoted cluster still holds open, as
// an application does after a failover (R13.5).
//
// # Faults
//
// Catalog writes fail definitely, time out without applying, apply and
// lose their answer, or are fenced by a newer coordinator term; WAL appends
// fail definitely, time out, or land and lose their answer (per lane, so a
// broadcast's appends partly succeed); callbacks and ack-once callbacks
// fail, some tasks' callbacks for a while; WAL scans fail; coordinators
// crash at any step (writes and appends in flight land or not) and recover
// from the same catalog and WAL; nodes restart from an older position and
// ack again; clients give up waiting and retry; the clock jumps forward by
// up to two hours or back a little. The fault phase ends when the
// workload is done or after a number of steps the seed picks; then the
// quiescent phase (quiesce.go, R11.3) must answer everyone, answer a fresh
// request with every key of the seed, and leave nothing behind.
//
// # What is checked
//
// As writes and appends land: a copy is appended only for a task whose
// record is durable (§11.1); no effect is applied twice (§11.2);
// conflicting callbacks take effect in control-channel order (§11.3); a new
// task's scope has no other record (no two originals, §11.4); nothing is
// written over a TOMBSTONE but its own bytes (R5.3, R6.3); no more appends
// are in flight than AppendConcurrency (R4.3). After every step:
// no move outside the transition table; no two live tasks hold conflicting
// keys and no finished task holds a key (§11.3, §11.5); on a primary every
// open group holds its keys and no broadcast outside it holds conflicting
// ones (R13.1), and a key held by a group means the group is open (R13.3).
// A group's members take effect in sequence order (R13.2); no copy of a
// two-phase broadcast outside its first phase is appended before the first
// acks are durable (R13.11). At every GC delete: a tombstone collected
// before its window ends is beyond its class's MaxCount, and none older of
// its class remains (R6.3, R6.4); after every restart, no recovered window
// moved. When a client is
// answered: never before the original's TOMBSTONE (§11.4). At the end:
// every persisted task completed with its effect applied exactly once and a
// copy on every target, nothing live or held, no force-promote supplement
// appended twice (R8.3); then every window expires and GC must collect
// everything.
//
// Run(Config{Seed: s}) is deterministic: the same seed gives the same
// Result.Hash. The tests in this package run many seeds, replay failures,
// and plant known bugs (package mutate, R11.4) to show they are caught.
package sim
