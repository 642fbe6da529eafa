package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/catalog/catalogtest"
	"github.com/walcast/walcast/internal/embedetcd"
	"github.com/walcast/walcast/internal/wait"
)

// backend runs the conformance suite: every Open is a fenced Catalog under
// its own prefix on the shared member, with its own clients and term; Fence
// resigns the term and campaigns for the next one; Stop closes the member
// (the next Open starts another).
type backend struct {
	mu      sync.Mutex
	handles map[catalog.Catalog]*handle
}

type handle struct {
	srv              *embedetcd.Server
	prefix, election string
	// session is the term's own client. Stop closes it before the member:
	// etcd's graceful shutdown would otherwise wait its request timeout
	// (7 s) for the session's lease keep-alive stream.
	session *clientv3.Client
	term    *Term
}

func (b *backend) open(t *testing.T, srv *embedetcd.Server, prefix, election string) catalog.Catalog {
	t.Helper()
	h := &handle{srv: srv, prefix: prefix, election: election, session: newClient(t, srv)}
	h.term = campaign(t, h.session, election, "coordinator", 5*time.Second)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if h.session.Ctx().Err() == nil { // else the session is gone already
			h.term.Resign(ctx)
		}
	})
	c := newCatalog(t, newClient(t, srv), Config{Prefix: prefix, Limits: serverLimits(srv), Fence: h.term.Fence()})
	b.mu.Lock()
	b.handles[c] = h
	b.mu.Unlock()
	return c
}

func (b *backend) handle(t *testing.T, c catalog.Catalog) *handle {
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.handles[c]
	if h == nil {
		t.Fatal("catalog not opened by this backend")
	}
	return h
}

func (b *backend) Open(t *testing.T) catalog.Catalog {
	prefix, election := uniquePrefixes()
	return b.open(t, server(t), prefix, election)
}

