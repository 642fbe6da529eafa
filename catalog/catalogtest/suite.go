// Package catalogtest is the conformance suite every catalog.Catalog
// implementation passes: one set of tests, run against each backend.
package catalogtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/catalog"
)

// Backend is what the suite needs from an implementation under test.
type Backend interface {
	// Open returns a handle on a fresh, empty store (each call a new one).
	Open(t *testing.T) catalog.Catalog
	// Fence returns a handle on the same store as c at a newer leadership
	// term, after which c's Commits must fail with catalog.ErrFenced.
	Fence(t *testing.T, c catalog.Catalog) catalog.Catalog
	// Stop makes the store behind c unavailable (server stopped).
	Stop(t *testing.T, c catalog.Catalog)
}

// Run runs the suite.
func Run(t *testing.T, b Backend) {
	t.Run("CommitGetDelete", func(t *testing.T) { testCommitGetDelete(t, b) })
	t.Run("AtomicOnInvalid", func(t *testing.T) { testAtomicOnInvalid(t, b) })
	t.Run("Limits", func(t *testing.T) { testLimits(t, b) })
	t.Run("ListOrderPrefixPaging", func(t *testing.T) { testList(t, b) })
	t.Run("PageAfterAndLimit", func(t *testing.T) { testPage(t, b) })
	t.Run("Fencing", func(t *testing.T) { testFencing(t, b) })
	t.Run("StoppedBackend", func(t *testing.T) { testStopped(t, b) })
	t.Run("ConcurrentCommits", func(t *testing.T) { testConcurrent(t, b) })
	t.Run("GroupCommit", func(t *testing.T) { testGroup(t, b) })
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func mustGet(t *testing.T, c catalog.Catalog, key, want string) {
	t.Helper()
	v, err := c.Get(ctx(t), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	if string(v) != want {
		t.Fatalf("Get(%q) = %q, want %q", key, v, want)
	}
}

func mustMissing(t *testing.T, c catalog.Catalog, key string) {
	t.Helper()
	if _, err := c.Get(ctx(t), key); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("Get(%q) = %v, want ErrNotFound", key, err)
	}
}

func testCommitGetDelete(t *testing.T, b Backend) {
	c := b.Open(t)
	if err := c.Commit(ctx(t), catalog.Put("a", []byte("1")), catalog.Put("b", []byte("2"))); err != nil {
		t.Fatal(err)
	}
	mustGet(t, c, "a", "1")
	mustGet(t, c, "b", "2")
	if err := c.Commit(ctx(t), catalog.Put("a", []byte("3")), catalog.Delete("b"), catalog.Delete("never")); err != nil {
		t.Fatal(err)
	}
	mustGet(t, c, "a", "3")
	mustMissing(t, c, "b")
	if err := c.Commit(ctx(t), catalog.Put("empty", nil)); err != nil {
		t.Fatal(err)
	}
	mustGet(t, c, "empty", "")
}

func testAtomicOnInvalid(t *testing.T, b Backend) {
	c := b.Open(t)
	err := c.Commit(ctx(t), catalog.Put("x", []byte("1")), catalog.Put("x", []byte("2")))
	if !errors.Is(err, catalog.ErrInvalid) || !catalog.NotApplied(err) {
		t.Fatalf("duplicate keys: %v, want definite ErrInvalid", err)
	}
	mustMissing(t, c, "x")
	if err := c.Commit(ctx(t), catalog.Put("", []byte("1"))); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("empty key: %v", err)
	}
	if err := c.Commit(ctx(t)); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("no ops: %v", err)
	}
}

