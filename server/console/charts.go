package console

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/walcast/walcast/broadcast"
)

// The pictures of the console: a task's timeline and the overview's small
// charts, drawn on the server as inline SVG (no script, no library; the
// Content-Security-Policy allows neither inline styles nor other origins,
// so they are styled by class from console.css).

// ---- a task's timeline

// span is one bar of a timeline: a step from Start to End (End zero: still
// running at the drawing's end).
type span struct {
	Label      string
	Kind       string // CSS class: lock, persist, append, ack, callback, failed, running, tomb
	Start, End time.Time
}

// timelineSpans turns a task's recorded times into bars: the lock wait,
// persisting the PENDING record, each copy's append and the wait for its
// ack, each callback attempt, and the TOMBSTONE write. Steps whose times
// were not seen here are left out.
func timelineSpans(t broadcast.TaskInfo) []span {
	tl := t.Timeline
	var out []span
	if !tl.LockAsked.IsZero() && (!tl.LockGranted.IsZero() || t.State != broadcast.Tombstone) {
		out = append(out, span{Label: "lock wait", Kind: "lock", Start: tl.LockAsked, End: tl.LockGranted})
	}
	if !tl.Created.IsZero() && (!tl.Persisted.IsZero() || t.Stage == "persisting") {
		out = append(out, span{Label: "persist", Kind: "persist", Start: tl.Created, End: tl.Persisted})
	}
	for i, v := range t.VChannels {
		if i >= len(tl.Appended) {
			break
		}
		app, ack := tl.Appended[i], tl.Acked[i]
		if !tl.Persisted.IsZero() && (!app.IsZero() || !v.Appended && t.State != broadcast.Tombstone) {
			out = append(out, span{Label: "append " + string(v.VChannel), Kind: "append", Start: tl.Persisted, End: app})
		}
		if !app.IsZero() && (!ack.IsZero() || !v.Acked && t.State != broadcast.Tombstone) {
			out = append(out, span{Label: "ack " + string(v.VChannel), Kind: "ack", Start: app, End: ack})
		}
	}
	// The TOMBSTONE is written after the last callback attempt, or, if
	// none was seen here, after the last ack.
	lastEnd := tl.Persisted
	for _, at := range tl.Acked {
		if at.After(lastEnd) {
			lastEnd = at
		}
	}
	for _, a := range tl.Attempts {
		kind := "callback"
		switch {
		case a.Err != "":
			kind = "failed"
		case a.Ended.IsZero():
			kind = "running" // drawn to the drawing's end
		}
		out = append(out, span{Label: "callback #" + strconv.Itoa(a.N), Kind: kind, Start: a.Started, End: a.Ended})
		lastEnd = a.Ended
	}
	if !tl.Tombstoned.IsZero() && !lastEnd.IsZero() {
		out = append(out, span{Label: "tombstone", Kind: "tomb", Start: lastEnd, End: tl.Tombstoned})
	}
	return out
}

// Geometry of the timeline, in SVG units (the SVG scales to its card).
const (
	tlWidth  = 900.0
	tlLabel  = 230.0 // the labels' column
	tlRow    = 22.0
	tlTop    = 24.0 // the axis
	tlRight  = 70.0 // room for the last bar's duration
	tlBarPad = 4.0
)

