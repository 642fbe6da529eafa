package catalog

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// noReads gives a test's Catalog the reads it never makes: nothing is
// stored.
type noReads struct{}

func (noReads) Get(context.Context, string) ([]byte, error)                    { return nil, ErrNotFound }
func (noReads) List(context.Context, string, func(string, []byte) error) error { return nil }

// recorder is a Catalog that records each Commit's keys and holds the
// first until released.
type recorder struct {
	noReads
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

func (r *recorder) Limits() Limits { return r.lim }

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
	noReads
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

func (d *deadlines) Limits() Limits { return Limits{MaxOps: 128, MaxBytes: 1 << 20} }

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

// completion is a Completion that sends each answer it hears.
type completion chan error

func (c completion) Committed(err error) { c <- err }

// failing is a Catalog whose every Commit fails with err.
type failing struct {
	noReads
	err error
}

func (f failing) Commit(context.Context, ...Op) error { return f.err }
func (failing) Limits() Limits                        { return Limits{MaxOps: 4, MaxBytes: 100} }

// TestR4_9_CommitAsyncSharesTransactionsWithCommit: asynchronous and
// waiting Commits queued together share one transaction in arrival order,
// and each asynchronous one hears the transaction's answer exactly once;
// when the transaction fails, each hears that error.
func TestR4_9_CommitAsyncSharesTransactionsWithCommit(t *testing.T) {
	r := &recorder{lim: Limits{MaxOps: 8, MaxBytes: 100}, release: make(chan struct{}), held: make(chan struct{})}
	g := NewGroup(r, 0)
	ctx := context.Background()
	first := make(chan error, 1)
	go func() { first <- g.Commit(ctx, Put("first", nil)) }()
	<-r.held
	a, c := make(completion, 2), make(completion, 2)
	if err := g.CommitAsync(a, Put("a", nil)); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- g.Commit(ctx, Put("b", nil)) }()
	for {
		g.mu.Lock()
		l := len(g.queue)
		g.mu.Unlock()
		if l == 2 {
			break
		}
		runtime.Gosched()
	}
	if err := g.CommitAsync(c, Put("c", nil), Delete("d")); err != nil {
		t.Fatal(err)
	}
	close(r.release)
	for _, ch := range []chan error{first, waited, a, c} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"first", "a,b,c,d"}; !slices.Equal(r.txns, want) {
		t.Fatalf("transactions %q, want %q", r.txns, want)
	}
	if trips, commits := g.RoundTrips(); trips != 2 || commits != 4 {
		t.Fatalf("round trips %d for %d commits", trips, commits)
	}
	select {
	case err := <-a:
		t.Fatalf("a second answer: %v", err)
	case err := <-c:
		t.Fatalf("a second answer: %v", err)
	default:
	}

	boom := errors.New("boom")
	f := NewGroup(failing{err: boom}, 0)
	d := make(completion, 1)
	if err := f.CommitAsync(d, Put("x", nil)); err != nil {
		t.Fatal(err)
	}
	if err := <-d; !errors.Is(err, boom) {
		t.Fatalf("answer %v, want %v", err, boom)
	}
}

