package resource

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestR3_4_NamedClusterKeyIsInvalid: the Cluster domain has exactly one key,
// the empty name. A named Cluster key is an invalid argument everywhere a
// key enters the package — New, Validate, Parse, Normalize, WithClusterKey
// and the Locker — so it can neither stand in for the implicit shared
// Cluster key nor be held beside the exclusive one.
func TestR3_4_NamedClusterKeyIsInvalid(t *testing.T) {
	for _, m := range []Mode{Shared, Exclusive} {
		named := Key{Domain: Cluster, Name: "foo", Mode: m}
		if _, err := New(Cluster, "foo", m); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("New(Cluster, foo, %v) = %v, want ErrInvalidKey", m, err)
		}
		if _, err := Parse(named.String()); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("Parse(%q) = %v, want ErrInvalidKey", named.String(), err)
		}
		if _, err := Normalize([]Key{SharedDatabase("db"), named}); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("Normalize with %v = %v, want ErrInvalidKey", named, err)
		}
		if got, err := WithClusterKey([]Key{named}); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("WithClusterKey(%v) = %v, %v; want ErrInvalidKey", named, got, err)
		}
		l := NewLocker()
		if g, err := l.TryLock(named); !errors.Is(err, ErrInvalidKey) {
			g.Unlock() // a no-op unless it wrongly succeeded
			t.Errorf("TryLock(%v) = %v, want ErrInvalidKey", named, err)
		}
		if g, err := l.Lock(context.Background(), named); !errors.Is(err, ErrInvalidKey) {
			g.Unlock() // a no-op unless it wrongly succeeded
			t.Errorf("Lock(%v) = %v, want ErrInvalidKey", named, err)
		}
		if l.Len() != 0 {
			t.Errorf("refused keys left %d table entries", l.Len())
		}
	}
	// The one Cluster key, in both modes, is valid.
	for _, s := range []string{"Cluster:@R", "Cluster:@X"} {
		if _, err := Parse(s); err != nil {
			t.Errorf("Parse(%q) = %v", s, err)
		}
	}
}

// TestR3_4_NothingRunsBesideExclusiveCluster holds the exclusive Cluster key
// (a force promote's barrier) and tries every way a broadcast could ask for
// keys: each key of each built-in domain in each mode, alone and combined,
// including named Cluster keys. Each request goes the broadcaster's way
// (WithClusterKey, then the Locker): it is either refused as invalid or
// conflicts with the barrier — TryLock fails with ErrConflict and Lock waits
// until its deadline. Nothing is ever granted while the barrier is held.
func TestR3_4_NothingRunsBesideExclusiveCluster(t *testing.T) {
	l := NewLocker()
	barrier, err := l.Lock(context.Background(), ExclusiveCluster())
	if err != nil {
		t.Fatal(err)
	}
	defer barrier.Unlock()

	var singles []Key
	for _, m := range []Mode{Shared, Exclusive} {
		singles = append(singles,
			Key{Domain: Collection, Name: "db:c", Mode: m},
			Key{Domain: Database, Name: "db", Mode: m},
			Key{Domain: Privilege, Name: "", Mode: m},
			Key{Domain: Snapshot, Name: "1:s", Mode: m},
			Key{Domain: ImportJob, Name: "7", Mode: m},
			Key{Domain: Cluster, Name: "", Mode: m},
			Key{Domain: Cluster, Name: "foo", Mode: m},
			Key{Domain: Cluster, Name: "\x00", Mode: m},
		)
	}
	requests := [][]Key{nil}
	for _, k := range singles {
		requests = append(requests, []Key{k})
		for _, o := range singles {
			requests = append(requests, []Key{k, o})
		}
	}
	for _, req := range requests {
		keys, err := WithClusterKey(req)
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("WithClusterKey(%v) = %v, want ErrInvalidKey or keys", req, err)
			}
			continue
		}
		if g, err := l.TryLock(keys...); !errors.Is(err, ErrConflict) {
			g.Unlock() // a no-op unless it wrongly succeeded
			t.Fatalf("TryLock(%v) beside the exclusive Cluster key = %v, want ErrConflict", keys, err)
		}
	}
	// Lock waits too: one blocking attempt per distinct shape is enough.
	for _, req := range [][]Key{nil, {ExclusiveDatabase("db")}, {{Domain: Cluster, Name: "", Mode: Shared}}} {
		keys, err := WithClusterKey(req)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		g, err := l.Lock(ctx, keys...)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			g.Unlock() // a no-op unless it wrongly succeeded
			t.Fatalf("Lock(%v) beside the exclusive Cluster key = %v, want it to wait until its deadline", keys, err)
		}
	}
	if n := l.Len(); n != 1 {
		t.Fatalf("%d table entries, want only the barrier's", n)
	}
}