// timelineSVG draws a task's timeline, now being the end of running steps;
// "" if nothing was recorded.
func timelineSVG(t broadcast.TaskInfo, now time.Time) template.HTML {
	spans := timelineSpans(t)
	if len(spans) == 0 {
		return ""
	}
	start, end := spans[0].Start, spans[0].Start
	for i := range spans {
		if spans[i].End.IsZero() {
			spans[i].End = now
		}
		if spans[i].Start.Before(start) {
			start = spans[i].Start
		}
		if spans[i].End.After(end) {
			end = spans[i].End
		}
	}
	total := end.Sub(start)
	if total <= 0 {
		total = time.Millisecond
	}
	plot := tlWidth - tlLabel - tlRight
	x := func(at time.Time) float64 { return tlLabel + plot*float64(at.Sub(start))/float64(total) }
	h := tlTop + tlRow*float64(len(spans)) + 6
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="timeline" class="timeline" viewBox="0 0 %.0f %.0f" role="img" aria-label="timeline of the task">`, tlWidth, h)
	// The axis: 0 and the whole span, with a tick at the middle.
	fmt.Fprintf(&b, `<line class="axis" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, tlLabel, tlTop-4, tlLabel+plot, tlTop-4)
	for _, f := range []float64{0, 0.5, 1} {
		px := tlLabel + plot*f
		fmt.Fprintf(&b, `<line class="tick" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, px, tlTop-8, px, h)
		anchor := "middle"
		if f == 1 {
			anchor = "end"
		} else if f == 0 {
			anchor = "start"
		}
		fmt.Fprintf(&b, `<text class="tick-label" x="%.1f" y="%.1f" text-anchor="%s">+%s</text>`, px, tlTop-10, anchor,
			template.HTMLEscapeString(age(time.Duration(float64(total)*f))))
	}
	for i, s := range spans {
		y := tlTop + tlRow*float64(i)
		label := clean(s.Label)
		if r := []rune(label); len(r) > 34 {
			label = string(r[:33]) + "…"
		}
		fmt.Fprintf(&b, `<g class="span %s" data-step="%s"><title>%s: %s</title>`, s.Kind, template.HTMLEscapeString(clean(s.Label)),
			template.HTMLEscapeString(clean(s.Label)), template.HTMLEscapeString(age(s.End.Sub(s.Start))))
		fmt.Fprintf(&b, `<text class="label" x="%.1f" y="%.1f" text-anchor="end">%s</text>`, tlLabel-8, y+tlRow/2+4, template.HTMLEscapeString(label))
		x0, x1 := x(s.Start), x(s.End)
		w := math.Max(x1-x0, 2)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" rx="2"/>`, x0, y+tlBarPad, w, tlRow-2*tlBarPad)
		fmt.Fprintf(&b, `<text class="dur" x="%.1f" y="%.1f">%s</text>`, math.Min(x0+w+4, tlWidth-tlRight+4), y+tlRow/2+4,
			template.HTMLEscapeString(age(s.End.Sub(s.Start))))
		b.WriteString(`</g>`)
	}
	b.WriteString(`</svg>`)
	// Every string in it is escaped above; numbers are formatted.
	return template.HTML(b.String()) //nolint:gosec // built from escaped strings
}

// ---- the overview's charts

// Counters are the server's own counters the overview's charts are fed
// from (Config.Counters): cumulative counts and sums, and a gauge.
type Counters struct {
	// Broadcasts counts the broadcast tasks created; Finished and
	// FinishedSeconds the tasks whose TOMBSTONE is durable and the sum of
	// their creation-to-tombstone times.
	Broadcasts      float64
	Finished        float64
	FinishedSeconds float64
	// Queue is the number of live tasks now.
	Queue float64
}

// Chart sampling: a sample every Config.SampleEvery, the last chartPoints
// of them shown.
const (
	DefaultSampleEvery = 10 * time.Second
	chartPoints        = 60
)

// sample is the charts' values over one interval.
type sample struct {
	at         time.Time
	throughput float64 // broadcasts a second
	latency    float64 // mean creation-to-tombstone seconds; NaN if none finished
	queue      float64
}

// sampler keeps the charts' last samples.
type sampler struct {
	mu      sync.Mutex
	last    Counters
	lastAt  time.Time
	samples []sample
}

// add turns counters read at now into a sample (rates over the time since
// the last read). The first read only sets the base.
func (s *sampler) add(now time.Time, cur Counters) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastAt.IsZero() {
		s.last, s.lastAt = cur, now
		return
	}
	dt := now.Sub(s.lastAt).Seconds()
	if dt <= 0 {
		return
	}
	// A counter that went down was reset (a new broadcaster): its delta
	// is the new value.
	delta := func(a, b float64) float64 {
		if a < b {
			return a
		}
		return a - b
	}
	sm := sample{at: now, throughput: delta(cur.Broadcasts, s.last.Broadcasts) / dt, latency: math.NaN(), queue: cur.Queue}
	if n := delta(cur.Finished, s.last.Finished); n > 0 {
		sm.latency = delta(cur.FinishedSeconds, s.last.FinishedSeconds) / n
	}
	s.samples = append(s.samples, sm)
	if len(s.samples) > chartPoints {
		s.samples = s.samples[len(s.samples)-chartPoints:]
	}
	s.last, s.lastAt = cur, now
}