func testLimits(t *testing.T, b Backend) {
	c := b.Open(t)
	lim := c.Limits()
	if lim.MaxOps < 2 || lim.MaxBytes < 1024 {
		t.Fatalf("implausible limits %+v", lim)
	}
	ops := make([]catalog.Op, lim.MaxOps+1)
	for i := range ops {
		ops[i] = catalog.Put(fmt.Sprintf("lim/%05d", i), []byte("v"))
	}
	err := c.Commit(ctx(t), ops...)
	if !errors.Is(err, catalog.ErrTooLarge) || !catalog.NotApplied(err) {
		t.Fatalf("MaxOps+1: %v, want definite ErrTooLarge", err)
	}
	mustMissing(t, c, "lim/00000")
	if err := c.Commit(ctx(t), ops[:lim.MaxOps]...); err != nil {
		t.Fatalf("MaxOps ops: %v", err)
	}
	mustGet(t, c, fmt.Sprintf("lim/%05d", lim.MaxOps-1), "v")
	big := catalog.Put("big", make([]byte, lim.MaxBytes+1))
	if err := c.Commit(ctx(t), big); !errors.Is(err, catalog.ErrTooLarge) {
		t.Fatalf("MaxBytes+1: %v", err)
	}
}

func testList(t *testing.T, b Backend) {
	c := b.Open(t)
	const n = 2500 // more than any backend's page
	lim := c.Limits().MaxOps
	for start := 0; start < n; start += lim {
		var ops []catalog.Op
		for i := start; i < n && i < start+lim; i++ {
			ops = append(ops, catalog.Put(fmt.Sprintf("p/%06d", i), []byte(fmt.Sprint(i))))
		}
		if err := c.Commit(ctx(t), ops...); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Commit(ctx(t), catalog.Put("p0", []byte("outside")), catalog.Put("o/1", []byte("outside"))); err != nil {
		t.Fatal(err)
	}
	i := 0
	err := c.List(ctx(t), "p/", func(k string, v []byte) error {
		if want := fmt.Sprintf("p/%06d", i); k != want || string(v) != fmt.Sprint(i) {
			return fmt.Errorf("item %d: %q=%q", i, k, v)
		}
		i++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if i != n {
		t.Fatalf("listed %d keys, want %d", i, n)
	}
	stop := errors.New("stop")
	calls := 0
	if err := c.List(ctx(t), "p/", func(string, []byte) error { calls++; return stop }); !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("List did not stop on the callback's error: %v after %d calls", err, calls)
	}
	if err := c.List(ctx(t), "none/", func(string, []byte) error { return errors.New("called") }); err != nil {
		t.Fatal(err)
	}
}

// testPage pages through a prefix with catalog.Page (the backend's own
// Page, or the fallback on List): every key once, in order, each page at
// most its limit, more set exactly while keys follow, and nothing outside
// the prefix.
func testPage(t *testing.T, b Backend) {
	c := b.Open(t)
	if _, ok := c.(catalog.Pager); !ok {
		t.Logf("%T is no catalog.Pager: catalog.Page falls back to List", c)
	}
	var ops []catalog.Op
	for i := range 25 {
		ops = append(ops, catalog.Put(fmt.Sprintf("q/%03d", i), []byte(fmt.Sprint(i))))
	}
	ops = append(ops, catalog.Put("q", []byte("outside")), catalog.Put("q0", []byte("outside")), catalog.Put("r/0", []byte("outside")))
	if err := c.Commit(ctx(t), ops...); err != nil {
		t.Fatal(err)
	}
	for _, limit := range []int{1, 7, 25, 100} {
		var got []string
		after, pages := "", 0
		for {
			n := 0
			more, err := catalog.Page(ctx(t), c, "q/", after, limit, func(k string, v []byte) error {
				if want := fmt.Sprintf("q/%03s", v); k != want {
					return fmt.Errorf("%q holds %q", k, v)
				}
				got = append(got, k)
				n++
				return nil
			})
			if err != nil {
				t.Fatalf("limit %d, page %d: %v", limit, pages, err)
			}
			pages++
			if n > limit {
				t.Fatalf("limit %d: a page of %d keys", limit, n)
			}
			if more != (len(got) < 25) {
				t.Fatalf("limit %d: more=%v after %d of 25 keys", limit, more, len(got))
			}
			if !more {
				break
			}
			after = got[len(got)-1][len("q/"):]
		}
		for i, k := range got {
			if want := fmt.Sprintf("q/%03d", i); k != want {
				t.Fatalf("limit %d: key %d is %q, want %q (all: %v)", limit, i, k, want, got)
			}
		}
		if len(got) != 25 {
			t.Fatalf("limit %d: %d keys, want 25", limit, len(got))
		}
	}
	if _, err := catalog.Page(ctx(t), c, "q/", "", 0, func(string, []byte) error { return nil }); !errors.Is(err, catalog.ErrInvalid) {
		t.Fatalf("a page of 0 keys: %v, want ErrInvalid", err)
	}
	stop := errors.New("stop")
	if _, err := catalog.Page(ctx(t), c, "q/", "", 5, func(string, []byte) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("Page did not stop on the callback's error: %v", err)
	}
}

func testFencing(t *testing.T, b Backend) {
	old := b.Open(t)
	if err := old.Commit(ctx(t), catalog.Put("k", []byte("old"))); err != nil {
		t.Fatal(err)
	}
	cur := b.Fence(t, old)
	err := old.Commit(ctx(t), catalog.Put("k", []byte("zombie")))
	if !errors.Is(err, catalog.ErrFenced) || !catalog.NotApplied(err) {
		t.Fatalf("deposed handle's commit: %v, want definite ErrFenced", err)
	}
	mustGet(t, cur, "k", "old")
	if err := cur.Commit(ctx(t), catalog.Put("k", []byte("new"))); err != nil {
		t.Fatal(err)
	}
	mustGet(t, cur, "k", "new")
}

func testStopped(t *testing.T, b Backend) {
	c := b.Open(t)
	if err := c.Commit(ctx(t), catalog.Put("k", []byte("v"))); err != nil {
		t.Fatal(err)
	}
	b.Stop(t, c)
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := c.Commit(cctx, catalog.Put("k", []byte("w"))); err == nil {
		t.Fatal("commit on a stopped backend succeeded")
	}
	if _, err := c.Get(cctx, "k"); err == nil {
		t.Fatal("get on a stopped backend succeeded")
	}
	if time.Since(start) > 10*time.Second {
		t.Fatal("stopped backend hung past the context deadline")
	}
}

func testConcurrent(t *testing.T, b Backend) {
	c := b.Open(t)
	concurrently(t, 64, func(i int) error {
		return c.Commit(ctx(t), catalog.Put(fmt.Sprintf("c/%d/a", i), []byte("1")), catalog.Put(fmt.Sprintf("c/%d/b", i), []byte("2")))
	})
	if n := count(t, c, "c/"); n != 128 {
		t.Fatalf("%d keys after 64 concurrent 2-key commits", n)
	}
}

func testGroup(t *testing.T, b Backend) {
	c := b.Open(t)
	g := catalog.NewGroup(c, 0)
	defer g.Close()
	const callers = 200
	concurrently(t, callers, func(i int) error {
		// Half the callers write a shared key too: they must land in
		// separate transactions, and every caller's pair stays atomic.
		ops := []catalog.Op{catalog.Put(fmt.Sprintf("g/%03d", i), []byte("x"))}
		if i%2 == 0 {
			ops = append(ops, catalog.Put("g/shared", []byte(fmt.Sprint(i))))
		}
		return g.Commit(ctx(t), ops...)
	})
	if n := count(t, c, "g/"); n != callers+1 {
		t.Fatalf("%d keys, want %d", n, callers+1)
	}
	trips, commits := g.RoundTrips()
	if commits != callers || trips > commits {
		t.Fatalf("%d round trips for %d commits", trips, commits)
	}
	t.Logf("group commit: %d round trips for %d commits", trips, commits)
}

// concurrently runs fn(0) ... fn(n-1) at once and fails t with their
// errors.
func concurrently(t *testing.T, n int, fn func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			if err := fn(i); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// count is how many keys c holds under prefix.
func count(t *testing.T, c catalog.Catalog, prefix string) int {
	t.Helper()
	n := 0
	if err := c.List(ctx(t), prefix, func(string, []byte) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}
