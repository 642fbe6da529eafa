// Package clock is walcast's source of time: Now and timers behind one
// interface, real in production (Real) and moved by hand in tests (Manual).
// The broadcast engine's decision core reads no clock at all: its driver
// reads this one and passes the time in, and a simulator passes virtual
// time.
package clock

import (
	"sync"
	"time"
)

// Clock tells the time and makes timers.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a timer that fires once, d from now.
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer of a Clock.
type Timer interface {
	// C delivers the time when the timer fires.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it did.
	Stop() bool
	// Reset makes the timer fire d from now, stopping it first.
	Reset(d time.Duration)
}

// Real returns the wall clock.
func Real() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time   { return t.t.C }
func (t realTimer) Stop() bool            { return t.t.Stop() }
func (t realTimer) Reset(d time.Duration) { t.t.Reset(d) }

// Manual is a clock that moves only when told to (Add, Set): a test sets the
// time and the timers due fire. The zero value is not usable; use NewManual.
type Manual struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
}

// NewManual returns a manual clock at start.
func NewManual(start time.Time) *Manual { return &Manual{now: start} }

// Now returns the clock's time.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// Add moves the clock by d and fires the timers that are due.
func (m *Manual) Add(d time.Duration) { m.Set(m.Now().Add(d)) }

// Set moves the clock to t (backwards too: a clock jump) and fires the
// timers that are due.
func (m *Manual) Set(t time.Time) {
	m.mu.Lock()
	m.now = t
	var due []*manualTimer
	keep := m.timers[:0]
	for _, tm := range m.timers {
		if !tm.at.After(t) {
			due = append(due, tm)
		} else {
			keep = append(keep, tm)
		}
	}
	clear(m.timers[len(keep):])
	m.timers = keep
	m.mu.Unlock()
	for _, tm := range due {
		select {
		case tm.c <- t:
		default:
		}
	}
}

// NewTimer returns a timer that fires when the clock reaches d from now.
func (m *Manual) NewTimer(d time.Duration) Timer {
	tm := &manualTimer{m: m, c: make(chan time.Time, 1)}
	tm.Reset(d)
	return tm
}

type manualTimer struct {
	m  *Manual
	c  chan time.Time
	at time.Time
}

func (t *manualTimer) C() <-chan time.Time { return t.c }

func (t *manualTimer) Stop() bool {
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	for i, x := range t.m.timers {
		if x == t {
			t.m.timers = append(t.m.timers[:i], t.m.timers[i+1:]...)
			return true
		}
	}
	return false
}

func (t *manualTimer) Reset(d time.Duration) {
	t.Stop()
	t.m.mu.Lock()
	t.at = t.m.now.Add(d)
	fire := d <= 0
	if !fire {
		t.m.timers = append(t.m.timers, t)
	}
	now := t.m.now
	t.m.mu.Unlock()
	if fire {
		select {
		case t.c <- now:
		default:
		}
	}
}
