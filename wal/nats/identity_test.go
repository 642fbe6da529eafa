package nats

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	"github.com/walcast/walcast/wal/waltest"
)

// TestR9_14_RecreatedStreamIsAnotherLog: a stream deleted and created again
// has another identity even once it has grown past an old position; a
// cursor open on the old stream fails with wal.ErrLogReplaced rather than
// read on in the new one; and a log with Recreate creates its vanished
// stream again on an append (which fails definitely, written nowhere) and
// says so, so that the next append works.
func TestR9_14_RecreatedStreamIsAnotherLog(t *testing.T) {
	srv := startServer(t, embednats.Config{})
	var recreated atomic.Int32
	p := message.PChannel("wal-0")
	l, err := New(tctx(t), Config{URL: srv.ClientURL(), PChannels: []message.PChannel{p}, Recreate: true,
		OnRecreated: func(got message.PChannel) {
			if got == p {
				recreated.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := tctx(t)
	for range 3 {
		if _, err := l.Append(ctx, p, "", []byte("old")); err != nil {
			t.Fatal(err)
		}
	}
	before, err := l.Identity(ctx, p)
	if err != nil || before == "" {
		t.Fatalf("identity: %q, %v", before, err)
	}
	if again, _ := l.Identity(ctx, p); again != before {
		t.Fatalf("identity changed without a recreation: %q, then %q", before, again)
	}
	cur, err := l.Read(ctx, p, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	if off, _, err := cur.Next(ctx); err != nil || off != 1 {
		t.Fatalf("first read: %d, %v", off, err)
	}
	if tc, ok := cur.(wal.Timed); !ok || time.Since(tc.Time()) > time.Minute {
		t.Fatalf("the cursor does not tell the entry's time: %v", ok)
	}

	waltest.DeleteStream(t, srv.ClientURL(), l.Stream(p))
	_, err = l.Append(ctx, p, "", []byte("lost"))
	if !errors.Is(err, wal.ErrNotApplied) || recreated.Load() != 1 {
		t.Fatalf("append to the vanished stream: %v (recreated %d times), want a definite failure and one recreation", err, recreated.Load())
	}
	for i := range 5 {
		off, err := l.Append(ctx, p, "", []byte("new"))
		if err != nil || off != uint64(i) {
			t.Fatalf("append %d to the recreated stream: offset %d, %v", i, off, err)
		}
	}
	after, err := l.Identity(ctx, p)
	if err != nil || after == before || after == "" {
		t.Fatalf("identity after the recreation: %q (before %q), %v", after, before, err)
	}
	// The old cursor stood at offset 2, which the new stream has passed:
	// it may still return the old entries it had fetched, never a new one.
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for {
		off, data, err := cur.Next(rctx)
		if errors.Is(err, wal.ErrLogReplaced) {
			break
		}
		if err == nil && string(data) != "old" {
			t.Fatalf("the cursor of the old stream read offset %d of the new one (%q)", off, data)
		}
		if rctx.Err() != nil {
			t.Fatalf("the cursor never reported the replaced stream: %v", err)
		}
	}
	if recreated.Load() != 1 {
		t.Fatalf("%d recreations, want 1", recreated.Load())
	}
}
