package bench

import (
	"strings"
	"testing"
	"time"
)

// TestLoadAverage: /proc/loadavg's three averages are read, anything else
// is refused rather than read as zeros.
func TestLoadAverage(t *testing.T) {
	got, ok := parseLoadAverage("0.31 5.24 12.02 3/1234 5678\n")
	if !ok || got != [3]float64{0.31, 5.24, 12.02} {
		t.Errorf("got %v, %v", got, ok)
	}
	for _, bad := range []string{"", "0.31 0.24", "0.31 x 1.02 1/2 3"} {
		if _, ok := parseLoadAverage(bad); ok {
			t.Errorf("%q read as a load average", bad)
		}
	}
}

// TestMachineLine: a run's machine line says when, how many CPUs, the load
// at both ends, the Go version and the commit; an unknown load says so.
func TestMachineLine(t *testing.T) {
	m := &Machine{Start: time.Date(2026, 12, 1, 13, 47, 38, 0, time.UTC), End: time.Date(2026, 12, 1, 13, 48, 47, 0, time.UTC),
		CPUs: 2, GoVersion: "go1.26.8", Commit: "16c687d", LoadStart: [3]float64{3.24, 2.2, 1.67}, LoadEnd: [3]float64{5.29, 3, 2}, HasLoad: true}
	want := "2026-12-01 13:47:38-13:48:47 UTC, 2 CPUs, load average 3.24 at the start, 5.29 at the end (1 min), go1.26.8, commit 16c687d"
	if got := m.String(); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	m.HasLoad, m.Commit = false, ""
	if got := m.String(); !strings.Contains(got, "load average unknown") || strings.Contains(got, "commit") {
		t.Errorf("without load or commit: %s", got)
	}
	// A real one: started and finished, the load read on Linux.
	r := StartMachine()
	r.Finish()
	if r.CPUs < 1 || r.End.Before(r.Start) || r.GoVersion == "" {
		t.Errorf("StartMachine/Finish: %+v", r)
	}
}
