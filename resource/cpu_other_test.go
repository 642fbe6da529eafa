//go:build !unix

package resource

// cpuNanos is not measured here: the cpu-ns/op metric reads 0.
func cpuNanos() int64 { return 0 }
