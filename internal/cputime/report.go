package cputime

import "time"

// Reporter is what a benchmark reports a metric to (a *testing.B).
type Reporter interface{ ReportMetric(n float64, unit string) }

// ReportPerOp reports the process's CPU time since since, per op of n, as
// cpu-ns/op: on a shared machine ns/op counts the time a benchmark waited
// for a CPU, and with goroutines in parallel less than the ops cost;
// cpu-ns/op is what they cost every goroutine of the process (the
// collector's work included). Nothing is reported where CPU time cannot be
// read.
func ReportPerOp(r Reporter, since time.Duration, n int) {
	if since > 0 && n > 0 {
		r.ReportMetric(float64(Process()-since)/float64(n), "cpu-ns/op")
	}
}
