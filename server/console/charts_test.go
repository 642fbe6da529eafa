package console_test

import (
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/server/console"
)

// TestR9_9_TaskPageDrawsTimeline: a task's page draws its timeline from the
// times the broadcaster recorded: the lock wait, persisting the PENDING
// record, the copy's append and the wait for its ack, each callback attempt
// (a failed one red), and, once finished, the TOMBSTONE; a finished task
// keeps it.
func TestR9_9_TaskPageDrawsTimeline(t *testing.T) {
	f := newFixture(t, nil)
	_, body := f.get("/ui/tasks/" + itoa(f.id))
	steps := func(body string) map[string]string {
		out := map[string]string{}
		for _, m := range regexp.MustCompile(`<g class="span (\w+)" data-step="([^"]+)">`).FindAllStringSubmatch(body, -1) {
			out[m[2]] = m[1]
		}
		return out
	}
	if !strings.Contains(body, `<svg id="timeline"`) {
		t.Fatalf("the task page has no timeline:\n%s", body)
	}
	live := steps(body)
	for step, kind := range map[string]string{"lock wait": "lock", "persist": "persist", "append wal-1/a": "append",
		"ack wal-1/a": "ack"} {
		if live[step] != kind {
			t.Errorf("the live task's timeline has step %q as %q, want %q (steps %v)", step, live[step], kind, live)
		}
	}
	// The attempts fail, retried within milliseconds: the latest 16 show.
	if n := kinds(live)["failed"]; n == 0 || n > 16 || kinds(live)["callback"] != 0 {
		t.Errorf("the live task's timeline shows %v attempts, want only failed ones (steps %v)", kinds(live), live)
	}
	f.fail.Store(false)
	waitFor(t, "the task to finish", func() bool {
		ti, err := f.b.Task(f.id)
		return err == nil && ti.State == broadcast.Tombstone
	})
	_, body = f.get("/ui/tasks/" + itoa(f.id))
	done := steps(body)
	if done["tombstone"] != "tomb" || done["persist"] != "persist" || done["ack wal-1/a"] != "ack" || kinds(done)["callback"] != 1 || kinds(done)["failed"] == 0 {
		t.Errorf("the finished task's timeline lacks its steps (failed attempts, the one that succeeded, the TOMBSTONE): %v", done)
	}
	checkEscaped(t, "timeline", body)
}

// kinds counts a timeline's steps by kind.
func kinds(steps map[string]string) map[string]int {
	out := map[string]int{}
	for _, k := range steps {
		out[k]++
	}
	return out
}

// TestR9_9_OverviewChartsFromTheServersCounters: the overview draws small
// charts of throughput, mean latency and live tasks from the counters the
// server gives (Config.Counters), sampled every SampleEvery: rates over each
// interval, the queue as it is.
func TestR9_9_OverviewChartsFromTheServersCounters(t *testing.T) {
	var reads atomic.Int64
	f := newFixture(t, func(cfg *console.Config) {
		cfg.SampleEvery = 5 * time.Millisecond
		cfg.Counters = func() console.Counters {
			n := float64(reads.Add(1))
			// Each interval: 10 broadcasts, 2 finished in 1 s together.
			return console.Counters{Broadcasts: 10 * n, Finished: 2 * n, FinishedSeconds: n, Queue: 7}
		}
	})
	points := regexp.MustCompile(`id="chart-throughput-svg"[^>]*data-points="(\d+)"`)
	var body string
	waitFor(t, "two samples on the charts", func() bool {
		_, body = f.get("/ui/")
		m := points.FindStringSubmatch(body)
		return m != nil && m[1] != "0" && m[1] != "1"
	})
	section := func(id string) string {
		t.Helper()
		i := strings.Index(body, `<section class="card chart" id="`+id+`">`)
		if i < 0 {
			t.Fatalf("no %s on the overview:\n%s", id, body)
		}
		s := body[i:]
		return s[:strings.Index(s, "</section>")]
	}
	if s := section("chart-queue"); !strings.Contains(s, "<b>7</b> now") || !strings.Contains(s, "<polyline") {
		t.Errorf("the live tasks chart does not show 7 with a line:\n%s", s)
	}
	if s := section("chart-latency"); !strings.Contains(s, "<b>500ms</b> now") {
		t.Errorf("the latency chart does not show the mean of 500ms:\n%s", s)
	}
	if s := section("chart-throughput"); strings.Contains(s, "<b>0.0/s</b>") || !strings.Contains(s, "/s</b> now") {
		t.Errorf("the throughput chart does not show a rate:\n%s", s)
	}
}
