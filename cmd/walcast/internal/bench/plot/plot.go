// Package plot draws the growth curves of `walcast bench --sweep` as PNG
// and SVG files with gonum/plot (and the curves of `walcast bench --scale`). Only the bench command uses it, so that
// gonum/plot stays out of every other package.
package plot

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/walcast/walcast/cmd/walcast/internal/bench"
)

// Write draws c into dir as <name>.png and <name>.svg (dir is created if
// missing) and returns the files written. The x axis is logarithmic, as the
// sizes of a sweep grow by factors, unless c.LinearX; the y axis is if
// c.LogY.
func Write(dir string, c bench.Curve) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	p := plot.New()
	p.Title.Text = c.Title
	p.X.Label.Text = c.XLabel
	p.Y.Label.Text = c.YLabel
	if c.LinearX {
		p.X.Tick.Marker = plainTicks{}
	} else {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = logTicks{}
	}
	if c.LogY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = logTicks{}
	} else {
		p.Y.Tick.Marker = plainTicks{}
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	for i, s := range c.Series {
		xys := make(plotter.XYs, 0, len(s.Points))
		for _, pt := range s.Points {
			if !c.LinearX && pt.X <= 0 || c.LogY && pt.Y <= 0 {
				continue // a log axis has no place for it
			}
			xys = append(xys, plotter.XY{X: pt.X, Y: pt.Y})
		}
		if len(xys) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, fmt.Errorf("%s, %s: %w", c.Name, s.Name, err)
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i)
		pts.Color = plotutil.Color(i)
		pts.Shape = plotutil.Shape(i)
		p.Add(l, pts)
		p.Legend.Add(s.Name, l, pts)
	}
	var files []string
	for _, ext := range []string{".png", ".svg"} {
		f := filepath.Join(dir, c.Name+ext)
		if err := p.Save(8*vg.Inch, 5*vg.Inch, f); err != nil {
			return files, err
		}
		files = append(files, f)
	}
	return files, nil
}

// logTicks marks a log axis at 1, 2 and 5 times the powers of ten (more
// within less than a decade), all labelled when the axis spans at most
// three decades (gonum's LogTicks
// labels only powers of ten, so a narrow axis had no labels), otherwise
// the powers of ten labelled and the rest as minor ticks. An axis too
// narrow for two of those (216 to 265) gets a linear axis's ticks.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	if lo <= 0 || hi <= lo {
		return nil
	}
	decades := math.Log10(hi / lo)
	wide := decades > 3
	mults := []float64{1, 2, 5}
	if decades < 1 {
		mults = []float64{1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9}
	}
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		for _, m := range mults {
			v := m * math.Pow(10, e)
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if !wide || m == 1 {
				t.Label = number(v)
			}
			ticks = append(ticks, t)
		}
	}
	if len(ticks) < 2 {
		return plainTicks{}.Ticks(lo, hi)
	}
	return ticks
}

// plainTicks are gonum's default ticks of a linear axis, labelled as
// number does rather than with a fixed two decimals.
type plainTicks struct{}

func (plainTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = number(ticks[i].Value)
		}
	}
	return ticks
}

// number labels a tick: 1k, 16k, 1M for round thousands and millions,
// the shortest decimal form otherwise.
func number(v float64) string {
	switch {
	case v >= 1e6 && math.Mod(v, 1e6) == 0:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case v >= 1e3 && math.Mod(v, 1e3) == 0:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
