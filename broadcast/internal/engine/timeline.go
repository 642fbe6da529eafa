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
// MaxTimelines: ring holds them by value in finishing order (no allocation
// per task once it is full), byID where each is, next is where the next
// one goes (the oldest, once the ring is full).
type timelines struct {
	byID map[uint64]int
	ring []keptTimeline
	next int
}

// keptTimeline is a timeline in the ring, with its task's id; its slices
// use the slot's own arrays when they fit, so that keeping a finished
// task's timeline allocates nothing (B10).
type keptTimeline struct {
	id       uint64
	tl       Timeline
	attempts [1]Attempt
	times    [16]time.Time
}

// keepTask remembers the timeline of t, which finished at now, forgetting
// the oldest past MaxTimelines.
func (ts *timelines) keepTask(t *task, now time.Time) {
	slot := ts.slot(t.id)
	slot.tl = Timeline{LockAsked: unixTime(t.lockAsked), LockGranted: unixTime(t.lockGranted), Created: t.created,
		Persisted: unixTime(t.persisted), Tombstoned: now}
	if len(t.history) <= len(slot.attempts) {
		slot.tl.Attempts = slot.attempts[:copy(slot.attempts[:], t.history)]
	} else {
		slot.tl.Attempts = slices.Clone(t.history)
	}
	n := len(t.copies)
	times := slot.times[:]
	if 2*n > len(times) {
		times = make([]time.Time, 2*n)
	}
	slot.tl.Appended, slot.tl.Acked = times[:n:n], times[n:2*n:2*n]
	for i, cp := range t.copies {
		slot.tl.Appended[i], slot.tl.Acked[i] = unixTime(cp.appendedAt), unixTime(cp.ackedAt)
	}
}

// keep remembers id's timeline, forgetting the oldest past MaxTimelines.
func (ts *timelines) keep(id uint64, tl Timeline) {
	ts.slot(id).tl = tl
}

// slot returns the ring's slot for id, emptied: a new one, or the oldest's
// once the ring is full.
func (ts *timelines) slot(id uint64) *keptTimeline {
	if ts.byID == nil {
		ts.byID = make(map[uint64]int)
	}
	i := len(ts.ring)
	if i < MaxTimelines {
		ts.ring = append(ts.ring, keptTimeline{id: id})
	} else {
		i = ts.next
		delete(ts.byID, ts.ring[i].id)
		ts.ring[i].id = id
		ts.next = (ts.next + 1) % MaxTimelines
	}
	ts.byID[id] = i
	return &ts.ring[i]
}

// get returns a copy of id's kept timeline, which shares nothing with the
// ring (a slot is reused once MaxTimelines newer tasks finished).
func (ts *timelines) get(id uint64) (Timeline, bool) {
	i, ok := ts.byID[id]
	if !ok {
		return Timeline{}, false
	}
	tl := ts.ring[i].tl
	tl.Attempts = slices.Clone(tl.Attempts)
	tl.Appended, tl.Acked = slices.Clone(tl.Appended), slices.Clone(tl.Acked)
	return tl, true
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
		Persisted: unixTime(t.persisted), Attempts: slices.Clone(t.history)}
	// One array for both: a finished task's timeline is kept (MaxTimelines).
	times := make([]time.Time, 2*len(t.copies))
	tl.Appended, tl.Acked = times[:len(t.copies):len(t.copies)], times[len(t.copies):]
	for i, cp := range t.copies {
		tl.Appended[i], tl.Acked[i] = unixTime(cp.appendedAt), unixTime(cp.ackedAt)
	}
	return tl
}