func (s *sampler) snapshot() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sample(nil), s.samples...)
}

// run samples c.cfg.Counters every SampleEvery until the console closes.
func (c *Console) runSampler() {
	tick := time.NewTicker(c.cfg.SampleEvery)
	defer tick.Stop()
	c.charts.add(c.cfg.Clock(), c.cfg.Counters())
	for {
		select {
		case <-c.done:
			return
		case <-tick.C:
			c.charts.add(c.cfg.Clock(), c.cfg.Counters())
		}
	}
}

// chart is one small chart of the overview.
type chart struct {
	ID, Title string
	// Now is the latest value in words, Max the largest shown.
	Now, Max string
	SVG      template.HTML
}

// Geometry of a small chart.
const (
	spWidth  = 300.0
	spHeight = 60.0
)

// charts draws the overview's charts from the samples; none before the
// second sample.
func (c *Console) overviewCharts() []chart {
	if c.cfg.Counters == nil {
		return nil
	}
	ss := c.charts.snapshot()
	if len(ss) == 0 {
		return nil
	}
	window := age(time.Duration(len(ss)) * c.cfg.SampleEvery)
	mk := func(id, title string, val func(sample) float64, unit func(float64) string) chart {
		vals := make([]float64, len(ss))
		maxV := 0.0
		for i, s := range ss {
			vals[i] = val(s)
			if !math.IsNaN(vals[i]) && vals[i] > maxV {
				maxV = vals[i]
			}
		}
		ch := chart{ID: id, Title: title + " (last " + window + ")", Now: "-", Max: unit(maxV)}
		if v := vals[len(vals)-1]; !math.IsNaN(v) {
			ch.Now = unit(v)
		}
		ch.SVG = sparkline(id, vals, maxV)
		return ch
	}
	perSec := func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) + "/s" }
	secs := func(v float64) string { return age(time.Duration(v * float64(time.Second))) }
	count := func(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }
	return []chart{
		mk("chart-throughput", "broadcasts a second", func(s sample) float64 { return s.throughput }, perSec),
		mk("chart-latency", "creation to tombstone, mean", func(s sample) float64 { return s.latency }, secs),
		mk("chart-queue", "live tasks", func(s sample) float64 { return s.queue }, count),
	}
}

// sparkline draws vals (NaN: no value) as a line over an area, scaled to
// maxV, the newest at the right edge of a chartPoints-wide frame.
func sparkline(id string, vals []float64, maxV float64) template.HTML {
	if maxV <= 0 {
		maxV = 1
	}
	step := spWidth / float64(chartPoints-1)
	x0 := spWidth - step*float64(len(vals)-1)
	y := func(v float64) float64 { return spHeight - 2 - (spHeight-4)*v/maxV }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="%s-svg" class="spark" viewBox="0 0 %.0f %.0f" preserveAspectRatio="none" role="img" data-points="%d">`,
		template.HTMLEscapeString(id), spWidth, spHeight, len(vals))
	fmt.Fprintf(&b, `<line class="base" x1="0" y1="%.1f" x2="%.0f" y2="%.1f"/>`, spHeight-1, spWidth, spHeight-1)
	var pts []string
	flush := func() {
		if len(pts) == 0 {
			return
		}
		if len(pts) == 1 {
			xy := strings.Split(pts[0], ",")
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="2"/>`, xy[0], xy[1])
		} else {
			fmt.Fprintf(&b, `<polyline points="%s"/>`, strings.Join(pts, " "))
		}
		pts = pts[:0]
	}
	for i, v := range vals {
		if math.IsNaN(v) {
			flush()
			continue
		}
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x0+step*float64(i), y(v)))
	}
	flush()
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // numbers and an escaped id only
}
