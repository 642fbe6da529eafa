package broadcast

import (
	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/broadcast/internal/simrt"
)

// The simulator's seam (package simrt): a Config that runs the driver on
// the simulator's runtime, and the core of a broadcaster, read while none
// of its goroutines runs.
func init() {
	simrt.WithRuntime = func(cfg any, rt simrt.Runtime, salt string) any {
		c := cfg.(Config)
		c.rt, c.salt = rt, salt
		return c
	}
	simrt.Core = func(b any) *engine.Core { return b.(*Broadcaster).d.core }
}
