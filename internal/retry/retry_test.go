package retry

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

var fast = Policy{Initial: time.Millisecond, Multiplier: 2, Max: 4 * time.Millisecond}

func TestScheduleHasNoJitterAndResets(t *testing.T) {
	b := Policy{Initial: time.Millisecond, Multiplier: 2, Max: 5 * time.Millisecond}.Schedule()
	for round := range 2 {
		var got []time.Duration
		for range 5 {
			got = append(got, b.NextBackOff())
		}
		want := []time.Duration{time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, 5 * time.Millisecond, 5 * time.Millisecond}
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: schedule %v, want %v", round, got, want)
		}
		b.Reset()
	}
	if d := (Policy{}).WithDefaults(); d.Initial != 10*time.Millisecond || d.Multiplier != 2 || d.Max != 10*time.Second {
		t.Fatalf("defaults %+v, want 10ms ×2 10s (R4.3, R5.2)", d)
	}
}

func TestDoRetriesUntilSuccessAndNotifies(t *testing.T) {
	calls := 0
	var notified []int
	err := Do(context.Background(), fast, func(context.Context) error {
		calls++
		if calls < 4 {
			return errors.New("not yet")
		}
		return nil
	}, Notify(func(err error, attempt int, next time.Duration) {
		if next <= 0 || next > fast.Max {
			t.Errorf("attempt %d: next wait %v outside the policy", attempt, next)
		}
		notified = append(notified, attempt)
	}))
	if err != nil || calls != 4 {
		t.Fatalf("err %v after %d calls, want nil after 4", err, calls)
	}
	if !slices.Equal(notified, []int{1, 2, 3}) {
		t.Fatalf("notified after attempts %v, want [1 2 3]", notified)
	}
}

func TestDoStopsAtPermanentUnwrapped(t *testing.T) {
	want := errors.New("refused")
	calls := 0
	err := Do(context.Background(), fast, func(context.Context) error { calls++; return Permanent(want) })
	if err != want || calls != 1 {
		t.Fatalf("got %v after %d calls, want the permanent error itself after 1", err, calls)
	}
	if Permanent(nil) != nil {
		t.Fatal("Permanent(nil) is not nil")
	}
}

func TestDoReturnsLastErrorAndContextsWhenCancelled(t *testing.T) {
	last := errors.New("still failing")
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := Do(ctx, fast, func(context.Context) error {
		calls++
		if calls == 3 {
			cancel()
		}
		return last
	})
	if !errors.Is(err, last) || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want the last error joined with context.Canceled", err)
	}
}

func TestDoMaxTries(t *testing.T) {
	calls := 0
	err := Do(context.Background(), fast, func(context.Context) error { calls++; return errors.New("no") }, MaxTries(3))
	if err == nil || calls != 3 {
		t.Fatalf("err %v after %d calls, want an error after 3", err, calls)
	}
}
