package resource

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/walcast/walcast/internal/cputime"
)

// TestKeySetLocksAsTheLocker: an interned set holds its keys normalised
// (R3.3: sorted, deduplicated, shared and exclusive of one key made
// exclusive), and its guards exclude the Locker's own Locks and TryLocks
// of the same keys, both ways.
func TestKeySetLocksAsTheLocker(t *testing.T) {
	l := NewLocker()
	ctx := context.Background()
	keys := []Key{SharedCluster(), SharedCollection("db", "c"), SharedDatabase("db"), ExclusiveCollection("db", "c")}
	s, err := l.Intern(keys...)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want, _ := Normalize(keys)
	if got := s.Keys(); !slices.Equal(got, want) {
		t.Fatalf("Keys = %v, want %v", got, want)
	}
	if n := l.Len(); n != 0 {
		t.Fatalf("an interned set that holds nothing shows %d entries in use", n)
	}
	g, err := s.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := g.Keys(); !slices.Equal(got, want) {
		t.Fatalf("guard Keys = %v, want %v", got, want)
	}
	if _, err := l.TryLock(SharedCollection("db", "c")); !errors.Is(err, ErrConflict) {
		t.Fatalf("TryLock of a key the set holds exclusively: %v, want ErrConflict", err)
	}
	if _, err := s.TryLock(); !errors.Is(err, ErrConflict) {
		t.Fatalf("a second TryLock of the set: %v, want ErrConflict", err)
	}
	g.Unlock()
	if n := l.Len(); n != 0 {
		t.Fatalf("after Unlock %d entries are in use", n)
	}
	// The other way round: the Locker's guard excludes the set.
	h, err := l.Lock(ctx, SharedDatabase("db"), ExclusiveCluster())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryLock(); !errors.Is(err, ErrConflict) {
		t.Fatalf("TryLock of the set while the Cluster key is held exclusively: %v, want ErrConflict", err)
	}
	done := make(chan error, 1)
	go func() {
		g, err := s.Lock(ctx)
		g.Unlock()
		done <- err
	}()
	waitFor(t, func() bool { return waiters(l, Collection, "db:c") == 1 || waiters(l, Cluster, "") == 1 })
	h.Unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := l.Len(); n != 0 {
		t.Fatalf("at the end %d entries are in use", n)
	}
}

// TestKeySetRejectsInvalidKeys: a set with an invalid key is refused with
// ErrInvalidKey, and the Locker is unchanged.
func TestKeySetRejectsInvalidKeys(t *testing.T) {
	l := NewLocker()
	for _, k := range []Key{{Domain: Collection, Name: "", Mode: Exclusive}, {Domain: Cluster, Name: "x", Mode: Shared}, {Domain: Database, Name: "a@b", Mode: Shared}} {
		if s, err := l.Intern(SharedDatabase("db"), k); !errors.Is(err, ErrInvalidKey) || s != nil {
			t.Errorf("Intern with %#v: %v, %v; want ErrInvalidKey", k, s, err)
		}
	}
	l.mu.Lock()
	entries := l.t.entries
	l.mu.Unlock()
	if entries != 0 {
		t.Fatalf("a refused set left %d entries", entries)
	}
}

