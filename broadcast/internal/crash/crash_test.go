package crash

import (
	"context"
	"errors"
	"testing"

	"github.com/walcast/walcast/catalog"
	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// TestCrashStopsEveryCall: before the crash the wrappers pass every call
// through; after it, writes and reads of both fail with ErrCrashed, while
// the wrapped stores stay usable for the survivor.
func TestCrashStopsEveryCall(t *testing.T) {
	ctx := context.Background()
	inner := wmem.New("p")
	s := NewSwitch()
	var log wal.Log = &Log{Log: inner, S: s, Hook: func(message.PChannel, []byte) Action { return Pass }}
	cat := &Catalog{Catalog: cmem.New(), S: s}
	if _, err := log.Append(ctx, "p", "a", []byte("a")); err != nil {
		t.Fatal(err)
	}
	if end, err := log.End(ctx, "p"); err != nil || end != 1 {
		t.Fatalf("End before the crash: %d, %v", end, err)
	}
	cur, err := log.Read(ctx, "p", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	if err := cat.Commit(ctx, catalog.Put("k", []byte("v"))); err != nil {
		t.Fatal(err)
	}

	s.Crash()
	if _, err := log.Append(ctx, "p", "b", []byte("b")); !errors.Is(err, ErrCrashed) {
		t.Fatalf("Append after the crash: %v", err)
	}
	if _, err := log.End(ctx, "p"); !errors.Is(err, ErrCrashed) {
		t.Fatalf("End after the crash: %v", err)
	}
	if _, err := log.Read(ctx, "p", 0); !errors.Is(err, ErrCrashed) {
		t.Fatalf("Read after the crash: %v", err)
	}
	if err := cat.Commit(ctx, catalog.Put("k", []byte("w"))); !errors.Is(err, ErrCrashed) {
		t.Fatalf("Commit after the crash: %v", err)
	}
	if _, err := cat.Get(ctx, "k"); !errors.Is(err, ErrCrashed) {
		t.Fatalf("Get after the crash: %v", err)
	}
	if log.MaxEntryBytes() != inner.MaxEntryBytes() {
		t.Fatal("MaxEntryBytes does not pass through")
	}
	if err := log.Close(); err != nil {
		t.Fatal(err)
	}
	if end, err := inner.End(ctx, "p"); err != nil || end != 1 {
		t.Fatalf("the wrapped log after the crash: %d, %v", end, err)
	}
}
