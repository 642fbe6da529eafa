package broadcast

import (
	"context"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/resource"
)

// Test hooks: compiled into the package's tests only.

// TestLocker takes issuance keys in a broadcaster's lock table on a test's
// behalf, whatever the cluster's role, as another broadcast would hold them.
type TestLocker struct{ b *Broadcaster }

// Locker returns the test hook on b's lock table.
func (b *Broadcaster) Locker() TestLocker { return TestLocker{b} }

// TestGuard releases keys a TestLocker took.
type TestGuard struct{ h *Handle }

// Unlock releases the keys.
func (g *TestGuard) Unlock() { g.h.release() }

// Lock takes keys (normalised, no implicit Cluster key), waiting for them.
func (l TestLocker) Lock(ctx context.Context, keys ...resource.Key) (*TestGuard, error) {
	return l.take(ctx, keys, false)
}

// TryLock takes keys without waiting; a conflict wraps resource.ErrConflict.
func (l TestLocker) TryLock(keys ...resource.Key) (*TestGuard, error) {
	return l.take(context.Background(), keys, true)
}

func (l TestLocker) take(ctx context.Context, keys []resource.Key, try bool) (*TestGuard, error) {
	norm, err := resource.Normalize(keys)
	if err != nil {
		return nil, err
	}
	h := l.b.newHandle(nil)
	if err := h.lock(ctx, norm, try, 0); err != nil {
		return nil, err
	}
	return &TestGuard{h}, nil
}

var _ = engine.Lock{}

// Waiters returns how many callers wait for live task id's result.
func (b *Broadcaster) Waiters(id uint64) int {
	var n int
	b.d.inspect(func(c engine.View) { n = c.Waiters(id) })
	return n
}

// PromoteTask returns the id of the force promote under way, 0 if none.
func (b *Broadcaster) PromoteTask() uint64 {
	var id uint64
	b.d.inspect(func(c engine.View) { id = c.PromoteTask() })
	return id
}

// Outstanding returns what requests hold or wait for in b's core: once
// every caller has returned, nothing but what live tasks and the test's
// own locks hold (R11.5).
func (b *Broadcaster) Outstanding() engine.Outstanding {
	var o engine.Outstanding
	b.d.inspect(func(c engine.View) { o = c.Outstanding() })
	return o
}

// SetKeysScanBudget makes Keys look at n tasks and tombstones a call, until
// the test ends.
func SetKeysScanBudget(t interface{ Cleanup(func()) }, n int) {
	old := keysScanBudget
	keysScanBudget = n
	t.Cleanup(func() { keysScanBudget = old })
}

// SetTasksChunk sets how many tombstones Tasks reads under the loop at a
// time, until the test ends.
func SetTasksChunk(t interface{ Cleanup(func()) }, n int) {
	old := tasksChunk
	tasksChunk = n
	t.Cleanup(func() { tasksChunk = old })
}
