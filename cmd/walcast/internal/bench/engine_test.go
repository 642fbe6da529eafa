package bench

import (
	"strings"
	"testing"
)

// TestB10_EngineAllocationsWithinTarget runs walcast bench's B10 (the same
// body as go test's BenchmarkBroadcast and BenchmarkBroadcastOneLane) and
// holds its allocations per broadcast to B10's bound, with a lane per
// pchannel and with one lane; an allocation count is the same on a loaded
// machine, unlike the CPU figure, which is reported but not judged here.
func TestB10_EngineAllocationsWithinTarget(t *testing.T) {
	rs, err := b10(newTracker(nil))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 4 {
		t.Fatalf("%d results, want CPU and allocations for two lane layouts: %+v", len(rs), rs)
	}
	for _, r := range rs {
		t.Logf("%s: %.1f %s (%s)", r.What, r.Value, r.Unit, r.Note)
		if r.Value <= 0 {
			t.Errorf("%s: %v %s, want a measurement", r.What, r.Value, r.Unit)
		}
		if strings.HasSuffix(r.What, "allocations per broadcast") && !raceEnabled && !r.Pass {
			t.Errorf("%s: %.0f, want %s (B10)", r.What, r.Value, r.Target)
		}
	}
}
