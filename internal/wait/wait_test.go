package wait

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestSleep(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) || !Sleep(context.Background(), 0) {
		t.Fatal("an uninterrupted sleep reported an interruption")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) || Sleep(ctx, 0) {
		t.Fatal("a cancelled sleep reported completion")
	}
}

func TestSafely(t *testing.T) {
	if err := Safely("callback", func() error { panic("boom") }); err == nil || err.Error() != "callback panicked: boom" {
		t.Fatalf("got %v", err)
	}
	if err := Safely("callback", func() error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// fakeT records a failure instead of ending the test.
type fakeT struct{ failed string }

func (*fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
}

func TestForWaitsForTheEvent(t *testing.T) {
	var n atomic.Int32
	go func() {
		for range 3 {
			n.Add(1)
		}
	}()
	var ft fakeT
	For(&ft, "three", func() bool { return n.Load() == 3 })
	if ft.failed != "" {
		t.Fatal(ft.failed)
	}
}

func TestForNilFailsWithTheLastError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ft fakeT
		ForNil(&ft, "the impossible", func() error { return errors.New("still no") })
		if ft.failed != "timed out waiting for the impossible: still no" {
			t.Fatalf("failure %q", ft.failed)
		}
	})
}
