// Package waltest is the conformance suite every wal.Log implementation
// passes: one set of tests, run against each backend.
package waltest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// Backend is what the suite needs from an implementation under test.
type Backend interface {
	// Open returns a fresh, empty log with the given pchannels.
	Open(t *testing.T, pchannels ...message.PChannel) wal.Log
	// Stop makes the backend behind log unavailable (server stopped).
	Stop(t *testing.T, log wal.Log)
	// Dedups reports whether the backend answers a re-append of a dedup id
	// with the original offset.
	Dedups() bool
}

// Run runs the suite.
func Run(t *testing.T, b Backend) {
	t.Run("AppendReadOrder", func(t *testing.T) { testOrder(t, b) })
	t.Run("ReaderFollowsAppends", func(t *testing.T) { testFollow(t, b) })
	t.Run("Dedup", func(t *testing.T) { testDedup(t, b) })
	t.Run("Errors", func(t *testing.T) { testErrors(t, b) })
	t.Run("ConcurrentAppends", func(t *testing.T) { testConcurrent(t, b) })
	t.Run("PackedCopies", func(t *testing.T) { testPacked(t, b) })
	t.Run("StoppedBackend", func(t *testing.T) { testStopped(t, b) })
	t.Run("End", func(t *testing.T) { testEnd(t, b) })
}

