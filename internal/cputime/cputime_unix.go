//go:build unix

// Package cputime reads the CPU time the process has used, for benchmarks
// that report CPU per operation beside wall time.
package cputime

import (
	"syscall"
	"time"
)

// Process is the CPU time (user + system) this process has used: every
// goroutine's, the collector's and any server embedded in the process. A
// difference over a phase is that phase's CPU, whatever else the machine
// runs. 0 where it cannot be read.
func Process() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
