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

// deadlines is a Catalog that records how long each transaction's context
// had left when the transaction started.
type deadlines struct {
	mu   sync.Mutex
	left []time.Duration
	errs []error
}

func (d *deadlines) Commit(ctx context.Context, _ ...Op) error {
	dl, ok := ctx.Deadline()
	d.mu.Lock()
	defer d.mu.Unlock()
	if !ok {
		d.left = append(d.left, -1)
	} else {
		d.left = append(d.left, time.Until(dl))
	}
	d.errs = append(d.errs, ctx.Err())
	return nil
}

func (d *deadlines) Get(context.Context, string) ([]byte, error)                    { return nil, ErrNotFound }
func (d *deadlines) List(context.Context, string, func(string, []byte) error) error { return nil }
func (d *deadlines) Limits() Limits                                                 { return Limits{MaxOps: 128, MaxBytes: 1 << 20} }

// TestGroupBoundsEveryTransaction: every shared transaction gets a context
// that ends within the timeout and leaves it at least half of it (checked
// as a quarter, for a loaded machine), also when one context serves several
// transactions.
func TestGroupBoundsEveryTransaction(t *testing.T) {
	const timeout = 400 * time.Millisecond
	d := &deadlines{}
	g := NewGroup(d, timeout)
	end := time.Now().Add(timeout) // the commits below span more than half of it
	for i := 0; time.Now().Before(end); i++ {
		if err := g.Commit(context.Background(), Put(fmt.Sprint("k", i%4), nil)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(timeout / 20) // commits spread over time: the context is renewed
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, left := range d.left {
		if left < timeout/4 || left > timeout || d.errs[i] != nil {
			t.Fatalf("transaction %d: %v left (err %v), want between %v and %v", i, left, d.errs[i], timeout/2, timeout)
		}
	}
	if len(d.left) < 15 {
		t.Fatalf("%d transactions, want about 20", len(d.left))
	}
}
