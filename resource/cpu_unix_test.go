//go:build unix

package resource

import "syscall"

// cpuNanos is the CPU time (user + system) this process has used, in
// nanoseconds; 0 where it cannot be read.
func cpuNanos() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
