package kafka

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	"github.com/walcast/walcast/wal/waltest"
)

// TestR9_14_RecreatedTopicIsAnotherLog: a topic deleted and created again
// has another identity (its topic id) even once it has grown past an old
// position; a cursor open on the old topic never returns an entry of the
// new one; and a log with Recreate creates its vanished topic again on an
// append (which fails definitely) and says so, so that the next append
// works (franz-go alone refuses a recreated topic until it is purged).
func TestR9_14_RecreatedTopicIsAnotherLog(t *testing.T) {
	c := newCluster(t)
	p := message.PChannel("wal-0")
	var recreated atomic.Int32
	l := open(t, c, Config{PChannels: []message.PChannel{p}, ReplicationFactor: 1, Recreate: true,
		OnRecreated: func(got message.PChannel) {
			if got == p {
				recreated.Add(1)
			}
		}})
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

	waltest.DeleteTopic(t, c.ListenAddrs(), l.Topic(p))
	var appended int
	for appended < 5 {
		off, err := l.Append(ctx, p, "", []byte("new"))
		if err != nil {
			if !errors.Is(err, wal.ErrNotApplied) || ctx.Err() != nil {
				t.Fatalf("append after the deletion: %v, want a definite failure until the topic is back", err)
			}
			continue
		}
		if off != uint64(appended) {
			t.Fatalf("append %d to the recreated topic landed at %d", appended, off)
		}
		appended++
	}
	if recreated.Load() == 0 {
		t.Fatal("the vanished topic was created again without a word")
	}
	after, err := l.Identity(ctx, p)
	if err != nil || after == before || after == "" {
		t.Fatalf("identity after the recreation: %q (before %q), %v", after, before, err)
	}
	// franz-go stops consuming a topic whose id changed (it may say so,
	// or only stop): either way, nothing of the new topic.
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	for {
		off, data, err := cur.Next(rctx)
		if err == nil && string(data) != "old" {
			t.Fatalf("the cursor of the old topic read offset %d of the new one (%q)", off, data)
		}
		if errors.Is(err, wal.ErrLogReplaced) || rctx.Err() != nil {
			break
		}
	}
}
