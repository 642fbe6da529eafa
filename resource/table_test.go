package resource

import (
	"errors"
	"testing"
)

// Exact checks of the lock table's rules, with no goroutine and no timing.

func req(t *testing.T, tb *Table, keys ...Key) *Request {
	t.Helper()
	r, err := tb.NewRequest(keys)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestR3_5_WaitingExclusiveNotStarved: a waiting exclusive request is
// granted before shared requests that came after it, however many keep
// coming, and before them as soon as the shared holders ahead of it leave.
func TestR3_5_WaitingExclusiveNotStarved(t *testing.T) {
	var tb Table
	k := SharedCollection("db", "c")
	first := req(t, &tb, k)
	if !tb.Acquire(first) {
		t.Fatal("first shared not granted")
	}
	x := req(t, &tb, ExclusiveCollection("db", "c"))
	if tb.Acquire(x) {
		t.Fatal("exclusive granted beside a shared holder")
	}
	var later []*Request
	for range 100 {
		r := req(t, &tb, k)
		if tb.Acquire(r) {
			t.Fatal("a shared request overtook the waiting exclusive one")
		}
		later = append(later, r)
	}
	granted := tb.Release(first)
	if len(granted) != 1 || granted[0] != x {
		t.Fatalf("release granted %d requests, want the exclusive one alone", len(granted))
	}
	granted = tb.Release(x)
	if len(granted) != len(later) {
		t.Fatalf("exclusive's release granted %d shared, want %d", len(granted), len(later))
	}
}

// TestR3_5_TryAcquireFailsOnlyOnAHeldConflict: TryAcquire is not refused
// because a writer waits, only because a key is held in a conflicting mode.
func TestR3_5_TryAcquireFailsOnlyOnAHeldConflict(t *testing.T) {
	var tb Table
	holder := req(t, &tb, SharedDatabase("db"))
	tb.Acquire(holder)
	waiter := req(t, &tb, ExclusiveDatabase("db"))
	if tb.Acquire(waiter) {
		t.Fatal("exclusive granted beside a shared holder")
	}
	if err := tb.TryAcquire(req(t, &tb, SharedDatabase("db"))); err != nil {
		t.Fatalf("shared TryAcquire refused because a writer waits: %v", err)
	}
	err := tb.TryAcquire(req(t, &tb, ExclusiveDatabase("db")))
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("exclusive TryAcquire beside a holder: %v", err)
	}
	if tb.Holder(ExclusiveDatabase("db")) == "" {
		t.Fatal("no holder named for a conflicting key")
	}
}

// TestR13_15_ConflictErrorNamesKeyAndHolders: a refused try-acquire's
// error is a *ConflictError giving the key asked for and who holds it, so
// callers need not parse its text.
func TestR13_15_ConflictErrorNamesKeyAndHolders(t *testing.T) {
	var tb Table
	holder := req(t, &tb, SharedDatabase("db"))
	holder.Owner = "broadcast 7"
	tb.Acquire(holder)
	err := tb.TryAcquire(req(t, &tb, ExclusiveDatabase("db")))
	var ce *ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, ErrConflict) {
		t.Fatalf("got %v (%T), want a *ConflictError wrapping ErrConflict", err, err)
	}
	if ce.Key != ExclusiveDatabase("db") || ce.Holders != "broadcast 7@"+Shared.String() {
		t.Fatalf("conflict names %v held by %q", ce.Key, ce.Holders)
	}
}

// labelled is a Ref that names its request's owner when asked.
type labelled struct{ calls *int }

func (l labelled) LockOwner() string { *l.calls++; return "task 9" }

// TestR13_15_OwnerLabelledByItsRefWhenRead: a request with no Owner whose
// Ref is an OwnerLabeler is named by it in conflicts and snapshots, and only
// then (not when it acquires).
func TestR13_15_OwnerLabelledByItsRefWhenRead(t *testing.T) {
	var tb Table
	calls := 0
	holder := req(t, &tb, SharedDatabase("db"))
	holder.Ref = labelled{&calls}
	tb.Acquire(holder)
	if calls != 0 {
		t.Fatalf("the label was built %d times before anyone read it", calls)
	}
	var ce *ConflictError
	if err := tb.TryAcquire(req(t, &tb, ExclusiveDatabase("db"))); !errors.As(err, &ce) || ce.Holders != "task 9@"+Shared.String() {
		t.Fatalf("conflict: %v", err)
	}
	if ks := tb.Snapshot(); len(ks) != 1 || len(ks[0].Holders) != 1 || ks[0].Holders[0].Owner != "task 9" {
		t.Fatalf("snapshot %+v", ks)
	}
}

