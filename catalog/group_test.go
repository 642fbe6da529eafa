package catalog

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder is a Catalog that records each Commit's keys and holds the
// first until released.
type recorder struct {
	lim     Limits
	release chan struct{}
	held    chan struct{}
	once    sync.Once
	mu      sync.Mutex
	txns    []string
}

func (r *recorder) Commit(_ context.Context, ops ...Op) error {
	first := false
	r.once.Do(func() { first = true })
	if first {
		close(r.held)
		<-r.release
	}
	if err := Check(r.lim, ops); err != nil {
		return err
	}
	keys := make([]string, len(ops))
	for i, o := range ops {
		keys[i] = o.Key
	}
	r.mu.Lock()
	r.txns = append(r.txns, strings.Join(keys, ","))
	r.mu.Unlock()
	return nil
}

func (r *recorder) Get(context.Context, string) ([]byte, error)                    { return nil, ErrNotFound }
func (r *recorder) List(context.Context, string, func(string, []byte) error) error { return nil }
func (r *recorder) Limits() Limits                                                 { return r.lim }

// TestGroupTakesFittingPrefixes: while a transaction is in flight, queued
// Commits are joined in arrival order, up to the first that would exceed
// the limits or repeat a key.
func TestGroupTakesFittingPrefixes(t *testing.T) {
	r := &recorder{lim: Limits{MaxOps: 4, MaxBytes: 100}, release: make(chan struct{}), held: make(chan struct{})}
	g := NewGroup(r, 0)
	ctx := context.Background()
	errs := make(chan error, 8)
	commit := func(keys ...string) {
		ops := make([]Op, len(keys))
		for i, k := range keys {
			ops[i] = Put(k, []byte("v"))
		}
		go func() { errs <- g.Commit(ctx, ops...) }()
	}
	commit("first")
	<-r.held
	queued := func(n int) {
		for {
			g.mu.Lock()
			l := len(g.queue)
			g.mu.Unlock()
			if l == n {
				return
			}
			runtime.Gosched()
		}
	}
	// "a" again ends the second transaction, "f" would make a fifth op.
	for i, keys := range [][]string{{"a", "b"}, {"c"}, {"a"}, {"d", "e"}, {"f", "g", "h"}, {"i"}} {
		commit(keys...)
		queued(i + 1)
	}
	close(r.release)
	for range 7 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"first", "a,b,c", "a,d,e", "f,g,h,i"}
	if !slices.Equal(r.txns, want) {
		t.Fatalf("transactions %q, want %q", r.txns, want)
	}
	if trips, commits := g.RoundTrips(); trips != 4 || commits != 7 {
		t.Fatalf("round trips %d for %d commits", trips, commits)
	}
}

// deadlines is a Catalog that records when each transaction started and
// when its context ends.
type deadlines struct {
	mu     sync.Mutex
	starts []time.Time
	ends   []time.Time
	errs   []error
}

func (d *deadlines) Commit(ctx context.Context, _ ...Op) error {
	dl, _ := ctx.Deadline()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.starts = append(d.starts, time.Now())
	d.ends = append(d.ends, dl)
	d.errs = append(d.errs, ctx.Err())
	return nil
}

func (d *deadlines) Get(context.Context, string) ([]byte, error)                    { return nil, ErrNotFound }
func (d *deadlines) List(context.Context, string, func(string, []byte) error) error { return nil }
func (d *deadlines) Limits() Limits                                                 { return Limits{MaxOps: 128, MaxBytes: 1 << 20} }

// TestGroupBoundsEveryTransaction: every shared transaction gets a context
// that ends within the timeout and leaves it at least nine tenths of it,
// and one context serves several transactions in a row.
func TestGroupBoundsEveryTransaction(t *testing.T) {
	const timeout = time.Second
	const slack = 50 * time.Millisecond // a loaded machine between the check and the commit
	d := &deadlines{}
	g := NewGroup(d, timeout)
	for i := range 20 {
		if err := g.Commit(context.Background(), Put(fmt.Sprint("k", i%4), nil)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(timeout / 50) // commits spread over 0.4 s: the context is renewed on the way
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	distinct := map[time.Time]bool{}
	for i, end := range d.ends {
		left := end.Sub(d.starts[i])
		if end.IsZero() || left < timeout*9/10-slack || left > timeout || d.errs[i] != nil {
			t.Fatalf("transaction %d: %v left (err %v), want between %v and %v", i, left, d.errs[i], timeout*9/10, timeout)
		}
		distinct[end] = true
	}
	if len(distinct) >= len(d.ends) {
		t.Fatalf("%d transactions had %d contexts: none was shared", len(d.ends), len(distinct))
	}
}
