package resource

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestR3_2_SharedCoexistExclusiveConflicts checks the compatibility matrix at
// the Locker level: two shared holders of one (domain, name) coexist;
// exclusive conflicts with shared and with exclusive on the same (domain,
// name), whether asked with Lock (blocks until its context ends) or TryLock
// (fails with ErrConflict); a different name or domain never conflicts.
func TestR3_2_SharedCoexistExclusiveConflicts(t *testing.T) {
	// blocked asserts that keys cannot be taken while the holder holds its
	// key: Lock waits until its short context ends, TryLock fails.
	blocked := func(t *testing.T, l *Locker, keys ...Key) {
		t.Helper()
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if g, err := l.Lock(ctx, keys...); !errors.Is(err, context.DeadlineExceeded) {
			g.Unlock() // a no-op unless it wrongly succeeded
			t.Fatalf("Lock(%v) = %v, want it blocked until the deadline", keys, err)
		}
		if d := time.Since(start); d < 20*time.Millisecond {
			t.Fatalf("Lock(%v) gave up after %v, before its deadline", keys, d)
		}
		if g, err := l.TryLock(keys...); !errors.Is(err, ErrConflict) {
			g.Unlock() // a no-op unless it wrongly succeeded
			t.Fatalf("TryLock(%v) = %v, want ErrConflict", keys, err)
		}
	}
	// free asserts that keys can be taken at once, by Lock and by TryLock,
	// and releases them again.
	free := func(t *testing.T, l *Locker, keys ...Key) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		g, err := l.Lock(ctx, keys...)
		if err != nil {
			t.Fatalf("Lock(%v) = %v, want it granted", keys, err)
		}
		g.Unlock()
		g, err = l.TryLock(keys...)
		if err != nil {
			t.Fatalf("TryLock(%v) = %v, want it granted", keys, err)
		}
		g.Unlock()
	}

	t.Run("shared+shared", func(t *testing.T) {
		l := NewLocker()
		g1, err := l.Lock(context.Background(), SharedDatabase("d"))
		if err != nil {
			t.Fatal(err)
		}
		g2, err := l.TryLock(SharedDatabase("d"))
		if err != nil {
			t.Fatalf("second shared TryLock: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		g3, err := l.Lock(ctx, SharedDatabase("d"))
		if err != nil {
			t.Fatalf("third shared Lock: %v", err)
		}
		snap := l.Snapshot()
		if len(snap) != 1 || len(snap[0].Holders) != 3 || len(snap[0].Waiters) != 0 {
			t.Fatalf("snapshot %+v, want three shared holders at once", snap)
		}
		for _, h := range snap[0].Holders {
			if h.Mode != Shared {
				t.Fatalf("holder %+v", h)
			}
		}
		// Exclusive conflicts with the shared holders until the last one
		// leaves.
		blocked(t, l, ExclusiveDatabase("d"))
		g1.Unlock()
		g2.Unlock()
		blocked(t, l, ExclusiveDatabase("d"))
		g3.Unlock()
		free(t, l, ExclusiveDatabase("d"))
		if l.Len() != 0 {
			t.Fatalf("table has %d entries", l.Len())
		}
	})

	for _, tc := range []struct {
		name string
		held Key
		ask  Key
	}{
		{"exclusive vs held shared", SharedCollection("db", "c"), ExclusiveCollection("db", "c")},
		{"shared vs held exclusive", ExclusiveCollection("db", "c"), SharedCollection("db", "c")},
		{"exclusive vs held exclusive", ExclusiveCollection("db", "c"), ExclusiveCollection("db", "c")},
		{"exclusive vs held exclusive, nameless domain", ExclusiveCluster(), ExclusiveCluster()},
		{"shared vs held exclusive, nameless domain", ExclusiveCluster(), SharedCluster()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLocker()
			g, err := l.Lock(context.Background(), tc.held)
			if err != nil {
				t.Fatal(err)
			}
			blocked(t, l, tc.ask)
			// Among other keys the conflicting one still blocks the whole
			// request, and TryLock takes nothing.
			blocked(t, l, ExclusiveDatabase("other"), tc.ask)
			if n := l.Len(); n != 1 {
				t.Fatalf("failed attempts left %d entries, want only the held key", n)
			}
			g.Unlock()
			free(t, l, tc.ask)
		})
	}

	t.Run("different name or domain never conflicts", func(t *testing.T) {
		l := NewLocker()
		held := []Key{ExclusiveCollection("db", "c"), ExclusiveDatabase("db"), ExclusiveSnapshot(7, "s")}
		g, err := l.Lock(context.Background(), held...)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Unlock()
		for _, k := range []Key{
			ExclusiveCollection("db", "c2"),                   // other name, same domain
			ExclusiveCollection("db2", "c"),                   // other database part of the name
			SharedCollection("db", "c2"),                      // shared, other name
			ExclusiveDatabase("db2"),                          // other name
			ExclusiveSnapshot(8, "s"),                         // other collection id
			ExclusiveSnapshot(7, "t"),                         // other snapshot name
			ExclusivePrivilege(),                              // other domain
			ExclusiveImportJob(1),                             // other domain
			{Domain: Database, Name: "db:c", Mode: Exclusive}, // the collection's name in another domain
		} {
			free(t, l, k)
		}
		// Every held key is still held.
		for _, k := range held {
			if _, err := l.TryLock(k); !errors.Is(err, ErrConflict) {
				t.Fatalf("TryLock(%v) = %v after unrelated lockers came and went", k, err)
			}
		}
	})
}
