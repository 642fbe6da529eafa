package engine

import (
	"fmt"
	"strings"
)

// This file is the task state machine: every stage a task goes through in
// the engine and every transition between them, in one table. The
// persisted states (PENDING, REPLICATED, TOMBSTONE; R4.1) are coarser: a
// task is PENDING from Persisting to Tombstoning when this cluster created
// it, REPLICATED over the same stages when a secondary took it from
// replicated copies, and TOMBSTONE once Done.
//
// Per copy (one per target vchannel) the engine also keeps whether it is
// appended (with its append result) and whether it is acked (with its
// checkpoint), and whether an ack-once callback runs for it; those two
// facts are independent (a consumer may ack a copy before its append
// returns, R4.5) and are not stages.

// Stage is where a task is in its lifecycle.
type Stage int

// Stages.
const (
	// StageNone: not in the engine (before creation, after Tombstoned or
	// Aborted).
	StageNone Stage = iota
	// Persisting: the PENDING record is being written, or waits to be
	// written again after an ambiguous failure (R4.2).
	Persisting
	// FirstPhase: a two-phase append's first copies are appended and wait
	// for their consumers' acks, which are made durable before the rest
	// are appended (R13.11).
	FirstPhase
	// Appending: the record is durable and copies are being appended
	// (R4.3).
	Appending
	// Acking: every copy is appended and the engine acks them from their
	// append results, running ack-once callbacks (FastAck, R4.4); a force
	// promote waits here for its consumers' acks.
	Acking
	// Collecting: a REPLICATED task collects its consumers' acks; it is not
	// in the callback order before its control-channel copy is acked (R8.2).
	Collecting
	// Promoting: a force promote has every ack and finishes the incomplete
	// tasks, one at a time (R8.3).
	Promoting
	// Queued: in the callback order (R5.4); waits until every copy is acked
	// and no earlier task with a conflicting key is unfinished.
	Queued
	// Calling: an attempt of the ack callback runs (R5.2).
	Calling
	// Backoff: the callback failed; the next attempt waits for its backoff,
	// an operator's retry or completion (R5.6).
	Backoff
	// Tombstoning: the TOMBSTONE with the callback's effects is being
	// written, or waits to be written again (R5.3).
	Tombstoning
	// Tombstoned: the TOMBSTONE is durable; the task is a tombstone now.
	Tombstoned
	// Holding: the TOMBSTONE of a group's Begin is durable and it keeps the
	// group's keys until the group's end (R13.1, R13.7).
	Holding
	// Aborted: the PENDING record was definitely not written; the task was
	// never created.
	Aborted
)

var stageNames = [...]string{"none", "persisting", "first-phase", "appending", "acking", "collecting", "promoting",
	"queued", "calling", "backoff", "tombstoning", "tombstoned", "holding", "aborted"}

func (s Stage) String() string {
	if int(s) < len(stageNames) {
		return stageNames[s]
	}
	return fmt.Sprintf("Stage(%d)", int(s))
}

// Trigger is what moves a task from one stage to another.
type Trigger int

// Triggers.
const (
	OnSubmit Trigger = iota + 1
	OnRecoverPending
	OnRecoverReplicated
	OnReplicatedAck
	OnPersisted
	OnNotCreated
	OnAppended
	OnAcked
	OnControlAcked
	OnSupplement
	OnPromoted
	OnRun
	OnCallbackOK
	OnCallbackFailed
	OnRetry
	OnForce
	OnTombstoned
	OnTombstoneRefused
	OnFirstAcked
	OnGroupEnded
	OnRecoverHolding
)

var triggerNames = map[Trigger]string{
	OnSubmit: "submitted", OnRecoverPending: "recovered PENDING", OnRecoverReplicated: "recovered REPLICATED",
	OnReplicatedAck: "first replicated ack", OnPersisted: "PENDING durable", OnNotCreated: "PENDING not written",
	OnAppended: "every copy appended", OnAcked: "every copy acked", OnControlAcked: "control copy acked",
	OnSupplement: "force promote finishes it", OnPromoted: "incomplete tasks finished", OnRun: "runnable",
	OnCallbackOK: "callback succeeded", OnCallbackFailed: "callback failed", OnRetry: "backoff over / retry now",
	OnForce: "operator completes", OnTombstoned: "TOMBSTONE durable", OnTombstoneRefused: "TOMBSTONE can never fit",
	OnFirstAcked: "first copies acked and durable", OnGroupEnded: "group's end durable", OnRecoverHolding: "recovered holding Begin",
}

func (t Trigger) String() string { return triggerNames[t] }

// transition is one row of the table.
type transition struct {
	from Stage
	on   Trigger
	to   Stage
	// when says which of several rows with the same from and on applies.
	when string
}

// table is the task state machine. The engine moves a task only along a
// row of it (Core.move); any other move is a bug, reported loudly.
var table = []transition{
	{StageNone, OnSubmit, Persisting, ""},
	{StageNone, OnRecoverPending, Appending, ""},
	{StageNone, OnRecoverPending, FirstPhase, "two-phase append, first copies not all acked"},
	{StageNone, OnRecoverHolding, Holding, "an open group's Begin"},
	{StageNone, OnRecoverReplicated, Collecting, "control copy not acked"},
	{StageNone, OnRecoverReplicated, Queued, "control copy acked"},
	{StageNone, OnReplicatedAck, Collecting, "on a secondary, not fenced"},
	{Persisting, OnPersisted, Appending, ""},
	{Persisting, OnPersisted, FirstPhase, "two-phase append"},
	{FirstPhase, OnFirstAcked, Appending, ""},
	{Persisting, OnNotCreated, Aborted, ""},
	{Appending, OnAppended, Acking, "FastAck, or a force promote"},
	{Appending, OnAppended, Queued, "AckSyncUp"},
	{Acking, OnAcked, Queued, ""},
	{Acking, OnAcked, Promoting, "a force promote"},
	{Collecting, OnControlAcked, Queued, ""},
	{Collecting, OnSupplement, Queued, ""},
	{Queued, OnSupplement, Queued, "copies missing"},
	{Promoting, OnPromoted, Queued, ""},
	{Queued, OnRun, Calling, ""},
	{Calling, OnCallbackOK, Tombstoning, ""},
	{Calling, OnCallbackFailed, Backoff, ""},
	{Calling, OnForce, Tombstoning, "the attempt failed after an operator completed it"},
	{Backoff, OnRetry, Calling, ""},
	{Backoff, OnForce, Tombstoning, ""},
	{Tombstoning, OnTombstoned, Tombstoned, ""},
	{Tombstoning, OnTombstoned, Holding, "a group's Begin (whatever its callback reported)"},
	{Holding, OnGroupEnded, Tombstoned, ""},
	{Tombstoning, OnTombstoneRefused, Backoff, "first attempt too large"},
}

// allowed reports whether the table has a row from -> to on trigger.
func allowed(from Stage, on Trigger, to Stage) bool {
	for _, r := range table {
		if r.from == from && r.on == on && r.to == to {
			return true
		}
	}
	return false
}

// TableMarkdown renders the table as docs/design.md shows it.
func TableMarkdown() string {
	var b strings.Builder
	b.WriteString("| from | on | to | when |\n|---|---|---|---|\n")
	for _, r := range table {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", r.from, r.on, r.to, r.when)
	}
	return b.String()
}
