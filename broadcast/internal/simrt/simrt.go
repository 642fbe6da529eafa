// Package simrt is the seam through which the deterministic simulator
// (broadcast/internal/sim) runs a broadcaster's real driver (R11.1): the
// driver's concurrency — its loop, its pools' jobs, the waits of its
// callers and the points where a caller or a worker steps the core itself
// — goes through a Runtime, so that the simulator runs every goroutine one
// at a time and a seed decides which runs next, replaying exactly.
//
// In production no Runtime is set: the driver starts real goroutines and
// blocks on its channels, and each seam costs one nil check.
package simrt

import (
	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/broadcast/internal/mutate"
)

// Runtime runs a broadcaster's goroutines for the simulator.
type Runtime interface {
	// Go starts fn on a goroutine the runtime schedules: a pool's job, a
	// drain; GoLoop starts the driver's loop.
	Go(fn func())
	GoLoop(fn func())
	// Park blocks the calling goroutine until the runtime resumes it, which
	// it does only once ready reports true (a reply arrived, a context
	// ended, an event waits for the loop). It returns at once if ready
	// already does.
	Park(ready func() bool)
	// Yield lets the runtime run other goroutines before the calling one
	// goes on: a point where, in production, another goroutine may act
	// (the seed decides whether one does).
	Yield()
	// Fast reports whether a goroutine that may step the core itself (the
	// driver's mutex is free and no event waits for the loop) does: the
	// seed decides, as contention for the mutex does in production.
	Fast() bool
	// Mutation is the bug planted in the driver (mutate.None: none).
	Mutation() mutate.Bug
}

// Hooks package broadcast sets, so that the simulator can build a
// broadcaster on a Runtime and read its core between two of its steps
// without the driver's types being exported.
var (
	// WithRuntime returns cfg (a broadcast.Config) set to run on rt, with
	// salt as its WAL entries' salt (a replayable one).
	WithRuntime func(cfg any, rt Runtime, salt string) any
	// Core returns b's (a *broadcast.Broadcaster) decision core: read it
	// only while none of b's goroutines runs.
	Core func(b any) *engine.Core
)