// TestCommitAsyncRefusesBadOpsAtOnce: ops Commit would refuse are refused
// by CommitAsync's return, with the same error, and never answered.
func TestCommitAsyncRefusesBadOpsAtOnce(t *testing.T) {
	g := NewGroup(failing{err: errors.New("never sent")}, 0)
	done := make(completion, 1)
	for _, tc := range []struct {
		name string
		ops  []Op
		want error
	}{
		{"no ops", nil, ErrInvalid},
		{"empty key", []Op{Put("", nil)}, ErrInvalid},
		{"duplicate key", []Op{Put("k", nil), Delete("k")}, ErrInvalid},
		{"too many ops", []Op{Put("a", nil), Put("b", nil), Put("c", nil), Put("d", nil), Put("e", nil)}, ErrTooLarge},
		{"too many bytes", []Op{Put("a", make([]byte, 200))}, ErrTooLarge},
	} {
		err := g.CommitAsync(done, tc.ops...)
		if !errors.Is(err, tc.want) || !NotApplied(err) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if werr := g.Commit(context.Background(), tc.ops...); werr == nil || werr.Error() != err.Error() {
			t.Errorf("%s: Commit says %v, CommitAsync %v", tc.name, werr, err)
		}
	}
	if trips, _ := g.RoundTrips(); trips != 0 {
		t.Fatalf("%d transactions sent", trips)
	}
	select {
	case err := <-done:
		t.Fatalf("a refused call was answered: %v", err)
	default:
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// senders is a Catalog that records the goroutine each Commit runs on.
type senders struct {
	noReads
	mu  sync.Mutex
	ids []string
}

func (s *senders) Commit(context.Context, ...Op) error {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)] // "goroutine 42 [running]:..."
	id, _, _ := strings.Cut(strings.TrimPrefix(string(buf), "goroutine "), " ")
	s.mu.Lock()
	s.ids = append(s.ids, id)
	s.mu.Unlock()
	return nil
}
func (*senders) Limits() Limits { return Limits{MaxOps: 8, MaxBytes: 100} }

// TestGroupFlusherServesSequentialCommits: one caller's Commits one after
// another, each within Linger of the last, are all sent by one flusher,
// whose stack the etcd client's calls have grown already; after Close the
// flusher exits without waiting out Linger.
func TestGroupFlusherServesSequentialCommits(t *testing.T) {
	s := &senders{}
	g := NewGroup(s, 0)
	g.lingerFor = time.Hour // only Close ends it
	done := make(completion, 1)
	for i := range 20 {
		var err error
		if i%2 == 0 {
			err = g.Commit(context.Background(), Put(fmt.Sprint("k", i), nil))
		} else if err = g.CommitAsync(done, Put(fmt.Sprint("k", i), nil)); err == nil {
			err = <-done
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	ids := slices.Compact(slices.Clone(s.ids))
	s.mu.Unlock()
	if len(ids) != 1 {
		t.Fatalf("20 sequential commits sent by %d goroutines (%v), want 1", len(ids), ids)
	}
	g.Close()
	goleak.VerifyNone(t) // the flusher exits now, not in an hour
	// Commits still work after Close, each flusher exiting once done.
	if err := g.Commit(context.Background(), Put("after", nil)); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t)
}

// TestGroupFlusherExitsAfterLinger: a flusher whose queue stayed empty for
// Linger exits, and a Commit racing its exit is still sent (by it or a new
// flusher): with a linger of a microsecond, concurrent callers hit that race
// again and again, and every one is answered.
func TestGroupFlusherExitsAfterLinger(t *testing.T) {
	s := &senders{}
	g := NewGroup(s, 0)
	g.lingerFor = time.Microsecond
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Go(func() {
			done := make(completion, 1)
			for i := range 2000 {
				var err error
				if i%2 == 0 {
					err = g.Commit(ctx, Put(fmt.Sprint(c, "/", i), nil))
				} else if err = g.CommitAsync(done, Put(fmt.Sprint(c, "/", i), nil)); err == nil {
					select {
					case err = <-done:
					case <-ctx.Done():
						err = fmt.Errorf("asynchronous commit %d of caller %d never answered: %w", i, c, ctx.Err())
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
				if i%64 == 0 {
					runtime.Gosched() // let the flusher find the queue empty
				}
			}
		})
	}
	wg.Wait()
	s.mu.Lock()
	n, flushers := len(s.ids), len(slices.Compact(slices.Clone(s.ids)))
	s.mu.Unlock()
	if n == 0 || flushers < 2 {
		t.Fatalf("%d transactions by %d flushers: the flusher never exited", n, flushers)
	}
	goleak.VerifyNone(t) // the last one exited by itself
}