// TestR3_3_SameKeyTwiceIsOneKey: TryAcquire(k, k) and (Shared k,
// Exclusive k) succeed and hold the key once, exclusive for the second
// (R3.3: no self-deadlock).
func TestR3_3_SameKeyTwiceIsOneKey(t *testing.T) {
	var tb Table
	r := req(t, &tb, ExclusiveCollection("db", "c"), ExclusiveCollection("db", "c"))
	if err := tb.TryAcquire(r); err != nil {
		t.Fatal(err)
	}
	if len(r.Keys()) != 1 {
		t.Fatalf("keys %v, want one", r.Keys())
	}
	tb.Release(r)
	r = req(t, &tb, SharedCollection("db", "c"), ExclusiveCollection("db", "c"))
	if err := tb.TryAcquire(r); err != nil {
		t.Fatal(err)
	}
	if ks := r.Keys(); len(ks) != 1 || ks[0].Mode != Exclusive {
		t.Fatalf("keys %v, want one exclusive", ks)
	}
	if snap := tb.Snapshot(); len(snap) != 1 || len(snap[0].Holders) != 1 {
		t.Fatalf("table %+v, want one key with one holder", snap)
	}
}

// TestR3_3_OrderedAcquisitionNoDeadlock: two requests naming the same two
// keys in opposite orders queue behind each other without a cycle: the
// table acquires in the normalised order, so one waits on the first key
// while holding nothing the other needs.
func TestR3_3_OrderedAcquisitionNoDeadlock(t *testing.T) {
	var tb Table
	a := req(t, &tb, ExclusiveCollection("db", "a"), ExclusiveCollection("db", "b"))
	b := req(t, &tb, ExclusiveCollection("db", "b"), ExclusiveCollection("db", "a"))
	if !tb.Acquire(a) {
		t.Fatal("a not granted")
	}
	if tb.Acquire(b) {
		t.Fatal("b granted beside a")
	}
	if snap := tb.Snapshot(); len(snap) != 2 || len(snap[1].Holders) != 1 || len(snap[1].Waiters) != 0 {
		t.Fatalf("b holds or waits for the second key while waiting on the first: %+v", snap)
	}
	if g := tb.Release(a); len(g) != 1 || g[0] != b {
		t.Fatalf("a's release granted %v", g)
	}
}

// TestR13_7_ShrinkKeepsTheFirstKeysWithoutAGap: an owner gives back the
// shared Cluster key and keeps its business keys; a request waiting for the
// Cluster key exclusively is granted at once, one waiting for a kept key
// is not.
func TestR13_7_ShrinkKeepsTheFirstKeysWithoutAGap(t *testing.T) {
	var tb Table
	owner := req(t, &tb, ExclusiveCollection("db", "c"), SharedCluster())
	if !tb.Acquire(owner) {
		t.Fatal("owner not granted")
	}
	drop := req(t, &tb, ExclusiveCollection("db", "c"), SharedCluster())
	if tb.Acquire(drop) {
		t.Fatal("a conflicting request granted beside the owner")
	}
	topo := req(t, &tb, ExclusiveCluster())
	if tb.Acquire(topo) {
		t.Fatal("exclusive Cluster granted beside a shared holder")
	}
	granted := tb.Shrink(owner, 1)
	if len(granted) != 1 || granted[0] != topo {
		t.Fatalf("shrink granted %d requests, want the exclusive Cluster request", len(granted))
	}
	if !owner.Granted() || len(owner.Keys()) != 1 || owner.Keys()[0] != ExclusiveCollection("db", "c") {
		t.Fatalf("owner after shrink holds %v", owner.Keys())
	}
	if tb.Holder(ExclusiveCollection("db", "c")) == "" {
		t.Fatal("the kept key is free")
	}
	if len(tb.Release(topo)) != 0 {
		t.Fatal("the waiting request got the kept key")
	}
	if g := tb.Release(owner); len(g) != 1 || g[0] != drop {
		t.Fatalf("releasing the owner granted %d, want the waiting request", len(g))
	}
	if tb.Shrink(drop, 5) != nil || len(drop.Keys()) != 2 {
		t.Fatal("shrinking to more keys than held changed the request")
	}
}
