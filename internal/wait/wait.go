// Package wait holds small helpers of walcast's loops: sleeping that a
// context cuts short, and running application code so that its panic
// becomes an error. Retry schedules and retry loops are internal/retry's.
package wait

import (
	"context"
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
