// Package wait holds small helpers of walcast's loops: sleeping that a
// context cuts short, and running application code so that its panic
// becomes an error; and of its tests: waiting for an event (For, ForNil)
// instead of sleeping. Retry schedules and retry loops are internal/retry's.
package wait

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Sleep waits d or until ctx ends; it reports whether the wait completed.
// A d <= 0 returns at once, true unless ctx has ended.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Safely runs fn and turns a panic in it into an error, so faulty
// application code (a callback, an applier) cannot take the process down.
func Safely(what string, fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s panicked: %v", what, r)
		}
	}()
	return fn()
}

// TB is what For and ForNil need of a test: testing.TB has it.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Patience is how long For and ForNil wait before they fail the test:
// generous, so that a loaded machine never fails a test that is right, for
// they wait for an event and are never a timed assertion.
const Patience = time.Minute

// For waits for cond to hold, polling it (every millisecond at first, then
// less often), and fails t naming what if it does not within Patience.
func For(t TB, what string, cond func() bool) {
	t.Helper()
	ForNil(t, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

var errNotYet = errors.New("the condition does not hold")

// ForNil waits for cond to return nil, as For, and fails t with cond's
// last error if it does not within Patience.
func ForNil(t TB, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(Patience)
	pause := time.Millisecond
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %v", what, err)
			return
		}
		time.Sleep(pause)
		pause = min(2*pause, 10*time.Millisecond)
	}
}
