// Package crash simulates process crashes for fault tests: wrappers around a
// catalog and a WAL log that, once their Switch is flipped, fail every call
// as a dead process would, so that an abandoned broadcaster can make no
// further durable change while a new one recovers from the same stores.
package crash

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// ErrCrashed is returned by every call after the crash. It is ambiguous on
// purpose: a crashed process does not learn what happened.
var ErrCrashed = errors.New("crash: process crashed")

// Switch is the crash of one simulated process.
type Switch struct {
	dead    atomic.Bool
	once    sync.Once
	crashed chan struct{}
}

// NewSwitch returns a live switch.
func NewSwitch() *Switch { return &Switch{crashed: make(chan struct{})} }

// Crash kills the process: every wrapped call fails from now on.
func (s *Switch) Crash() {
	s.once.Do(func() {
		s.dead.Store(true)
		close(s.crashed)
	})
}

// Dead reports whether Crash was called.
func (s *Switch) Dead() bool { return s.dead.Load() }

// Crashed is closed by Crash.
func (s *Switch) Crashed() <-chan struct{} { return s.crashed }

// Action is what a hook decides for one call.
type Action int

const (
	// Pass lets the call through.
	Pass Action = iota
	// Before crashes before the call reaches the store: nothing is written.
	Before
	// After lets the call write, then crashes before its answer returns.
	After
)

// Catalog wraps a catalog with a crash switch and a hook choosing, per
// Commit, where to crash.
type Catalog struct {
	catalog.Catalog
	S    *Switch
	Hook func(ops []catalog.Op) Action
}

// Commit applies ops unless the process crashed, crashing around it if the
// hook says so.
func (c *Catalog) Commit(ctx context.Context, ops ...catalog.Op) error {
	if c.S.Dead() {
		return ErrCrashed
	}
	a := Pass
	if c.Hook != nil {
		a = c.Hook(ops)
	}
	if a == Before {
		c.S.Crash()
		return ErrCrashed
	}
	err := c.Catalog.Commit(ctx, ops...)
	if a == After {
		c.S.Crash()
		return ErrCrashed
	}
	if c.S.Dead() {
		return ErrCrashed
	}
	return err
}

// Get reads unless the process crashed.
func (c *Catalog) Get(ctx context.Context, key string) ([]byte, error) {
	if c.S.Dead() {
		return nil, ErrCrashed
	}
	return c.Catalog.Get(ctx, key)
}

// List reads unless the process crashed.
func (c *Catalog) List(ctx context.Context, prefix string, fn func(string, []byte) error) error {
	if c.S.Dead() {
		return ErrCrashed
	}
	return c.Catalog.List(ctx, prefix, fn)
}

// Log wraps a WAL log with a crash switch and a hook choosing, per Append,
// where to crash. After the crash Append, Read and End fail, as the
// catalog's writes and reads do (a dead process reads nothing either);
// cursors opened before it are left alone. MaxEntryBytes, a setting, passes
// through. Close does not close the wrapped log, which outlives the crashed
// process.
type Log struct {
	wal.Log
	S    *Switch
	Hook func(p message.PChannel, data []byte) Action
}

// Append writes unless the process crashed, crashing around it if the hook
// says so.
func (l *Log) Append(ctx context.Context, p message.PChannel, id string, data []byte) (uint64, error) {
	if l.S.Dead() {
		return 0, ErrCrashed
	}
	a := Pass
	if l.Hook != nil {
		a = l.Hook(p, data)
	}
	if a == Before {
		l.S.Crash()
		return 0, ErrCrashed
	}
	off, err := l.Log.Append(ctx, p, id, data)
	if a == After {
		l.S.Crash()
		return 0, ErrCrashed
	}
	if l.S.Dead() {
		return 0, ErrCrashed
	}
	return off, err
}

// Read opens a cursor unless the process crashed.
func (l *Log) Read(ctx context.Context, p message.PChannel, from uint64) (wal.Cursor, error) {
	if l.S.Dead() {
		return nil, ErrCrashed
	}
	return l.Log.Read(ctx, p, from)
}

// End asks where p ends unless the process crashed.
func (l *Log) End(ctx context.Context, p message.PChannel) (uint64, error) {
	if l.S.Dead() {
		return 0, ErrCrashed
	}
	return l.Log.End(ctx, p)
}

// Close does nothing: the log belongs to the surviving world.
func (l *Log) Close() error { return nil }