// testEnd: for logs that tell where a pchannel ends, the end is above every
// entry's offset and at or below the next one's.
func testEnd(t *testing.T, b Backend) {
	log := b.Open(t, "p0")
	ctx := tctx(t)
	end, err := log.End(ctx, "p0")
	if err != nil || end != 0 {
		t.Fatalf("End of an empty pchannel: %d, %v", end, err)
	}
	var last uint64
	for i := range 3 {
		off, err := log.Append(ctx, "p0", fmt.Sprint("e", i), []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		last = off
	}
	end, err = log.End(ctx, "p0")
	if err != nil || end <= last {
		t.Fatalf("End %d after an entry at %d: %v", end, last, err)
	}
	next, err := log.Append(ctx, "p0", "after", []byte("y"))
	if err != nil || next < end {
		t.Fatalf("next entry at %d below End %d: %v", next, end, err)
	}
	if _, err := log.End(ctx, "nope"); !errors.Is(err, wal.ErrUnknownPChannel) {
		t.Fatalf("End of an unknown pchannel: %v", err)
	}
}

func tctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func testOrder(t *testing.T, b Backend) {
	log := b.Open(t, "p0", "p1")
	ctx := tctx(t)
	var offs []uint64
	for i := range 50 {
		off, err := log.Append(ctx, "p0", fmt.Sprint("a", i), []byte(fmt.Sprint("entry-", i)))
		if err != nil {
			t.Fatal(err)
		}
		if len(offs) > 0 && off <= offs[len(offs)-1] {
			t.Fatalf("offset %d after %d", off, offs[len(offs)-1])
		}
		offs = append(offs, off)
		if _, err := log.Append(ctx, "p1", fmt.Sprint("b", i), []byte("other")); err != nil {
			t.Fatal(err)
		}
	}
	check := func(from, first int) {
		cur, err := log.Read(ctx, "p0", offs[from])
		if err != nil {
			t.Fatal(err)
		}
		defer cur.Close()
		for i := first; i < 50; i++ {
			off, data, err := cur.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if off != offs[i] || string(data) != fmt.Sprint("entry-", i) {
				t.Fatalf("read (%d, %q), want (%d, entry-%d)", off, data, offs[i], i)
			}
		}
	}
	check(0, 0)
	check(10, 10)
}

func testFollow(t *testing.T, b Backend) {
	log := b.Open(t, "p0")
	ctx := tctx(t)
	cur, err := log.Read(ctx, "p0", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, _, err := cur.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next on an empty log: %v, want the context's error", err)
	}
	got := make(chan string, 1)
	waiting := NewAskedContext(ctx)
	go func() {
		_, data, err := cur.Next(waiting)
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(data)
	}()
	<-waiting.Asked() // Next waits for an entry
	if _, err := log.Append(ctx, "p0", "x", []byte("late")); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != "late" {
			t.Fatalf("reader got %q", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("reader did not see the append")
	}
}

func testDedup(t *testing.T, b Backend) {
	if !b.Dedups() {
		t.Skip("backend does not deduplicate appends")
	}
	log := b.Open(t, "p0")
	ctx := tctx(t)
	o1, err := log.Append(ctx, "p0", "same", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	o2, err := log.Append(ctx, "p0", "same", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	o3, err := log.Append(ctx, "p0", "other", []byte("y"))
	if err != nil {
		t.Fatal(err)
	}
	if o1 != o2 || o3 <= o1 {
		t.Fatalf("offsets %d %d %d: the re-append was not deduplicated", o1, o2, o3)
	}
	cur, err := log.Read(ctx, "p0", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	for _, want := range []string{"x", "y"} {
		_, data, err := cur.Next(ctx)
		if err != nil || string(data) != want {
			t.Fatalf("read %q, %v; want %q", data, err, want)
		}
	}
}

func testErrors(t *testing.T, b Backend) {
	log := b.Open(t, "p0")
	ctx := tctx(t)
	_, err := log.Append(ctx, "p0", "big", make([]byte, log.MaxEntryBytes()+1))
	if !errors.Is(err, wal.ErrTooLarge) || !errors.Is(err, wal.ErrNotApplied) {
		t.Fatalf("oversized entry: %v, want definite ErrTooLarge", err)
	}
	if _, err := log.Append(ctx, "nope", "x", []byte("x")); !errors.Is(err, wal.ErrUnknownPChannel) {
		t.Fatalf("unknown pchannel: %v", err)
	}
	long := strings.Repeat("d", wal.MaxDedupIDBytes+1)
	if _, err := log.Append(ctx, "p0", long, []byte("x")); !errors.Is(err, wal.ErrBadDedupID) || !errors.Is(err, wal.ErrNotApplied) {
		t.Fatalf("dedup id of %d bytes: %v, want definite ErrBadDedupID", len(long), err)
	}
	if _, err := log.Append(ctx, "p0", strings.Repeat("d", wal.MaxDedupIDBytes), []byte("x")); err != nil {
		t.Fatalf("dedup id of %d bytes: %v", wal.MaxDedupIDBytes, err)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := log.Append(ended, "p0", "y", []byte("y")); !errors.Is(err, context.Canceled) || !errors.Is(err, wal.ErrNotApplied) {
		t.Fatalf("append with an ended context: %v, want definite", err)
	}
	if end, err := log.End(ctx, "p0"); err != nil || end != 1 {
		t.Fatalf("End after one entry and refused appends: %d, %v", end, err)
	}
	if _, err := log.Read(ctx, "nope", 0); !errors.Is(err, wal.ErrUnknownPChannel) {
		t.Fatalf("read of unknown pchannel: %v", err)
	}
}

func testConcurrent(t *testing.T, b Backend) {
	log := b.Open(t, "p0")
	ctx := tctx(t)
	var mu sync.Mutex
	seen := map[uint64]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 25 {
				off, err := log.Append(ctx, "p0", fmt.Sprint(g, "-", i), []byte(fmt.Sprint(g, "-", i)))
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if seen[off] {
					errs <- fmt.Errorf("offset %d returned twice", off)
				}
				seen[off] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	cur, err := log.Read(ctx, "p0", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	var last uint64
	for i := range 200 {
		off, _, err := cur.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !seen[off] || i > 0 && off <= last {
			t.Fatalf("entry %d at offset %d (previous %d)", i, off, last)
		}
		last = off
	}
}

// testPacked drives the WAL layer over the backend: copies of two broadcasts
// in one entry, positions strictly increasing, reader filtering.
func testPacked(t *testing.T, b Backend) {
	w := wal.New(b.Open(t, "p0"))
	ctx := tctx(t)
	mk := func(id uint64, vs ...message.VChannel) wal.Item {
		m := &message.Message{Type: message.Type{Name: "T", Version: 1}, Payload: []byte{byte(id)},
			Broadcast: message.BroadcastHeader{ID: id, VChannels: vs, ResourceKeys: []resource.Key{resource.SharedCluster()}}}
		data, err := message.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return wal.Item{Message: data, VChannels: vs}
	}
	res1, err := w.Append(ctx, "p0", []wal.Item{mk(1, "p0/a", "p0/b"), mk(2, "p0/b")})
	if err != nil {
		t.Fatal(err)
	}
	res2, err := w.Append(ctx, "p0", []wal.Item{mk(3, "p0/a")})
	if err != nil {
		t.Fatal(err)
	}
	ticks := []uint64{res1[0][0].TimeTick, res1[0][1].TimeTick, res1[1][0].TimeTick, res2[0][0].TimeTick}
	for i := 1; i < len(ticks); i++ {
		if ticks[i] <= ticks[i-1] {
			t.Fatalf("time ticks not strictly increasing: %v", ticks)
		}
	}
	r, err := w.Read(ctx, "p0", 0, "p0/b")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, want := range []struct {
		id   uint64
		tick uint64
		last bool
	}{{1, ticks[1], false}, {2, ticks[2], true}} {
		c, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c.VChannel != "p0/b" || c.Message.Broadcast.ID != want.id || c.Checkpoint.TimeTick != want.tick || c.LastInEntry != want.last {
			t.Fatalf("copy %+v, want broadcast %d at %d (last %v)", c, want.id, want.tick, want.last)
		}
	}
	// The third entry has no copy for p0/b: the filtered reader waits.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := r.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("filtered reader returned %v", err)
	}
}

func testStopped(t *testing.T, b Backend) {
	log := b.Open(t, "p0")
	ctx := tctx(t)
	if _, err := log.Append(ctx, "p0", "x", []byte("x")); err != nil {
		t.Fatal(err)
	}
	b.Stop(t, log)
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := log.Append(sctx, "p0", "y", []byte("y")); err == nil {
		t.Fatal("append on a stopped backend succeeded")
	}
	if time.Since(start) > 10*time.Second {
		t.Fatal("append on a stopped backend hung")
	}
}

// AskedContext is a context that tells when it is first asked for its Done
// channel: a call that blocks on it (a cursor's Next waiting for an entry)
// has begun to wait. Tests act on a blocked call with it, not after a
// sleep.
type AskedContext struct {
	context.Context
	once  sync.Once
	asked chan struct{}
}

// NewAskedContext wraps ctx.
func NewAskedContext(ctx context.Context) *AskedContext {
	return &AskedContext{Context: ctx, asked: make(chan struct{})}
}

// Done returns the wrapped context's Done, telling Asked the first time.
func (c *AskedContext) Done() <-chan struct{} {
	c.once.Do(func() { close(c.asked) })
	return c.Context.Done()
}

// Asked is closed once Done was first called.
func (c *AskedContext) Asked() <-chan struct{} { return c.asked }
