package bench

import (
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"
)

// Event tells what a run is doing: a step begins, progresses (about twice a
// second while it runs), or ends.
type Event struct {
	// Kind is "begin", "progress" or "end" for a step, "note" for a
	// moment without a duration of its own (setting up).
	Kind string `json:"event"`
	// Step says what runs ("B2 nats: walcast, 64 clients for 5s").
	Step string `json:"step"`
	// Elapsed is the step's time so far, Remaining an estimate of what it
	// has left (0: unknown), Total the run's time so far.
	Elapsed   time.Duration `json:"elapsed"`
	Remaining time.Duration `json:"remaining"`
	Total     time.Duration `json:"total"`
}

// MarshalJSON writes the durations as Go duration strings ("1.5s"), as
// walcast's machine output writes every duration (docs/cli.md).
func (e Event) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Kind      string `json:"event"`
		Step      string `json:"step"`
		Elapsed   string `json:"elapsed"`
		Remaining string `json:"remaining"`
		Total     string `json:"total"`
	}{e.Kind, e.Step, e.Elapsed.String(), e.Remaining.String(), e.Total.String()})
}

// progressEvery is how often a running step reports.
const progressEvery = 500 * time.Millisecond

// tracker turns steps into Events.
type tracker struct {
	emit  func(Event)
	start time.Time
}

func newTracker(emit func(Event)) *tracker {
	return &tracker{emit: emit, start: time.Now()}
}

// say reports a step with no duration of its own (setting up).
func (t *tracker) say(name string) {
	if t.emit != nil {
		t.emit(Event{Kind: "note", Step: name, Total: time.Since(t.start)})
	}
}

// step is one running step. Its remaining time comes from its expected
// duration (a timed phase) or from the share of its operations done (a
// counted one).
type step struct {
	t     *tracker
	name  string
	begin time.Time
	est   time.Duration
	total int64
	done  atomic.Int64
	stop  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
}

// timed begins a step expected to take d.
func (t *tracker) timed(name string, d time.Duration) *step { return t.begin(name, d, 0) }

// counted begins a step of n operations; call add as they complete.
func (t *tracker) counted(name string, n int) *step { return t.begin(name, 0, int64(n)) }

func (t *tracker) begin(name string, d time.Duration, n int64) *step {
	s := &step{t: t, name: name, begin: time.Now(), est: d, total: n, stop: make(chan struct{})}
	if t.emit == nil {
		return s
	}
	t.emit(Event{Kind: "begin", Step: name, Remaining: s.remaining(0), Total: time.Since(t.start)})
	s.wg.Go(func() {
		tick := time.NewTicker(progressEvery)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
				el := time.Since(s.begin)
				t.emit(Event{Kind: "progress", Step: name, Elapsed: el, Remaining: s.remaining(el), Total: time.Since(t.start)})
			}
		}
	})
	return s
}

// add counts n operations done.
func (s *step) add(n int) { s.done.Add(int64(n)) }

func (s *step) remaining(el time.Duration) time.Duration {
	switch {
	case s.est > 0:
		return max(s.est-el, 0)
	case s.total > 0:
		d := s.done.Load()
		if d == 0 {
			return 0
		}
		return time.Duration(float64(el) * float64(s.total-d) / float64(d))
	}
	return 0
}

// end ends the step; only the first call counts.
func (s *step) end() {
	s.once.Do(func() {
		close(s.stop)
		s.wg.Wait()
		if s.t.emit != nil {
			s.t.emit(Event{Kind: "end", Step: s.name, Elapsed: time.Since(s.begin), Total: time.Since(s.t.start)})
		}
	})
}
