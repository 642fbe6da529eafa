package broadcast

import (
	"time"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// Observer receives the broadcaster's events, for metrics. Methods are called
// synchronously on hot paths and must be fast and non-blocking.
type Observer interface {
	// TaskState is called when a task enters a state (from is 0 for a new
	// or recovered task) and when it leaves the last one (to is 0: deleted).
	TaskState(t message.Type, from, to State)
	// Appended is called when every copy of a task is in the WAL, with the
	// time since the task was created (broadcast duration).
	Appended(t message.Type, d time.Duration)
	// Completed is called when a task is TOMBSTONE, with its execution time.
	Completed(t message.Type, d time.Duration)
	// Callback is called after each callback attempt with its duration and
	// error (nil on success).
	Callback(t message.Type, d time.Duration, err error)
	// AppendRetry is called when an append round to p failed and will be
	// retried.
	AppendRetry(p message.PChannel, err error)
	// LockWait is called when a broadcast got its resource keys.
	LockWait(keys []resource.Key, d time.Duration)
	// Duplicate is called when a request resolved to an earlier broadcast.
	Duplicate(t message.Type)
	// Evicted is called when GC deleted tombstones: early of them were
	// evicted by MaxCount before reaching MaxLifetime (R6.3).
	Evicted(total, early int)
	// CatalogCommit is called for every catalog commit the broadcaster
	// makes; kind is "pending", "ack", "tombstone", "gc", "ids",
	// "replicate" (Follow) or "promote" (where a force promote's copies
	// landed).
	CatalogCommit(kind string)
	// Fenced is called when the catalog reports a newer coordinator term.
	Fenced()
}

type nopObserver struct{}

func (nopObserver) TaskState(message.Type, State, State)        {}
func (nopObserver) Appended(message.Type, time.Duration)        {}
func (nopObserver) Completed(message.Type, time.Duration)       {}
func (nopObserver) Callback(message.Type, time.Duration, error) {}
func (nopObserver) AppendRetry(message.PChannel, error)         {}
func (nopObserver) LockWait([]resource.Key, time.Duration)      {}
func (nopObserver) Duplicate(message.Type)                      {}
func (nopObserver) Evicted(int, int)                            {}
func (nopObserver) CatalogCommit(string)                        {}
func (nopObserver) Fenced()                                     {}
