package wait

import (
	"context"
	"testing"
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
