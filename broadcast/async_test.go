package broadcast_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// asyncCatalog is a catalog.AsyncCommitter over a Group, as catalog/etcd
// is: it counts the commits of each kind handed over each way, and refuses
// CommitAsync for the kinds in refuse (a count each) with refuseErr.
type asyncCatalog struct {
	*catalog.Group
	mu        sync.Mutex
	waited    map[string]int
	handed    map[string]int
	refuse    map[string]int
	refuseErr error
}

func newAsyncCatalog(e *env, c catalog.Catalog) *asyncCatalog {
	return &asyncCatalog{Group: e.group(c), waited: map[string]int{}, handed: map[string]int{}, refuse: map[string]int{}}
}

func (a *asyncCatalog) Commit(ctx context.Context, ops ...catalog.Op) error {
	a.mu.Lock()
	a.waited[commitKind(ops)]++
	a.mu.Unlock()
	return a.Group.Commit(ctx, ops...)
}

func (a *asyncCatalog) CommitAsync(done catalog.Completion, ops ...catalog.Op) error {
	kind := commitKind(ops)
	a.mu.Lock()
	if a.refuse[kind] > 0 {
		a.refuse[kind]--
		a.mu.Unlock()
		return a.refuseErr
	}
	a.handed[kind]++
	a.mu.Unlock()
	return a.Group.CommitAsync(done, ops...)
}

func (a *asyncCatalog) counts() (waited, handed map[string]int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.waited), maps.Clone(a.handed)
}

// TestR4_9_WritesGoToAnAsyncCatalogWithoutWaiting: on a catalog that
// commits asynchronously, every PENDING and TOMBSTONE is handed over
// without a goroutine waiting for it; concurrent broadcasts, with a
// callback and without, all complete with their effects applied once.
func TestR4_9_WritesGoToAnAsyncCatalogWithoutWaiting(t *testing.T) {
	e := newEnv(t)
	var ac *asyncCatalog
	b := e.open(func(c *broadcast.Config) { ac = newAsyncCatalog(e, c.Catalog); c.Catalog = ac })
	ctx := ctxT(t, 10*time.Second)
	const n = 16
	var mu sync.Mutex
	persisted := map[uint64][]message.VChannel{}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			typ, targets := typCreate, []message.VChannel{vch(i%4, fmt.Sprint("a", i)), vch((i+1)%4, fmt.Sprint("b", i))}
			if i%2 == 1 {
				typ = typPlain
			}
			res, err := do(ctx, b, msgOf(t, typ, fmt.Sprint("p", i), targets), resource.ExclusiveCollection("db", fmt.Sprint("c", i)))
			if err != nil {
				errs <- err
				return
			}
			if typ == typCreate {
				mu.Lock()
				persisted[res.BroadcastID] = targets
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	e.checkInvariants(b, persisted)
	waited, handed := ac.counts()
	if handed["pending"] != n || handed["tombstone"] != n {
		t.Fatalf("handed over %v, want %d PENDING and %d TOMBSTONE", handed, n, n)
	}
	if waited["pending"]+waited["tombstone"] != 0 {
		t.Fatalf("waited for %v: a worker committed a task record", waited)
	}
}

// TestR4_7_RefusedHandOverMeansNotCreated: a PENDING the async catalog
// refuses before queueing it (closed) wrote nothing: the caller hears
// "task not created", the keys are free, and the next broadcast goes
// through. A refused TOMBSTONE is retried until it is written.
func TestR4_7_RefusedHandOverMeansNotCreated(t *testing.T) {
	e := newEnv(t)
	var ac *asyncCatalog
	b := e.open(func(c *broadcast.Config) { ac = newAsyncCatalog(e, c.Catalog); c.Catalog = ac })
	ac.refuseErr = catalog.ErrClosed
	ac.mu.Lock()
	ac.refuse["pending"], ac.refuse["tombstone"] = 1, 2
	ac.mu.Unlock()
	ctx := ctxT(t, 10*time.Second)
	key := resource.ExclusiveCollection("db", "c")
	targets := []message.VChannel{vch(1, "a")}
	_, err := do(ctx, b, msgOf(t, typCreate, "p", targets), key)
	if !broadcast.IsTaskNotCreated(err) || !errors.Is(err, catalog.ErrClosed) {
		t.Fatalf("broadcast on a refused hand-over: %v, want task not created", err)
	}
	if st := b.Stats(); st.Live != 0 || st.Broadcasts != 0 {
		t.Fatalf("stats %+v after a task that was not created", st)
	}
	res, err := do(ctx, b, msgOf(t, typCreate, "p", targets), key)
	if err != nil {
		t.Fatal(err)
	}
	e.checkInvariants(b, map[uint64][]message.VChannel{res.BroadcastID: targets})
	if _, handed := ac.counts(); handed["pending"] != 1 || handed["tombstone"] != 1 {
		t.Fatalf("handed over %v, want one PENDING and one TOMBSTONE", handed)
	}
	ac.mu.Lock()
	defer ac.mu.Unlock()
	if ac.refuse["tombstone"] != 0 {
		t.Fatalf("%d TOMBSTONE refusals left: the TOMBSTONE was not retried", ac.refuse["tombstone"])
	}
}

// TestR4_7_CloseWithAnAsyncCommitInFlight: Close does not wait for a
// TOMBSTONE handed to an asynchronous catalog whose transaction hangs; the
// caller hears that the broadcaster closed (its task was created), the
// commit's late answer goes nowhere, and a new term finishes the task with
// its callback's effect applied once.
func TestR4_7_CloseWithAnAsyncCommitInFlight(t *testing.T) {
	e := newEnv(t)
	gate, held := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b := e.open(func(c *broadcast.Config) {
		c.Catalog = newAsyncCatalog(e, hooked{Catalog: c.Catalog, commit: func(_ context.Context, ops []catalog.Op, next func() error) error {
			if commitKind(ops) == "tombstone" {
				once.Do(func() { close(held) })
				<-gate
			}
			return next()
		}})
	})
	defer func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	}()
	ctx := ctxT(t, 10*time.Second)
	targets := []message.VChannel{vch(1, "a"), vch(2, "b")}
	errc := make(chan error, 1)
	go func() {
		_, err := do(ctx, b, msgOf(t, typCreate, "p", targets), resource.ExclusiveCollection("db", "c"))
		errc <- err
	}()
	<-held
	ts, err := b.Tasks(broadcast.Filter{})
	if err != nil || len(ts) != 1 {
		t.Fatalf("tasks %+v, %v: want the one broadcast", ts, err)
	}
	id := ts[0].ID
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Close waited for the hung TOMBSTONE transaction")
	}
	if err := <-errc; !errors.Is(err, broadcast.ErrClosed) || broadcast.IsTaskNotCreated(err) {
		t.Fatalf("the caller heard %v, want closed (task created)", err)
	}
	close(gate) // the transaction goes ahead; its answer finds the loop gone
	b2 := e.open()
	e.checkInvariants(b2, map[uint64][]message.VChannel{id: targets})
}
