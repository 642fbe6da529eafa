package engine

import (
	"slices"
	"time"
)

// MaxTimelines bounds how many finished tasks keep their timeline in
// memory (RecentTimeline): the latest to finish here. A tombstone's record
// keeps only its creation and completion times.
const MaxTimelines = 1024

// Timeline is when a task went through each step of its life, as this
// core saw it (the console draws it, R9.9). A zero time is a step not
// seen: not reached yet, not taken (a broadcast without resource keys
// waits for no lock), or taken before this core recovered the task.
type Timeline struct {
	// LockAsked and LockGranted bound the wait for the issuance locks.
	LockAsked, LockGranted time.Time
	// Created is when the task got its id; Persisted when its PENDING
	// record was durable.
	Created, Persisted time.Time
	// Appended and Acked are, per target in header order, when the copy's
	// append returned and when its ack came.
	Appended, Acked []time.Time
	// Attempts are the latest callback attempts (at most
	// MaxAttemptHistory), oldest first.
	Attempts []Attempt
	// Tombstoned is when the TOMBSTONE was durable.
	Tombstoned time.Time
}

// timelines keeps the timelines of the tasks that finished last, at most
// MaxTimelines: ring holds their ids in finishing order, next is where the
// next one goes (the oldest, once the ring is full).
type timelines struct {
	byID map[uint64]*Timeline
	ring []uint64
	next int
}

// keep remembers id's timeline, forgetting the oldest past MaxTimelines.
func (ts *timelines) keep(id uint64, tl *Timeline) {
	if ts.byID == nil {
		ts.byID = make(map[uint64]*Timeline)
	}
	if len(ts.ring) < MaxTimelines {
		ts.ring = append(ts.ring, id)
	} else {
		delete(ts.byID, ts.ring[ts.next])
		ts.ring[ts.next] = id
		ts.next = (ts.next + 1) % MaxTimelines
	}
	ts.byID[id] = tl
}

// unixTime is the time of unix nanoseconds n, zero for 0.
func unixTime(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// timeline returns t's timeline so far.
func (t *task) timeline() Timeline {
	tl := Timeline{LockAsked: unixTime(t.lockAsked), LockGranted: unixTime(t.lockGranted), Created: t.created,
		Persisted: unixTime(t.persisted), Attempts: slices.Clone(t.history),
		Appended: make([]time.Time, len(t.copies)), Acked: make([]time.Time, len(t.copies))}
	for i, cp := range t.copies {
		tl.Appended[i], tl.Acked[i] = unixTime(cp.appendedAt), unixTime(cp.ackedAt)
	}
	return tl
}

// RecentTimeline returns the timeline of id, a live task or one of the
// MaxTimelines tasks that finished last here.
func (c *Core) RecentTimeline(id uint64) (Timeline, bool) {
	if t := c.tasks[id]; t != nil {
		return t.timeline(), true
	}
	if tl := c.timelines.byID[id]; tl != nil {
		out := *tl
		return out, true
	}
	return Timeline{}, false
}
