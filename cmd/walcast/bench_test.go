package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/cmd/walcast/internal/bench"
)

// TestBenchProgressLines: bench's progress is JSON lines with duration
// strings under -o json, and plain lines (no terminal control codes) when
// stderr is not a terminal: one when a step begins, one every 10 s while it
// runs.
func TestBenchProgressLines(t *testing.T) {
	events := []bench.Event{
		{Kind: "note", Step: "B1 nats: starting a broadcaster"},
		{Kind: "begin", Step: "B2 nats: walcast, 64 clients for 2.5s", Remaining: 2500 * time.Millisecond},
		{Kind: "progress", Step: "B2 nats: walcast, 64 clients for 2.5s", Elapsed: 500 * time.Millisecond, Remaining: 2 * time.Second, Total: 3 * time.Second},
		{Kind: "progress", Step: "B2 nats: walcast, 64 clients for 2.5s", Elapsed: 11 * time.Second, Remaining: time.Second, Total: 14 * time.Second},
		{Kind: "end", Step: "B2 nats: walcast, 64 clients for 2.5s", Elapsed: 12 * time.Second, Total: 15 * time.Second},
	}

	var js bytes.Buffer
	emit := progressPrinter(&js, true)
	for _, e := range events {
		emit(e)
	}
	lines := strings.Split(strings.TrimSpace(js.String()), "\n")
	if len(lines) != len(events) {
		t.Fatalf("%d JSON lines for %d events:\n%s", len(lines), len(events), js.String())
	}
	for i, l := range lines {
		var got map[string]any
		if err := json.Unmarshal([]byte(l), &got); err != nil {
			t.Fatalf("line %d %q: %v", i, l, err)
		}
		e := events[i]
		want := map[string]any{"event": e.Kind, "step": e.Step, "elapsed": e.Elapsed.String(),
			"remaining": e.Remaining.String(), "total": e.Total.String()}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("line %d: %s = %v, want %v", i, k, got[k], v)
			}
		}
	}

	var plain bytes.Buffer
	emit = progressPrinter(&plain, false)
	for _, e := range events {
		emit(e)
	}
	want := "==> B1 nats: starting a broadcaster\n" +
		"==> B2 nats: walcast, 64 clients for 2.5s, ~2.5s left\n" +
		"    11s elapsed, ~1s left\n"
	if plain.String() != want {
		t.Errorf("plain progress:\n%q\nwant\n%q", plain.String(), want)
	}
}

// TestBenchMachineJSON: -o json says where a run measured: times in RFC
// 3339, the load averages as three numbers, or null where unknown.
func TestBenchMachineJSON(t *testing.T) {
	m := &bench.Machine{Start: time.Date(2026, 12, 1, 13, 47, 38, 0, time.UTC), End: time.Date(2026, 12, 1, 13, 48, 47, 0, time.UTC),
		CPUs: 2, GoVersion: "go1.26.8", Commit: "16c687d", LoadStart: [3]float64{3.24, 2.2, 1.67}, LoadEnd: [3]float64{5.29, 3, 2}, HasLoad: true}
	raw, err := json.Marshal(machineObject(m))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"commit":"16c687d","cpus":2,"end":"2026-12-01T13:48:47Z","go":"go1.26.8","load_average_end":[5.29,3,2],` +
		`"load_average_start":[3.24,2.2,1.67],"start":"2026-12-01T13:47:38Z"}`
	if string(raw) != want {
		t.Errorf("got  %s\nwant %s", raw, want)
	}
	m.HasLoad = false
	raw, _ = json.Marshal(machineObject(m))
	if !strings.Contains(string(raw), `"load_average_end":null`) || !strings.Contains(string(raw), `"load_average_start":null`) {
		t.Errorf("unknown load: %s", raw)
	}
}

// TestBenchProfiles: --profiles writes one CPU profile per step, numbered
// in the run's order and named after the step; a step inside another is
// part of the outer one's profile; stop ends a profile left open; the
// events still reach the printer.
func TestBenchProfiles(t *testing.T) {
	dir := t.TempDir()
	var seen []string
	progress, stop := profileSteps(dir, func(e bench.Event) { seen = append(seen, e.Kind) }, io.Discard)
	for _, e := range []bench.Event{
		{Kind: "begin", Step: "B1 nats: 200 sequential broadcasts"},
		{Kind: "begin", Step: "inner"},
		{Kind: "end", Step: "inner"},
		{Kind: "end", Step: "B1 nats: 200 sequential broadcasts"},
		{Kind: "note", Step: "B2 nats: starting a broadcaster"},
		{Kind: "begin", Step: "B2 nats: walcast, 64 clients for 2.5s (phase 1 of 4)"},
	} {
		progress(e)
	}
	stop()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		if info, err := e.Info(); err != nil || info.Size() == 0 {
			t.Errorf("%s: empty (%v)", e.Name(), err)
		}
	}
	want := []string{"01-b1-nats-200-sequential-broadcasts.pprof", "02-b2-nats-walcast-64-clients-for-2.5s-phase-1-of-4.pprof"}
	if !slices.Equal(names, want) {
		t.Errorf("profiles %v, want %v", names, want)
	}
	if len(seen) != 6 {
		t.Errorf("the printer saw %v", seen)
	}
}
