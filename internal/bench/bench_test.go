package bench

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRunSmall runs every benchmark at a tiny size: the harness works and
// every result is filled in. The numbers are not asserted (they are
// measurements, recorded in BENCHMARKS.md), except the zero-I/O property of
// duplicate hits, which is behaviour.
func TestRunSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := Config{Samples: 10, Clients: 4, Duration: 200 * time.Millisecond, Tombstones: 300, Pending: 10}
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int{}
	for _, r := range res {
		ids[r.ID]++
		if r.Value <= 0 && r.ID != "B3" {
			t.Errorf("%s %q: value %v", r.ID, r.What, r.Value)
		}
		if r.ID == "B5" && r.Note != "0 catalog round trips + WAL appends during 100 hits" {
			t.Errorf("duplicate hits did I/O: %s", r.Note)
		}
	}
	for id, n := range map[string]int{"B1": 1, "B2": 1, "B3": 2, "B4": 1, "B5": 1, "B6": 2, "S1": 1, "S2": 1} {
		if ids[id] != n {
			t.Errorf("%d results for %s, want %d", ids[id], id, n)
		}
	}
}

// The SPEC §12 benchmarks as Go benchmarks: b.N is ignored, each runs the
// measurement once and reports its value.
func benchOne(b *testing.B, id string) {
	cfg := Defaults()
	cfg.Only = []string{id}
	cfg.Duration = 3 * time.Second
	for b.Loop() {
		res, err := Run(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range res {
			b.ReportMetric(r.Value, r.ID+"_"+r.Unit)
			if r.Ratio > 0 {
				b.ReportMetric(r.Ratio, r.ID+"_ratio")
			}
		}
	}
}

func BenchmarkB1UncontendedLatency(b *testing.B)   { benchOne(b, "B1") }
func BenchmarkB2Throughput(b *testing.B)           { benchOne(b, "B2") }
func BenchmarkB4WideBroadcast(b *testing.B)        { benchOne(b, "B4") }
func BenchmarkB5DuplicateHit(b *testing.B)         { benchOne(b, "B5") }
func BenchmarkB6Recovery(b *testing.B)             { benchOne(b, "B6") }
func BenchmarkS1APILatencyTLSAuth(b *testing.B)    { benchOne(b, "S1") }
func BenchmarkS2APIThroughputTLSAuth(b *testing.B) { benchOne(b, "S2") }
