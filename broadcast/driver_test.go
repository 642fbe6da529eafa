package broadcast_test

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// goid is the id of the calling goroutine, from the first line of its stack
// ("goroutine 123 [running]:").
func goid(t testing.TB) uint64 {
	var buf [64]byte
	f := strings.Fields(string(buf[:runtime.Stack(buf[:], false)]))
	id, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		t.Errorf("goroutine id in %q: %v", f, err)
	}
	return id
}

// TestDriverKeepsAnUncontendedBroadcastOnOneWorker checks the driver's
// finish: a worker whose result finds the core free steps it itself and runs
// the next write or append on its own goroutine, so that an uncontended
// broadcast's PENDING write, append and TOMBSTONE write run on one worker
// (without it the append runs on an appends worker, never on the commits
// worker that wrote the PENDING record). A worker finds the core busy now
// and then (the loop holds it a moment after each wake-up), so the test asks
// it of most broadcasts, not of all.
func TestDriverKeepsAnUncontendedBroadcastOnOneWorker(t *testing.T) {
	e := newEnvLanes(t, 1)
	var mu sync.Mutex
	// The goroutine of each commit and append, in order; the append's
	// index.
	var trail []uint64
	appendAt := -1
	rec := func(isAppend bool) {
		id := goid(t)
		mu.Lock()
		if isAppend {
			appendAt = len(trail)
		}
		trail = append(trail, id)
		mu.Unlock()
	}
	b := e.open(func(c *broadcast.Config) {
		c.Catalog = hooked{Catalog: c.Catalog, commit: func(_ context.Context, _ []catalog.Op, next func() error) error {
			rec(false)
			return next()
		}}
		c.WAL = wal.New(hookedLog{Log: c.WAL.Log(), append: func(_ message.PChannel, next func() (uint64, error)) (uint64, error) {
			rec(true)
			return next()
		}}, wal.WithLanes(1, pchans))
	})
	ctx := ctxT(t, 20e9)
	m := msgOf(t, typPlain, "p", benchTargets)
	const rounds = 40
	one := 0
	for range rounds {
		mu.Lock()
		trail, appendAt = trail[:0], -1
		mu.Unlock()
		if _, err := do(ctx, b, m, resource.ExclusiveCollection("db", "c")); err != nil {
			t.Fatal(err)
		}
		waitIdle(t, b) // its TOMBSTONE is written
		mu.Lock()
		got, i := append([]uint64(nil), trail...), appendAt
		mu.Unlock()
		// The commit before the append is the PENDING record's (after the
		// id block's, when it takes one), the one after it the TOMBSTONE's.
		if i < 1 || i != len(got)-2 {
			t.Fatalf("commits and appends on goroutines %v, the append at %d: want PENDING, append, TOMBSTONE last", got, i)
		}
		if got[i-1] == got[i] && got[i] == got[i+1] {
			one++
		}
	}
	if one < rounds/2 {
		t.Fatalf("%d of %d uncontended broadcasts ran their PENDING write, append and TOMBSTONE on one goroutine, want most", one, rounds)
	}
	t.Logf("%d of %d on one goroutine", one, rounds)
}

// hookedAsync is an asynchronous catalog (a group commit) that calls
// queued with each write it is handed, on the goroutine that hands it.
type hookedAsync struct {
	*catalog.Group
	queued func()
}

func (h hookedAsync) CommitAsync(done catalog.Completion, ops ...catalog.Op) error {
	h.queued()
	return h.Group.CommitAsync(done, ops...)
}

// TestDriverStepsAnUncontendedSubmitOnTheCaller checks the driver's
// trySubmit: with no task in flight, a broadcast's Submit is stepped on its
// caller's goroutine, which hands the first write to the catalog itself,
// instead of waking the loop to do it. The loop holds the core a moment now
// and then (after a wake-up), so the test asks it of most broadcasts.
func TestDriverStepsAnUncontendedSubmitOnTheCaller(t *testing.T) {
	e := newEnvLanes(t, 1)
	var mu sync.Mutex
	var first uint64 // the goroutine that handed the catalog the round's first write
	b := e.open(func(c *broadcast.Config) {
		c.Catalog = hookedAsync{Group: e.group(c.Catalog), queued: func() {
			id := goid(t)
			mu.Lock()
			if first == 0 {
				first = id
			}
			mu.Unlock()
		}}
	})
	ctx := ctxT(t, 20e9)
	m := msgOf(t, typPlain, "p", benchTargets)
	caller := goid(t)
	const rounds = 40
	onCaller := 0
	for range rounds {
		waitIdle(t, b) // nothing in flight: the last TOMBSTONE is written
		mu.Lock()
		first = 0
		mu.Unlock()
		if _, err := do(ctx, b, m, resource.ExclusiveCollection("db", "c")); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		if first == caller {
			onCaller++
		}
		mu.Unlock()
	}
	if onCaller < rounds/2 {
		t.Fatalf("%d of %d uncontended broadcasts had their first write handed over on the caller's goroutine, want most", onCaller, rounds)
	}
	t.Logf("%d of %d on the caller's goroutine", onCaller, rounds)
}