// churn locks and unlocks n distinct keys one by one: past maxIdle idle
// entries, the table sweeps the idle ones.
func churn(t *testing.T, l *Locker, n int) {
	t.Helper()
	for i := range n {
		g, err := l.Lock(context.Background(), ExclusiveCollection("churn", fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		g.Unlock()
	}
}

// TestKeySetEntriesOutliveSweeps: the table sweeps idle entries, but not
// those an interned set points at, so the set's keys stay the table's
// keys: a guard of the set excludes the Locker's Lock of the same key.
// Once the set is closed they can be swept again.
func TestKeySetEntriesOutliveSweeps(t *testing.T) {
	l := NewLocker()
	s, err := l.Intern(ExclusiveCollection("db", "c"), SharedCluster())
	if err != nil {
		t.Fatal(err)
	}
	churn(t, l, 3*maxIdle)
	l.mu.Lock()
	same := l.t.domain(Collection)["db:c"] == s.ents[0] && !s.ents[0].gone
	l.mu.Unlock()
	if !same {
		t.Fatal("the sweep removed an interned set's entry: its Locks would look it up again")
	}
	g, err := s.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryLock(ExclusiveCollection("db", "c")); !errors.Is(err, ErrConflict) {
		t.Fatalf("TryLock of a key the set holds, after sweeps: %v, want ErrConflict", err)
	}
	g.Unlock()
	if n := l.Len(); n != 0 {
		t.Fatalf("%d entries in use with nothing held", n)
	}
	s.Close()
	s.Close() // a second Close does nothing
	churn(t, l, 3*maxIdle)
	l.mu.Lock()
	_, kept := l.t.domain(Collection)["db:c"]
	l.mu.Unlock()
	if kept {
		t.Fatal("a closed set's idle entry was never swept")
	}
	if _, err := s.Lock(context.Background()); !errors.Is(err, ErrKeySetClosed) {
		t.Fatalf("Lock after Close: %v, want ErrKeySetClosed", err)
	}
	if _, err := s.TryLock(); !errors.Is(err, ErrKeySetClosed) {
		t.Fatalf("TryLock after Close: %v, want ErrKeySetClosed", err)
	}
}

// TestKeySetClosedWhileALockWaits: a Lock of the set that waits when the
// set is closed goes on; its later keys' entries may be swept meanwhile,
// and it then acquires the table's current entries for them, not the
// swept ones: its keys stay exclusive against everyone else's.
func TestKeySetClosedWhileALockWaits(t *testing.T) {
	l := NewLocker()
	ctx := context.Background()
	s, err := l.Intern(ExclusiveCollection("db", "a"), ExclusiveCollection("db", "b"))
	if err != nil {
		t.Fatal(err)
	}
	h, err := l.Lock(ctx, ExclusiveCollection("db", "a"))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan Guard, 1)
	go func() {
		g, err := s.Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- g
	}()
	waitFor(t, func() bool { return waiters(l, Collection, "db:a") == 1 })
	s.Close()
	churn(t, l, 3*maxIdle) // sweeps "db:b", which nobody holds or pins now
	l.mu.Lock()
	_, kept := l.t.domain(Collection)["db:b"]
	l.mu.Unlock()
	if kept {
		t.Fatal("the test needs db:b swept")
	}
	h.Unlock()
	g := <-got
	if _, err := l.TryLock(ExclusiveCollection("db", "b")); !errors.Is(err, ErrConflict) {
		t.Fatalf("TryLock of a key the set's guard holds: %v, want ErrConflict", err)
	}
	g.Unlock()
	if n := l.Len(); n != 0 {
		t.Fatalf("%d entries in use with nothing held", n)
	}
}

// TestKeySetLockUnlockDoesNotAllocate: locking an interned set allocates
// nothing, as the Locker's own Lock of up to three keys.
func TestKeySetLockUnlockDoesNotAllocate(t *testing.T) {
	l := NewLocker()
	ctx := context.Background()
	s, err := l.Intern(ExclusiveCollection("db", "orders"), SharedDatabase("db"), SharedCluster(), ExclusiveImportJob(7))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if allocs := testing.AllocsPerRun(1000, func() {
		g, err := s.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		g.Unlock()
	}); allocs > 1 {
		// Four keys: the request's entry list does not fit its own array.
		t.Fatalf("Lock + Unlock of an interned set of 4 keys allocates %v times", allocs)
	}
	s3, err := l.Intern(ExclusiveCollection("db", "orders"), SharedDatabase("db"), SharedCluster())
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if allocs := testing.AllocsPerRun(1000, func() {
		g, err := s3.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		g.Unlock()
	}); allocs != 0 {
		t.Fatalf("Lock + Unlock of an interned set of 3 keys allocates %v times", allocs)
	}
}

// BenchmarkLockUnlock3KeysInterned is BenchmarkLockUnlock3Keys with the keys
// interned once (Locker.Intern): no validation, sort or lookup per Lock.
func BenchmarkLockUnlock3KeysInterned(b *testing.B) {
	l := NewLocker()
	ctx := context.Background()
	s, err := l.Intern(ExclusiveCollection("db", "orders"), SharedDatabase("db"), SharedCluster())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ReportAllocs()
	cpu := cputime.Process()
	for b.Loop() {
		g, err := s.Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		g.Unlock()
	}
	cputime.ReportPerOp(b, cpu, b.N)
}
