package bench

import (
	"fmt"
	"testing"

	"github.com/walcast/walcast/broadcast/broadcastbench"
)

// B10's targets (SPEC §12): the engine's own cost per broadcast.
const (
	b10CPU    = 20.0 // µs of the process's CPU
	b10Allocs = 60
)

// b10 measures the engine alone (SPEC B10): one broadcast at a time on the
// in-memory catalog and WAL, with a lane per pchannel and with them folded
// into one, through the same body as `go test -bench
// 'BenchmarkBroadcast(OneLane)?$' ./broadcast` (package broadcastbench),
// run by testing.Benchmark: its CPU and allocations per broadcast.
func b10(t *tracker) ([]Result, error) {
	var out []Result
	for _, lanes := range []int{0, 1} {
		what := "a lane per pchannel"
		if lanes == 1 {
			what = "one lane"
		}
		st := t.timed("B10: the engine on in-memory backends, "+what, 0)
		res := testing.Benchmark(broadcastbench.Uncontended(lanes))
		st.end()
		if res.N == 0 {
			return out, fmt.Errorf("the benchmark failed (go test -run xxx -bench 'BenchmarkBroadcast(OneLane)?$' ./broadcast says why)")
		}
		cpu := res.Extra["cpu-ns/op"] / 1000
		allocs := res.AllocsPerOp()
		note := fmt.Sprintf("%d broadcasts", res.N)
		out = append(out,
			Result{ID: "B10", What: "engine alone, one broadcast at a time, " + what + ": CPU per broadcast", Value: cpu, Unit: "µs",
				Target: fmt.Sprintf("≤ %.0f µs", b10CPU), Pass: cpu > 0 && cpu <= b10CPU, Note: note},
			Result{ID: "B10", What: "engine alone, one broadcast at a time, " + what + ": allocations per broadcast", Value: float64(allocs), Unit: "allocs",
				Target: fmt.Sprintf("≤ %d", b10Allocs), Pass: allocs <= b10Allocs, Note: note})
	}
	return out, nil
}
