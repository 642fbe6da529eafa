//go:build unix

package bench

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time (user + system) this process has used. The
// embedded etcd and NATS servers run in it, so a difference over a phase is
// the whole system's CPU for that phase's work, whatever else the machine
// runs.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
