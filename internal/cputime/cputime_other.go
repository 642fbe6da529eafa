//go:build !unix

// Package cputime reads the CPU time the process has used, for benchmarks
// that report CPU per operation beside wall time.
package cputime

import "time"

// Process is not measured here: CPU figures read 0.
func Process() time.Duration { return 0 }
