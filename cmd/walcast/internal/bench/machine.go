package bench

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// Machine says where and when a run measured: on a shared machine a figure
// means little without the load beside it (SPEC §12's results are quoted
// with the load average of their run).
type Machine struct {
	Start, End time.Time
	CPUs       int
	GoVersion  string
	// Commit is the walcast commit the binary was built from (its VCS
	// stamp, "+dirty" when the tree had changes); "" when not stamped.
	Commit string
	// LoadStart and LoadEnd are the 1, 5 and 15 minute load averages at
	// the start and the end (Linux's /proc/loadavg); HasLoad is false
	// where they cannot be read.
	LoadStart, LoadEnd [3]float64
	HasLoad            bool
}

// StartMachine records the machine as a run starts; call Finish when it
// ends.
func StartMachine() *Machine {
	m := &Machine{Start: time.Now().UTC(), CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), Commit: commit()}
	m.LoadStart, m.HasLoad = loadAverage()
	return m
}

// Finish records the end of the run.
func (m *Machine) Finish() {
	m.End = time.Now().UTC()
	var ok bool
	m.LoadEnd, ok = loadAverage()
	m.HasLoad = m.HasLoad && ok
}

// String is one line for a results table: "2026-12-01 13:47:38-13:48:47
// UTC, 2 CPUs, load average 3.24 at the start, 5.29 at the end (1 min),
// go1.26.8, commit 16c687d".
func (m *Machine) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s-%s UTC, %d CPUs", m.Start.Format("2006-01-02 15:04:05"), m.End.Format("15:04:05"), m.CPUs)
	if m.HasLoad {
		fmt.Fprintf(&b, ", load average %.2f at the start, %.2f at the end (1 min)", m.LoadStart[0], m.LoadEnd[0])
	} else {
		b.WriteString(", load average unknown")
	}
	fmt.Fprintf(&b, ", %s", m.GoVersion)
	if m.Commit != "" {
		fmt.Fprintf(&b, ", commit %s", m.Commit)
	}
	return b.String()
}

// loadAverage reads the 1, 5 and 15 minute load averages.
func loadAverage() ([3]float64, bool) {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return [3]float64{}, false
	}
	return parseLoadAverage(string(raw))
}

// parseLoadAverage parses /proc/loadavg ("0.31 0.24 1.02 1/234 5678").
func parseLoadAverage(s string) ([3]float64, bool) {
	var out [3]float64
	f := strings.Fields(s)
	if len(f) < 3 {
		return out, false
	}
	for i := range out {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return [3]float64{}, false
		}
		out[i] = v
	}
	return out, true
}

// commit is the binary's VCS revision, shortened, "+dirty" if modified.
func commit() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev string
	var dirty bool
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if len(rev) > 7 {
		rev = rev[:7]
	}
	if rev != "" && dirty {
		rev += "+dirty"
	}
	return rev
}