func (b *backend) Fence(t *testing.T, c catalog.Catalog) catalog.Catalog {
	h := b.handle(t, c)
	if err := h.term.Resign(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	return b.open(t, h.srv, h.prefix, h.election)
}

func (b *backend) Stop(t *testing.T, c catalog.Catalog) {
	h := b.handle(t, c)
	h.session.Close()
	stopServer(h.srv)
}

func TestConformance(t *testing.T) {
	catalogtest.Run(t, &backend{handles: make(map[catalog.Catalog]*handle)})
}

// TestR9_2_FencedByElection: of two campaigners the second is elected only
// once the first resigns, and the first's catalog is then fenced.
func TestR9_2_FencedByElection(t *testing.T) {
	srv := server(t)
	prefix, election := uniquePrefixes()
	clientA, clientB := newClient(t, srv), newClient(t, srv)

	termA := campaign(t, clientA, election, "a", 5*time.Second)
	catA := newCatalog(t, clientA, Config{Prefix: prefix, Fence: termA.Fence()})

	elected := make(chan *Term, 1)
	failed := make(chan error, 1)
	go func() {
		termB, err := Campaign(testCtx(t), clientB, election, "b", 5*time.Second)
		if err != nil {
			failed <- err
			return
		}
		elected <- termB
	}()
	// B's candidacy is in the election, behind A's: B waits while A
	// leads and writes.
	wait.ForNil(t, "B to stand", func() error {
		r, err := clientA.Get(testCtx(t), election+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err == nil && r.Count != 2 {
			err = fmt.Errorf("%d candidates", r.Count)
		}
		return err
	})
	for i := range 5 {
		if err := catA.Commit(testCtx(t), catalog.Put("k", []byte(fmt.Sprint("a", i)))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-elected:
		t.Fatal("B elected while A leads")
	case err := <-failed:
		t.Fatal(err)
	default:
	}

	if err := termA.Resign(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	var termB *Term
	select {
	case termB = <-elected:
	case err := <-failed:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("B not elected after A resigned")
	}
	t.Cleanup(func() { termB.Resign(context.Background()) })
	select {
	case <-termA.Done():
	default:
		t.Fatal("A's term not done after Resign")
	}
	if termB.Fence().Rev <= termA.Fence().Rev {
		t.Fatalf("B's term %+v not newer than A's %+v", termB.Fence(), termA.Fence())
	}

	err := catA.Commit(testCtx(t), catalog.Put("k", []byte("zombie")))
	if !errors.Is(err, catalog.ErrFenced) || !catalog.NotApplied(err) {
		t.Fatalf("deposed leader's commit: %v, want definite ErrFenced", err)
	}
	catB := newCatalog(t, clientB, Config{Prefix: prefix, Fence: termB.Fence()})
	if v, err := catB.Get(testCtx(t), "k"); err != nil || string(v) != "a4" {
		t.Fatalf("Get = %q, %v; want the last write of A", v, err)
	}
	if err := catB.Commit(testCtx(t), catalog.Put("k", []byte("b"))); err != nil {
		t.Fatal(err)
	}
	if err := termA.Resign(testCtx(t)); err != nil {
		t.Fatalf("second Resign: %v", err)
	}
}

// TestR9_2_FencedBySessionExpiry: a leader cut off from etcd (its session's
// client gone, so its lease is no longer refreshed) loses its term when the
// lease expires; the next candidate is elected and the old catalog, still
// connected through another client, is fenced.
func TestR9_2_FencedBySessionExpiry(t *testing.T) {
	srv := server(t)
	prefix, election := uniquePrefixes()
	sessionA, writerA, clientB := newClient(t, srv), newClient(t, srv), newClient(t, srv)

	termA := campaign(t, sessionA, election, "a", time.Second)
	catA := newCatalog(t, writerA, Config{Prefix: prefix, Fence: termA.Fence()})
	if err := catA.Commit(testCtx(t), catalog.Put("k", []byte("a"))); err != nil {
		t.Fatal(err)
	}
	elected := make(chan error, 1)
	var termB *Term
	go func() {
		var err error
		termB, err = Campaign(testCtx(t), clientB, election, "b", 5*time.Second)
		elected <- err
	}()

	start := time.Now()
	sessionA.Close() // A stops refreshing its lease, as if it crashed
	select {
	case <-termA.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("A's term not done after its client closed")
	}
	select {
	case err := <-elected:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("B not elected after A's lease expired")
	}
	t.Cleanup(func() { termB.Resign(context.Background()) })
	t.Logf("B elected %v after A's session stopped", time.Since(start).Round(time.Millisecond))

	err := catA.Commit(testCtx(t), catalog.Put("k", []byte("zombie")))
	if !errors.Is(err, catalog.ErrFenced) {
		t.Fatalf("expired leader's commit: %v, want ErrFenced", err)
	}
	if v, err := catA.Get(testCtx(t), "k"); err != nil || string(v) != "a" {
		t.Fatalf("Get = %q, %v", v, err)
	}
}

// TestR4_9_GroupCommitCoalesces: 64 concurrent Commits share transactions.
func TestR4_9_GroupCommitCoalesces(t *testing.T) {
	srv := server(t)
	prefix, election := uniquePrefixes()
	client := newClient(t, srv)
	term := campaign(t, client, election, "x", 5*time.Second)
	t.Cleanup(func() { term.Resign(context.Background()) })
	c := newCatalog(t, client, Config{Prefix: prefix, Limits: serverLimits(srv), Fence: term.Fence()})

	const callers = 64
	var wg sync.WaitGroup
	ready := make(chan struct{})
	errs := make(chan error, callers)
	for i := range callers {
		wg.Go(func() {
			<-ready
			errs <- c.Commit(testCtx(t), catalog.Put(fmt.Sprintf("g/%02d/a", i), []byte("1")), catalog.Put(fmt.Sprintf("g/%02d/b", i), []byte("2")))
		})
	}
	close(ready)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	trips, commits := c.RoundTrips()
	if commits != callers || trips >= commits {
		t.Fatalf("%d round trips for %d commits: not coalesced", trips, commits)
	}
	t.Logf("%d round trips for %d commits", trips, commits)
	n := 0
	if err := c.List(testCtx(t), "g/", func(string, []byte) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != 2*callers {
		t.Fatalf("%d keys, want %d", n, 2*callers)
	}
}

// completion is a catalog.Completion that sends each answer it hears (a
// nil one must never hear one).
type completion chan error

func (c completion) Committed(err error) { c <- err }

// TestR4_9_CommitAsyncCoalescesAndIsFenced: commits handed over by one
// goroutine without waiting share transactions, each hears its answer once,
// and a deposed term's hear ErrFenced.
func TestR4_9_CommitAsyncCoalescesAndIsFenced(t *testing.T) {
	srv := server(t)
	prefix, election := uniquePrefixes()
	client := newClient(t, srv)
	term := campaign(t, client, election, "x", 5*time.Second)
	c := newCatalog(t, client, Config{Prefix: prefix, Limits: serverLimits(srv), Fence: term.Fence()})

	const commits = 64
	done := make(completion, commits)
	for i := range commits {
		if err := c.CommitAsync(done, catalog.Put(fmt.Sprintf("a/%02d", i), []byte("1"))); err != nil {
			t.Fatal(err)
		}
	}
	for range commits {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if trips, n := c.RoundTrips(); n != commits || trips >= n {
		t.Fatalf("%d round trips for %d commits: not coalesced", trips, n)
	}
	n := 0
	if err := c.List(testCtx(t), "a/", func(string, []byte) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != commits {
		t.Fatalf("%d keys, want %d", n, commits)
	}
	select {
	case err := <-done:
		t.Fatalf("a second answer: %v", err)
	default:
	}

	if err := term.Resign(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	next := campaign(t, client, election, "y", 5*time.Second)
	t.Cleanup(func() { next.Resign(context.Background()) })
	if err := c.CommitAsync(done, catalog.Put("a/late", nil)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, catalog.ErrFenced) {
		t.Fatalf("deposed term's commit: %v, want ErrFenced", err)
	}
}

// TestListPages: a listing, streamed or over many pages, returns every key
// once, in order, prefix stripped, from one snapshot taken when it starts.
func TestListPages(t *testing.T) {
	for _, pageSize := range []int{0, 7} {
		t.Run(map[int]string{0: "stream", 7: "pages of 7"}[pageSize], func(t *testing.T) { testList(t, pageSize) })
	}
}

func testList(t *testing.T, pageSize int) {
	srv := server(t)
	prefix, _ := uniquePrefixes()
	client := newClient(t, srv)
	c := newCatalog(t, client, Config{Prefix: prefix, PageSize: pageSize})
	const n = 100
	var ops []catalog.Op
	for i := range n {
		ops = append(ops, catalog.Put(fmt.Sprintf("p/%03d", i), []byte(fmt.Sprint(i))))
	}
	ops = append(ops, catalog.Put("p", []byte("not under p/")), catalog.Put("q/1", nil), catalog.Put("o/1", nil))
	if err := c.Commit(testCtx(t), ops...); err != nil {
		t.Fatal(err)
	}
	// A neighbouring catalog's keys are invisible.
	other := newCatalog(t, client, Config{Prefix: strings.TrimSuffix(prefix, "/") + "x/"})
	if err := other.Commit(testCtx(t), catalog.Put("p/000", []byte("other"))); err != nil {
		t.Fatal(err)
	}

	i := 0
	err := c.List(testCtx(t), "p/", func(k string, v []byte) error {
		if i == 0 {
			// Writes during the listing are not part of its snapshot.
			if err := c.Commit(testCtx(t), catalog.Delete("p/099"), catalog.Put("p/100", nil)); err != nil {
				return err
			}
		}
		if want := fmt.Sprintf("p/%03d", i); k != want || string(v) != fmt.Sprint(i) {
			return fmt.Errorf("item %d: %q=%q, want %q", i, k, v, want)
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
	if pageSize == 0 && c.paged.Load() {
		t.Fatal("the embedded etcd has RangeStream, yet List fell back to pages")
	}
	keys := 0
	if err := c.List(testCtx(t), "", func(string, []byte) error { keys++; return nil }); err != nil {
		t.Fatal(err)
	}
	if keys != n+3 { // p/000..p/098, p/100, p, q/1, o/1
		t.Fatalf("List(\"\") saw %d keys, want %d", keys, n+3)
	}
}

// TestListStopsEarly: an error from fn ends a streamed listing at once and
// is returned as it is; the catalog lists again afterwards.
func TestListStopsEarly(t *testing.T) {
	srv := server(t)
	prefix, _ := uniquePrefixes()
	c := newCatalog(t, newClient(t, srv), Config{Prefix: prefix})
	var ops []catalog.Op
	for i := range 50 {
		ops = append(ops, catalog.Put(fmt.Sprintf("s/%02d", i), nil))
	}
	if err := c.Commit(testCtx(t), ops...); err != nil {
		t.Fatal(err)
	}
	stop := errors.New("enough")
	seen := 0
	if err := c.List(testCtx(t), "s/", func(string, []byte) error { seen++; return stop }); !errors.Is(err, stop) || seen != 1 {
		t.Fatalf("List returned %v after %d keys, want the callback's error after 1", err, seen)
	}
	seen = 0
	if err := c.List(testCtx(t), "s/", func(string, []byte) error { seen++; return nil }); err != nil || seen != 50 {
		t.Fatalf("List again: %v, %d keys", err, seen)
	}
}

// TestEmptyPrefix: a catalog owning the whole keyspace lists all of it.
func TestEmptyPrefix(t *testing.T) {
	srv := ownServer(t)
	c := newCatalog(t, newClient(t, srv), Config{PageSize: 2})
	if err := c.Commit(testCtx(t), catalog.Put("a", []byte("1")), catalog.Put("b", nil), catalog.Put("\xff\xff", []byte("3"))); err != nil {
		t.Fatal(err)
	}
	var keys []string
	if err := c.List(testCtx(t), "", func(k string, _ []byte) error { keys = append(keys, k); return nil }); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(keys) != fmt.Sprint([]string{"a", "b", "\xff\xff"}) {
		t.Fatalf("keys %q", keys)
	}
	keys = nil
	if err := c.List(testCtx(t), "\xff", func(k string, _ []byte) error { keys = append(keys, k); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != "\xff\xff" {
		t.Fatalf("keys under 0xff: %q", keys)
	}
}

// TestLimitsFitServer: a Commit at exactly Limits, with a prefix and a
// fence, is taken by the server; Limits beyond the server's are refused by
// it, definitely, as ErrTooLarge.
func TestLimitsFitServer(t *testing.T) {
	srv := server(t)
	prefix, election := uniquePrefixes()
	client := newClient(t, srv)
	term := campaign(t, client, election, "x", 5*time.Second)
	t.Cleanup(func() { term.Resign(context.Background()) })
	c := newCatalog(t, client, Config{Prefix: prefix, Limits: serverLimits(srv), Fence: term.Fence()})
	lim := c.Limits()
	// A fenced catalog keeps one op for moving the leader key on.
	if lim.MaxOps != srv.MaxTxnOps()-1 || lim.MaxBytes >= srv.MaxRequestBytes() || lim.MaxBytes < srv.MaxRequestBytes()*99/100 {
		t.Fatalf("limits %+v for a server of %d ops / %d bytes", lim, srv.MaxTxnOps(), srv.MaxRequestBytes())
	}
	ops := make([]catalog.Op, lim.MaxOps)
	each := lim.MaxBytes / lim.MaxOps
	for i := range ops {
		key := fmt.Sprintf("full/%05d", i)
		size := each - len(key)
		if i == 0 {
			size += lim.MaxBytes - each*lim.MaxOps
		}
		ops[i] = catalog.Put(key, make([]byte, size))
	}
	if catalog.Size(ops) != lim.MaxBytes {
		t.Fatalf("test bug: %d bytes", catalog.Size(ops))
	}
	if err := c.Commit(testCtx(t), ops...); err != nil {
		t.Fatalf("commit at the limits: %v", err)
	}

	// Limits the server does not have: its refusal is definite.
	loose := newCatalog(t, client, Config{Prefix: prefix, Limits: catalog.Limits{MaxOps: 2 * srv.MaxTxnOps(), MaxBytes: 2 * srv.MaxRequestBytes()}})
	many := make([]catalog.Op, srv.MaxTxnOps()+1)
	for i := range many {
		many[i] = catalog.Put(fmt.Sprintf("many/%05d", i), nil)
	}
	if err := loose.Commit(testCtx(t), many...); !errors.Is(err, catalog.ErrTooLarge) || !catalog.NotApplied(err) {
		t.Fatalf("too many ops for the server: %v", err)
	}
	for _, size := range []int{srv.MaxRequestBytes() + 100<<10, srv.MaxRequestBytes() + 1<<20} {
		err := loose.Commit(testCtx(t), catalog.Put("big", make([]byte, size)))
		if !errors.Is(err, catalog.ErrTooLarge) || !catalog.NotApplied(err) {
			t.Fatalf("%d bytes for the server: %v", size, err)
		}
	}
	if _, err := c.Get(testCtx(t), "many/00000"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("refused commit applied: %v", err)
	}
}

func TestClosed(t *testing.T) {
	srv := server(t)
	prefix, _ := uniquePrefixes()
	client := newClient(t, srv)
	c := newCatalog(t, client, Config{Prefix: prefix})
	if err := c.Commit(testCtx(t), catalog.Put("k", nil)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	check := func(what string) {
		t.Helper()
		if err := c.Commit(testCtx(t), catalog.Put("k", nil)); !errors.Is(err, catalog.ErrClosed) || !catalog.NotApplied(err) {
			t.Fatalf("%s: Commit: %v", what, err)
		}
		if err := c.CommitAsync(completion(nil), catalog.Put("k", nil)); !errors.Is(err, catalog.ErrClosed) || !catalog.NotApplied(err) {
			t.Fatalf("%s: CommitAsync: %v", what, err)
		}
		if _, err := c.Get(testCtx(t), "k"); !errors.Is(err, catalog.ErrClosed) {
			t.Fatalf("%s: Get: %v", what, err)
		}
		if err := c.List(testCtx(t), "", func(string, []byte) error { return nil }); !errors.Is(err, catalog.ErrClosed) {
			t.Fatalf("%s: List: %v", what, err)
		}
	}
	check("closed catalog")
	c = newCatalog(t, client, Config{Prefix: prefix})
	client.Close()
	check("closed client")
}

// TestAmbiguousOnTimeout: a transaction that times out against a stopped
// server is reported as ambiguous, not as not applied.
func TestAmbiguousOnTimeout(t *testing.T) {
	srv := ownServer(t)
	prefix, _ := uniquePrefixes()
	c := newCatalog(t, newClient(t, srv), Config{Prefix: prefix, CommitTimeout: 300 * time.Millisecond})
	srv.Close()
	err := c.Commit(testCtx(t), catalog.Put("k", nil))
	if err == nil || catalog.NotApplied(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("commit against a stopped server: %v, want an ambiguous deadline error", err)
	}
	t.Log(err)
}

func TestInvalidInput(t *testing.T) {
	srv := server(t)
	client := newClient(t, srv)
	for _, tc := range []struct {
		name   string
		client *clientv3.Client
		cfg    Config
	}{
		{"nil client", nil, Config{}},
		{"negative ops", client, Config{Limits: catalog.Limits{MaxOps: -1}}},
		{"negative bytes", client, Config{Limits: catalog.Limits{MaxBytes: -1}}},
		{"no room", client, Config{Limits: catalog.Limits{MaxOps: 128, MaxBytes: 4096}}},
		{"negative page", client, Config{PageSize: -1}},
		{"negative timeout", client, Config{CommitTimeout: -time.Second}},
		{"fence under prefix", client, Config{Prefix: "/a/", Fence: &Fence{Key: "/a/leader", Rev: 3}}},
		{"fence with empty prefix", client, Config{Fence: &Fence{Key: "/leader", Rev: 3}}},
		{"empty fence key", client, Config{Prefix: "/a/", Fence: &Fence{Rev: 3}}},
		{"zero fence revision", client, Config{Prefix: "/a/", Fence: &Fence{Key: "/leader"}}},
	} {
		if _, err := New(tc.client, tc.cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want ErrInvalidConfig", tc.name, err)
		}
	}
	if _, err := Campaign(testCtx(t), nil, "/e", "v", time.Second); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Campaign(nil client) = %v", err)
	}
	if _, err := Campaign(testCtx(t), client, "", "v", time.Second); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Campaign(empty prefix) = %v", err)
	}
	if _, err := Campaign(testCtx(t), client, "/e", "v", -time.Second); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Campaign(negative TTL) = %v", err)
	}
	prefix, _ := uniquePrefixes()
	c := newCatalog(t, client, Config{Prefix: prefix})
	if _, err := c.Get(testCtx(t), ""); !errors.Is(err, catalog.ErrInvalid) {
		t.Errorf("Get(\"\") = %v", err)
	}
}

// TestCampaignCancelled: a candidate that gives up withdraws, and the next
// one is not held up by it.
func TestCampaignCancelled(t *testing.T) {
	srv := server(t)
	_, election := uniquePrefixes()
	client := newClient(t, srv)
	leader := campaign(t, client, election, "a", 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := Campaign(ctx, client, election, "b", 5*time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled campaign: %v", err)
	}
	if err := leader.Resign(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	next := campaign(t, client, election, "c", 5*time.Second)
	next.Resign(testCtx(t))
}

// TestWriteGuardRefusesDefinitely: while Config.WriteGuard fails, Commit
// fails as not applied (catalog.NotApplied) with the guard's error and
// writes nothing; reads go on; once it passes, writes go on.
func TestWriteGuardRefusesDefinitely(t *testing.T) {
	srv := server(t)
	prefix, _ := uniquePrefixes()
	client := newClient(t, srv)
	noRoom := errors.New("disk nearly full")
	var refuse atomic.Bool
	c := newCatalog(t, client, Config{Prefix: prefix, WriteGuard: func() error {
		if refuse.Load() {
			return noRoom
		}
		return nil
	}})
	if err := c.Commit(testCtx(t), catalog.Put("a", []byte("1"))); err != nil {
		t.Fatal(err)
	}
	refuse.Store(true)
	err := c.Commit(testCtx(t), catalog.Put("b", []byte("2")))
	if !catalog.NotApplied(err) || !errors.Is(err, noRoom) {
		t.Fatalf("guarded commit: %v, want a definite failure wrapping the guard's error", err)
	}
	if v, err := c.Get(testCtx(t), "a"); err != nil || string(v) != "1" {
		t.Fatalf("read while guarded: %q, %v", v, err)
	}
	if resp, err := client.Get(testCtx(t), prefix+"b"); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("the refused write reached etcd: %v, %v", resp, err)
	}
	refuse.Store(false)
	if err := c.Commit(testCtx(t), catalog.Put("b", []byte("2"))); err != nil {
		t.Fatal(err)
	}
}
