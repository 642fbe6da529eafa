package broadcast_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// TestR7_5_KeysPageInIDOrderAcrossChanges: Keys lists the originals of the
// index, live and tombstoned, by broadcast id, a page at a time from a
// cursor; broadcasts without a key never appear, and neither do
// duplicates. A walk sees every original that exists throughout exactly
// once, also one listed live that finishes before the walk ends, while new
// keys are taken between pages; each is reported as Lookup reports it.
func TestR7_5_KeysPageInIDOrderAcrossChanges(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 20*time.Second)
	release := make(chan struct{})
	e.mu.Lock()
	e.block[1] = release // the first broadcast's callback waits: it stays live
	e.mu.Unlock()
	targets := []message.VChannel{vch(1, "a")}
	live := message.ClusterKey("live")
	liveDone := make(chan error, 1)
	go func() {
		_, err := keyed(ctx, b, typCreate, live, "p", targets, resource.ExclusiveDatabase("live"))
		liveDone <- err
	}()
	waitFor(t, "the live original's callback", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.attempts[1] == 1
	})
	want := map[uint64]message.IdempotencyKey{1: live}
	n := 0
	add := func() {
		n++
		k := message.ClusterKey(fmt.Sprint("k", n))
		r, err := keyed(ctx, b, typCreate, k, "p", targets, resource.ExclusiveDatabase(fmt.Sprint("db", n)))
		if err != nil {
			t.Fatal(err)
		}
		want[r.BroadcastID] = k
		// A duplicate and a broadcast without a key add no entry.
		if _, err := keyed(ctx, b, typCreate, k, "p", targets, resource.ExclusiveDatabase(fmt.Sprint("db", n))); err != nil {
			t.Fatal(err)
		}
		if _, err := do(ctx, b, msgOf(t, typCreate, "p", targets), resource.ExclusiveDatabase(fmt.Sprint("plain", n))); err != nil {
			t.Fatal(err)
		}
	}
	for range 10 {
		add()
	}
	before := len(want)
	existing := make(map[uint64]message.IdempotencyKey, len(want))
	for id, k := range want {
		existing[id] = k
	}
	seen := map[uint64]int{}
	var after, last uint64
	for pages := 0; ; pages++ {
		keys, next, err := b.Keys(ctx, after, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) > 3 {
			t.Fatalf("page of %d keys, limit 3", len(keys))
		}
		for _, ks := range keys {
			if ks.BroadcastID <= last {
				t.Fatalf("key of broadcast %d after %d: not in id order", ks.BroadcastID, last)
			}
			last = ks.BroadcastID
			seen[ks.BroadcastID]++
			k, ok := want[ks.BroadcastID]
			if !ok {
				t.Fatalf("broadcast %d listed: it has no key of its own (a plain broadcast or a duplicate)", ks.BroadcastID)
			}
			if ks.Message.IdempotencyKey != k || ks.Message.Type != typCreate {
				t.Fatalf("broadcast %d listed with %s %q, want %q", ks.BroadcastID, ks.Message.Type, ks.Message.IdempotencyKey, k)
			}
			lk, err := b.Lookup(ctx, typCreate, k)
			if err != nil || lk.BroadcastID != ks.BroadcastID {
				t.Fatalf("lookup of %q: %+v, %v", k, lk, err)
			}
			switch {
			case ks.BroadcastID == 1 && (ks.State != broadcast.Pending || ks.Window.CompletedAt != (time.Time{})):
				t.Fatalf("the running original listed %s, window %+v", ks.State, ks.Window)
			case ks.BroadcastID != 1 && (ks.State != broadcast.Tombstone || ks.Window.CompletedAt.IsZero()):
				t.Fatalf("finished original %d listed %s, window %+v", ks.BroadcastID, ks.State, ks.Window)
			}
		}
		if pages == 0 {
			// The live original finishes once listed: it must not come
			// again as a tombstone.
			close(release)
			if err := <-liveDone; err != nil {
				t.Fatal(err)
			}
		}
		if pages < 3 {
			add() // new keys between pages
		}
		if next == 0 {
			break
		}
		after = next
	}
	for id, k := range existing {
		if seen[id] != 1 {
			t.Errorf("original %d (%q) existed throughout, listed %d times", id, k, seen[id])
		}
	}
	if len(want) <= before {
		t.Fatal("no key was added during the walk")
	}
}

// TestR7_5_KeysPageStopsAtItsScanBudget: a page looks at a bounded number
// of tasks and tombstones, so that one among many broadcasts without keys
// holds fewer keys than asked for, or none, and its cursor goes on past
// what it looked at; the walk still lists every key once. A page size that
// is not positive is refused.
func TestR7_5_KeysPageStopsAtItsScanBudget(t *testing.T) {
	broadcast.SetKeysScanBudget(t, 4)
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 20*time.Second)
	targets := []message.VChannel{vch(1, "a")}
	var keyedIDs []uint64
	for i := range 12 {
		if i%6 == 5 {
			k := message.ClusterKey(fmt.Sprint("k", i))
			r, err := keyed(ctx, b, typCreate, k, "p", targets, resource.ExclusiveDatabase("db"))
			if err != nil {
				t.Fatal(err)
			}
			keyedIDs = append(keyedIDs, r.BroadcastID)
			continue
		}
		if _, err := do(ctx, b, msgOf(t, typCreate, "p", targets), resource.ExclusiveDatabase("db")); err != nil {
			t.Fatal(err)
		}
	}
	var got []uint64
	var after uint64
	empty := 0
	for pages := 0; ; pages++ {
		if pages > 12 {
			t.Fatalf("no end after %d pages: %v", pages, got)
		}
		keys, next, err := b.Keys(ctx, after, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			empty++
		}
		for _, ks := range keys {
			got = append(got, ks.BroadcastID)
		}
		if next == 0 {
			break
		}
		if next <= after {
			t.Fatalf("cursor %d after %d: the walk does not advance", next, after)
		}
		after = next
	}
	if fmt.Sprint(got) != fmt.Sprint(keyedIDs) {
		t.Fatalf("keys %v, want %v", got, keyedIDs)
	}
	if empty == 0 {
		t.Fatal("no page stopped at its budget before finding a key")
	}
	if _, _, err := b.Keys(ctx, 0, 0); !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("limit 0: %v, want ErrInvalidArgument", err)
	}
}
