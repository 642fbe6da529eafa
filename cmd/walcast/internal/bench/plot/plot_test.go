package plot

import (
	"bytes"
	"os"
	"testing"

	"github.com/walcast/walcast/cmd/walcast/internal/bench"
)

// TestWrite draws a curve with a log y axis (a point at 0 is left out, as
// a log axis cannot hold it) as a PNG and an SVG file.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	c := bench.Curve{Name: "c", Title: "t", XLabel: "x", YLabel: "y", LogY: true, Series: []bench.Series{
		{Name: "a", Points: []bench.Point{{X: 1, Y: 2}, {X: 10, Y: 3}, {X: 100, Y: 0}}},
		{Name: "b", Points: []bench.Point{{X: 1, Y: 20}, {X: 10, Y: 300}}},
	}}
	files, err := Write(dir, c)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Fatalf("files %v", files)
	}
	for f, magic := range map[string][]byte{files[0]: []byte("\x89PNG"), files[1]: []byte("<?xml")} {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(raw, magic) {
			t.Errorf("%s starts with %q", f, raw[:min(8, len(raw))])
		}
	}
}

// TestLogTicks labels a narrow axis between its powers of ten, and one
// too narrow for them (the memory curve's 216 to 265 B) as a linear one.
func TestLogTicks(t *testing.T) {
	for _, r := range [][2]float64{{1.5, 4}, {216, 265}, {0.2, 3000}} {
		labels := 0
		for _, tk := range (logTicks{}).Ticks(r[0], r[1]) {
			if tk.Value < r[0] || tk.Value > r[1] {
				t.Errorf("axis %v: tick %v outside it", r, tk.Value)
			}
			if tk.Label != "" {
				labels++
			}
		}
		if labels < 2 {
			t.Errorf("%d labels on an axis from %v to %v", labels, r[0], r[1])
		}
	}
}

// TestNumber labels round thousands and millions short.
func TestNumber(t *testing.T) {
	for v, want := range map[float64]string{1: "1", 2.5: "2.5", 1000: "1k", 16384: "16384", 16000: "16k", 1e6: "1M", 1.5e6: "1500k", 0.2: "0.2"} {
		if got := number(v); got != want {
			t.Errorf("number(%v) = %q, want %q", v, got, want)
		}
	}
}
