package retry

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// TestR6_5_OneRetryHelper keeps retry loops on this package: outside it,
// nothing builds its own exponential schedule or calls backoff.Retry, and
// only the loops that restart a long-running activity (allowed below, each
// for its reason) step a schedule by hand.
func TestR6_5_OneRetryHelper(t *testing.T) {
	// Files that may step a schedule by hand (NextBackOff), and why.
	supervisors := map[string]string{
		"node/channel.go":        "the WAL reader's reopen loop: backs off across read failures, reset after progress",
		"replicate/replicate.go": "a pchannel's run restarts after it broke",
		"server/coordinator.go":  "the coordinator's campaign restarts after a term ended",
		"wal/nats/read.go":       "a cursor's reopen backs off across its own calls",
		"client/client.go":       "the client: jittered backoff (many clients) that leader hints skip",
		"broadcast/config.go":    "builds the engine's schedule from retry.Policy",
	}
	own := []string{"client/client.go"} // may build its own (jittered) schedule
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		// The decision core (and its simulator) step retry.Policy's
		// schedules on virtual time: they cannot sleep.
		if strings.HasPrefix(rel, "internal/retry/") || strings.HasPrefix(rel, "broadcast/internal/sim/") || strings.HasPrefix(rel, "broadcast/internal/engine/") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		s := string(src)
		if strings.Contains(s, "backoff.Retry(") {
			t.Errorf("%s calls backoff.Retry: use retry.Do", rel)
		}
		if strings.Contains(s, "backoff.ExponentialBackOff{") && !slices.Contains(own, rel) {
			t.Errorf("%s builds its own exponential schedule: use retry.Policy", rel)
		}
		if strings.Contains(s, ".NextBackOff()") {
			if _, ok := supervisors[rel]; !ok {
				t.Errorf("%s steps a schedule by hand: retry one operation with retry.Do (or add it to the supervisor loops, with its reason)", rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDoFirstAttemptSucceedsWithoutAllocating: an operation that succeeds at
// once (a node's apply and ack of almost every copy) costs Do nothing but the
// call: the retry loop is set up only after a failure.
func TestDoFirstAttemptSucceedsWithoutAllocating(t *testing.T) {
	ctx := context.Background()
	op := func(context.Context) error { return nil }
	notify := Notify(func(error, int, time.Duration) { t.Error("notified of a success") })
	if n := testing.AllocsPerRun(100, func() { _ = Do(ctx, fast, op, notify, MaxTries(3)) }); n != 0 {
		t.Fatalf("%v allocations per successful first attempt, want 0", n)
	}
}
