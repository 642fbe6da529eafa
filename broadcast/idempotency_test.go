package broadcast_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/broadcast/internal/crash"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/clock"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// keyed broadcasts a keyed message through WithIdempotentResourceKeys, the
// way a client-facing service does: resolve the key, then lock, then send.
func keyed(ctx context.Context, b *broadcast.Broadcaster, typ message.Type, k message.IdempotencyKey, payload string, targets []message.VChannel, keys ...resource.Key) (*broadcast.Result, error) {
	h, err := b.WithIdempotentResourceKeys(ctx, broadcast.Idempotent{Type: typ, Key: k}, keys...)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	m, err := message.NewBroadcast(typ, []byte(payload), targets, message.WithIdempotencyKey(k))
	if err != nil {
		return nil, err
	}
	return h.Broadcast(ctx, m)
}

// TestR7_3_ConcurrentSameKeyOneOriginal: many concurrent requests with one key
// make exactly one task and one append round; all get its id.
func TestR7_3_ConcurrentSameKeyOneOriginal(t *testing.T) {
	for _, path := range []string{"idempotent-handle", "plain-handle-racing-rename"} {
		t.Run(path, func(t *testing.T) {
			e := newEnv(t)
			b := e.open()
			ctx := ctxT(t, 10*time.Second)
			k := message.CollectionKey(7, "import-1")
			targets := []message.VChannel{vch(1, "c7v0"), vch(2, "c7v1")}
			const n = 32
			results := make([]*broadcast.Result, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					var res *broadcast.Result
					var err error
					if path == "idempotent-handle" {
						res, err = keyed(ctx, b, typCreate, k, "same", targets, resource.ExclusiveCollection("db", "c7"))
					} else {
						// The key is scoped by id, the locks by name: requests
						// racing a rename hold non-conflicting locks, and the
						// index alone must keep one original (R7.3).
						res, err = do(ctx, b, msgOf(t, typCreate, "same", targets, message.WithIdempotencyKey(k)),
							resource.SharedCollection("db", fmt.Sprint("name", i)))
					}
					if err != nil {
						t.Error(err)
						return
					}
					results[i] = res
				})
			}
			wg.Wait()
			originals := 0
			for _, r := range results {
				if r == nil {
					t.FailNow()
				}
				if r.BroadcastID != results[0].BroadcastID {
					t.Fatalf("ids %d and %d for one key", r.BroadcastID, results[0].BroadcastID)
				}
				if r.Duplicated == nil {
					originals++
				} else if len(r.Appends) != 3 {
					t.Fatalf("duplicate results %v: want all 3 checkpoints", r.Appends)
				}
			}
			if originals != 1 {
				t.Fatalf("%d originals", originals)
			}
			if st := b.Stats(); st.Broadcasts != 1 || st.Duplicates != n-1 {
				t.Fatalf("stats %+v", st)
			}
			if got := len(e.log.Entries("wal-0")) + len(e.log.Entries("wal-1")) + len(e.log.Entries("wal-2")); got != 3 {
				t.Fatalf("%d entries appended, want one per pchannel", got)
			}
		})
	}
}

// TestR7_2_TypesDoNotCollide: one key on two message types is two scopes.
func TestR7_2_TypesDoNotCollide(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	k := message.CollectionKey(7, "same-key")
	r1, err := keyed(ctx, b, typCreate, k, "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := keyed(ctx, b, typDrop, k, "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	if r1.BroadcastID == r2.BroadcastID || r2.Duplicated != nil {
		t.Fatal("different types with one key collided")
	}
	// Another scope with the same client key is another key too.
	r3, err := keyed(ctx, b, typCreate, message.CollectionKey(8, "same-key"), "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveCollection("db", "c"))
	if err != nil || r3.Duplicated != nil {
		t.Fatalf("other scope: %+v, %v", r3, err)
	}
}

// TestR7_4_DuplicateWaitsForOriginal: a retry while the original's callback
// is still running waits for it and gets the full results.
func TestR7_4_DuplicateWaitsForOriginal(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	release := make(chan struct{})
	e.mu.Lock()
	e.block[1] = release
	e.mu.Unlock()
	k := message.ClusterKey("req")
	targets := []message.VChannel{vch(1, "a"), vch(3, "b")}
	orig := make(chan *broadcast.Result, 1)
	go func() {
		r, err := keyed(ctx, b, typCreate, k, "p", targets, resource.ExclusiveDatabase("db"))
		if err != nil {
			t.Error(err)
		}
		orig <- r
	}()
	waitFor(t, "the original's callback", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.attempts[1] == 1
	})
	dup := make(chan *broadcast.Result, 1)
	go func() {
		r, err := keyed(ctx, b, typCreate, k, "p", targets, resource.ExclusiveDatabase("db"))
		if err != nil {
			t.Error(err)
		}
		dup <- r
	}()
	select {
	case <-dup:
		t.Fatal("duplicate returned before the original's callback finished")
	case <-time.After(30 * time.Millisecond):
	}
	close(release)
	o, d := <-orig, <-dup
	if d.BroadcastID != o.BroadcastID || d.Duplicated == nil || len(d.Appends) != len(o.Appends) {
		t.Fatalf("duplicate %+v, original %+v", d, o)
	}
	for v, cp := range o.Appends.All() {
		if d.Appends.Map()[v] != cp {
			t.Fatalf("%s: duplicate has %+v, original %+v", v, d.Appends.Map()[v], cp)
		}
	}
	if d.Duplicated.Broadcast.ID != o.BroadcastID {
		t.Fatal("Duplicated does not carry the original message")
	}
}

// TestR7_4_DuplicateDeadlineLeavesOriginal: a retry whose deadline passes
// while it waits gets its own context error, not an id, and the original is
// unaffected.
func TestR7_4_DuplicateDeadlineLeavesOriginal(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	release := make(chan struct{})
	e.mu.Lock()
	e.block[1] = release
	e.mu.Unlock()
	k := message.ClusterKey("req")
	orig := make(chan error, 1)
	go func() {
		_, err := keyed(ctx, b, typCreate, k, "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveDatabase("db"))
		orig <- err
	}()
	waitFor(t, "the original", func() bool { return b.Stats().Broadcasts == 1 })
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	res, err := keyed(short, b, typCreate, k, "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveDatabase("db"))
	if !errors.Is(err, context.DeadlineExceeded) || res != nil {
		t.Fatalf("duplicate past its deadline: %+v, %v", res, err)
	}
	close(release)
	if err := <-orig; err != nil {
		t.Fatal(err)
	}
	if e.effects()[1] != 1 {
		t.Fatal("original did not complete once")
	}
}

// TestR7_4_DuplicateHitDoesNoIO: a hit on a tombstoned original writes
// nothing to the catalog or the WAL (SPEC B5: zero I/O).
func TestR7_4_DuplicateHitDoesNoIO(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	k := message.ClusterKey("req")
	if _, err := keyed(ctx, b, typCreate, k, "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveDatabase("db")); err != nil {
		t.Fatal(err)
	}
	commits, appends := e.store.Applied(), e.log.Appends()
	for range 100 {
		r, err := keyed(ctx, b, typCreate, k, "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveDatabase("db"))
		if err != nil || r.Duplicated == nil {
			t.Fatalf("%+v, %v", r, err)
		}
	}
	if e.store.Applied() != commits || e.log.Appends() != appends {
		t.Fatalf("duplicates did I/O: %d commits, %d appends", e.store.Applied()-commits, e.log.Appends()-appends)
	}
}

// TestR7_5_DedupBeforeLocks: a retry is answered by a handle that takes no
// lock, even while the original still holds its keys.
func TestR7_5_DedupBeforeLocks(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	release := make(chan struct{})
	e.mu.Lock()
	e.block[1] = release
	e.mu.Unlock()
	k := message.CollectionKey(3, "import")
	keys := []resource.Key{resource.SharedDatabase("db"), resource.ExclusiveCollection("db", "c")}
	go func() { _, _ = keyed(ctx, b, typCreate, k, "p", []message.VChannel{vch(1, "a")}, keys...) }()
	waitFor(t, "the original holding its keys", func() bool { return len(b.Locks()) > 0 && b.Stats().Broadcasts == 1 })
	// A conflicting DDL queues behind the original's keys.
	go func() { _, _ = do(ctx, b, msgOf(t, typDrop, "d", []message.VChannel{vch(1, "a")}), keys...) }()
	quick, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	h, err := b.WithIdempotentResourceKeys(quick, broadcast.Idempotent{Type: typCreate, Key: k}, keys...)
	if err != nil {
		t.Fatalf("retry blocked on the original's locks: %v", err)
	}
	if !h.Duplicate() || h.Keys() != nil {
		t.Fatal("retry handle is not a lock-free duplicate")
	}
	close(release)
	r, err := h.Original(ctx)
	if err != nil || r.BroadcastID != 1 || r.Duplicated == nil {
		t.Fatalf("%+v, %v", r, err)
	}
	h.Close()
	waitIdle(t, b)
}

// TestR7_5_DedupWhileQuotaFull: the admission check refuses all new work;
// retries of accepted requests are still answered.
func TestR7_5_DedupWhileQuotaFull(t *testing.T) {
	e := newEnv(t)
	var full atomic.Bool
	errQuota := errors.New("quota: maxImportJobNum reached")
	b := e.open(func(c *broadcast.Config) {
		c.Admit = func(context.Context) error {
			if full.Load() {
				return errQuota
			}
			return nil
		}
	})
	ctx := ctxT(t, 10*time.Second)
	k := message.CollectionKey(3, "import")
	first, err := keyed(ctx, b, typCreate, k, "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	full.Store(true)
	if _, err := keyed(ctx, b, typCreate, message.CollectionKey(3, "new"), "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveCollection("db", "c")); !errors.Is(err, errQuota) {
		t.Fatalf("new work with a full quota: %v", err)
	}
	r, err := keyed(ctx, b, typCreate, k, "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveCollection("db", "c"))
	if err != nil || r.BroadcastID != first.BroadcastID || r.Duplicated == nil {
		t.Fatalf("retry with a full quota: %+v, %v", r, err)
	}
	st, err := b.Lookup(ctx, typCreate, k)
	if err != nil || st.BroadcastID != first.BroadcastID || st.State != broadcast.Tombstone {
		t.Fatalf("Lookup: %+v, %v", st, err)
	}
	if _, err := b.Lookup(ctx, typCreate, message.CollectionKey(3, "never")); !errors.Is(err, broadcast.ErrNotFound) {
		t.Fatalf("Lookup of an unknown key: %v", err)
	}
	if _, err := b.Lookup(ctx, typCreate, "bad"); !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("Lookup of a malformed key: %v", err)
	}
}

// TestR7_6_KeyReusedWithDifferentPayload.
func TestR7_6_KeyReusedWithDifferentPayload(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	k := message.ClusterKey("req")
	if _, err := keyed(ctx, b, typCreate, k, "payload-1", []message.VChannel{vch(1, "a")}, resource.ExclusiveDatabase("db")); err != nil {
		t.Fatal(err)
	}
	if _, err := keyed(ctx, b, typCreate, k, "payload-2", []message.VChannel{vch(1, "a")}, resource.ExclusiveDatabase("db")); !errors.Is(err, broadcast.ErrKeyReusedWithDifferentPayload) {
		t.Fatalf("payload mismatch: %v", err)
	}
	// With request digests, the mismatch is caught before any lock.
	k2 := message.ClusterKey("req-2")
	h, err := b.WithIdempotentResourceKeys(ctx, broadcast.Idempotent{Type: typCreate, Key: k2, Digest: []byte("d1")}, resource.ExclusiveDatabase("db"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Broadcast(ctx, msgOf(t, typCreate, "x", []message.VChannel{vch(1, "a")}, message.WithIdempotencyKey(k2))); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WithIdempotentResourceKeys(ctx, broadcast.Idempotent{Type: typCreate, Key: k2, Digest: []byte("d2")}); !errors.Is(err, broadcast.ErrKeyReusedWithDifferentPayload) {
		t.Fatalf("digest mismatch: %v", err)
	}
	// The same digest with a different payload (ids allocated per attempt)
	// is the same request.
	h, err = b.WithIdempotentResourceKeys(ctx, broadcast.Idempotent{Type: typCreate, Key: k2, Digest: []byte("d1")})
	if err != nil || !h.Duplicate() {
		t.Fatalf("same digest: %v", err)
	}
	r, err := h.Broadcast(ctx, msgOf(t, typCreate, "other ids", []message.VChannel{vch(1, "a")}, message.WithIdempotencyKey(k2)))
	if err != nil || r.Duplicated == nil {
		t.Fatalf("%+v, %v", r, err)
	}
}

// TestR7_7_WindowReported.
func TestR7_7_WindowReported(t *testing.T) {
	e := newEnv(t)
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	b := e.open(func(c *broadcast.Config) {
		c.Clock = clock.NewManual(at)
		c.Tombstone.MaxLifetime = 2 * time.Hour
		c.Tombstone.MaxCount = 10
	})
	ctx := ctxT(t, 10*time.Second)
	k := message.ClusterKey("req")
	r, err := keyed(ctx, b, typCreate, k, "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveDatabase("db"))
	if err != nil {
		t.Fatal(err)
	}
	w := r.Window
	if w == nil || !w.FirstSeen.Equal(at) || !w.CompletedAt.Equal(at) || !w.ExpiresLatest.Equal(at.Add(2*time.Hour)) || w.CountHeadroom != 9 {
		t.Fatalf("window %+v", w)
	}
	for i := range 3 {
		if _, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveDatabase(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	st, err := b.Lookup(ctx, typCreate, k)
	if err != nil || st.Window.CountHeadroom != 6 {
		t.Fatalf("after 3 more tombstones: %+v, %v", st, err)
	}
	if plain, _ := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveDatabase("x")); plain.Window != nil {
		t.Fatal("a broadcast without a key reported a window")
	}
}

// TestR7_7_KeysLoggedOnlyAsFingerprints.
func TestR7_7_KeysLoggedOnlyAsFingerprints(t *testing.T) {
	e := newEnv(t)
	var buf strings.Builder
	var mu sync.Mutex
	b := e.open(func(c *broadcast.Config) { c.Logger = newBufLogger(&buf, &mu) })
	ctx := ctxT(t, 10*time.Second)
	k := message.ClusterKey("very-secret-client-key")
	for _, payload := range []string{"p", "p", "other"} {
		_, _ = keyed(ctx, b, typCreate, k, payload, []message.VChannel{vch(1, "a")}, resource.ExclusiveDatabase("db"))
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if strings.Contains(out, "very-secret") {
		t.Fatalf("raw key in logs:\n%s", out)
	}
	if !strings.Contains(out, k.Fingerprint()) {
		t.Fatalf("duplicate hits not logged with the key's fingerprint:\n%s", out)
	}
}

// TestR7_1_LoweredKeyLimitKeepsRetries.
func TestR7_1_LoweredKeyLimitKeepsRetries(t *testing.T) {
	e := newEnv(t)
	long := message.ClusterKey(strings.Repeat("k", 300))
	b := e.open(func(c *broadcast.Config) { c.MaxKeyLength = 512 })
	ctx := ctxT(t, 10*time.Second)
	first, err := keyed(ctx, b, typCreate, long, "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveDatabase("db"))
	if err != nil {
		t.Fatal(err)
	}
	_ = b.Close()
	b = e.open() // default limit 256
	r, err := keyed(ctx, b, typCreate, long, "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveDatabase("db"))
	if err != nil || r.BroadcastID != first.BroadcastID {
		t.Fatalf("retry of an accepted long key after lowering the limit: %+v, %v", r, err)
	}
	other := message.ClusterKey(strings.Repeat("x", 257))
	commits := e.store.Applied()
	if _, err := keyed(ctx, b, typCreate, other, "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveDatabase("db")); !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("new oversized key: %v", err)
	}
	if e.store.Applied() != commits {
		t.Fatal("a refused key cost a catalog write (id block)")
	}
	at := message.ClusterKey(strings.Repeat("y", 256))
	if _, err := keyed(ctx, b, typCreate, at, "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveDatabase("db")); err != nil {
		t.Fatalf("key at the limit: %v", err)
	}
	if len(b.Locks()) != 0 {
		t.Fatal("a refused key left locks")
	}
}

// TestR7_9_OriginalOutcomeReported: an original whose callback recorded a
// failure keeps answering retries with that failure.
func TestR7_9_OriginalOutcomeReported(t *testing.T) {
	e := newEnv(t)
	typ := message.Type{Name: "Import", Version: 1}
	e.types.MustRegister(message.TypeInfo{Type: typ})
	_ = broadcast.OnAck(e.cbs, typ, broadcast.Raw(), func(_ context.Context, ev *broadcast.TypedEvent[[]byte]) error {
		ev.Effects.SetOutcome(broadcast.Outcome{Status: broadcast.Failed, Detail: "import job failed: file missing", Data: []byte("job-9")})
		return nil
	})
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	k := message.CollectionKey(4, "imp")
	r1, err := keyed(ctx, b, typ, k, "files", []message.VChannel{vch(1, "a")}, resource.ExclusiveCollection("db", "c"))
	if err != nil || r1.Outcome.Status != broadcast.Failed {
		t.Fatalf("%+v, %v", r1, err)
	}
	_ = b.Close()
	b = e.open()
	r2, err := keyed(ctx, b, typ, k, "files", []message.VChannel{vch(1, "a")}, resource.ExclusiveCollection("db", "c"))
	if err != nil || r2.BroadcastID != r1.BroadcastID || r2.Outcome.Status != broadcast.Failed || string(r2.Outcome.Data) != "job-9" {
		t.Fatalf("retry after restart: %+v, %v", r2, err)
	}
}

// TestR7_8_ReplicatedTasksIndexed: a key accepted on the primary and
// replicated is known to the secondary, across its restart (R7.8); on a
// secondary, new DDL is refused with ErrNotPrimary (R8.1).
func TestR7_8_ReplicatedTasksIndexed(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	e.secondary(b)
	ctx := ctxT(t, 10*time.Second)
	k := message.CollectionKey(5, "imp")
	m := replicated(77, typCreate, []message.VChannel{vch(1, "a")}, resource.ExclusiveCollection("db", "c"))
	m.IdempotencyKey = k
	if err := b.Ack(ctx, ackOf(m, cchan, 1)); err != nil {
		t.Fatal(err)
	}
	for _, restart := range []bool{false, true} {
		if restart {
			_ = b.Close()
			b = e.open()
		}
		st, err := b.Lookup(ctx, typCreate, k)
		if err != nil || st.BroadcastID != 77 || st.State != broadcast.Replicated {
			t.Fatalf("restart=%v: %+v, %v", restart, st, err)
		}
	}
	if b.Role() != broadcast.Secondary {
		t.Fatal("role not recovered")
	}
	if err := b.Ack(ctx, ackOf(m, vch(1, "a"), 2)); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, b)
	if _, err := keyed(ctx, b, typCreate, k, string(m.Payload), []message.VChannel{vch(1, "a")}, resource.ExclusiveCollection("db", "c")); !errors.Is(err, broadcast.ErrNotPrimary) {
		t.Fatalf("DDL on a secondary: %v, want ErrNotPrimary", err)
	}
	st, err := b.Lookup(ctx, typCreate, k)
	if err != nil || st.BroadcastID != 77 || st.State != broadcast.Tombstone {
		t.Fatalf("after completion: %+v, %v", st, err)
	}
}

// TestR7_4_RetryAfterCrashStillDeduplicates: a crash while the original was
// in flight; after recovery a retry resolves to it and the window's latest
// expiry is the one the original had.
func TestR7_4_RetryAfterCrashStillDeduplicates(t *testing.T) {
	e := newEnv(t)
	sw := crash.NewSwitch()
	b := e.open(func(c *broadcast.Config) {
		c.Catalog = &crash.Catalog{Catalog: c.Catalog, S: sw, Hook: func(ops []catalog.Op) crash.Action {
			if commitKind(ops) == "tombstone" {
				return crash.Before
			}
			return crash.Pass
		}}
	})
	ctx := ctxT(t, 10*time.Second)
	k := message.CollectionKey(9, "imp")
	first := make(chan error, 1)
	go func() {
		_, err := keyed(ctx, b, typCreate, k, "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveCollection("db", "c"))
		first <- err
	}()
	<-sw.Crashed()
	_ = b.Close()
	if err := <-first; !errors.Is(err, broadcast.ErrClosed) || broadcast.IsTaskNotCreated(err) {
		t.Fatalf("caller of the crashed broadcaster: %v, want closed with the task created", err)
	}
	b = e.open()
	r, err := keyed(ctx, b, typCreate, k, "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveCollection("db", "c"))
	if err != nil || r.Duplicated == nil || r.BroadcastID != 1 {
		t.Fatalf("retry after the crash: %+v, %v", r, err)
	}
	if e.effects()[1] != 1 {
		t.Fatal("effect not applied exactly once")
	}
	latest := r.Window.ExpiresLatest
	_ = b.Close()
	b = e.open()
	st, err := b.Lookup(ctx, typCreate, k)
	if err != nil || !st.Window.ExpiresLatest.Equal(latest) {
		t.Fatalf("window after a second restart: %+v (was %v), %v", st, latest, err)
	}
}

// keyOp is one request in the linearizability history.
type keyOp struct{ scope int }

// TestR7_3_Linearizable records a concurrent history of keyed broadcasts over
// a few scopes and checks it with porcupine against the model "per scope, the
// first accepted request defines the answer every later request gets".
func TestR7_3_Linearizable(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 30*time.Second)
	start := time.Now()
	var mu sync.Mutex
	var history []porcupine.Operation
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			for range 25 {
				s := rng.IntN(5)
				call := time.Since(start).Nanoseconds()
				// Keys conflict by scope half of the time, to mix lock waits in.
				key := resource.SharedDatabase("db")
				if rng.IntN(2) == 0 {
					key = resource.ExclusiveCollection("db", fmt.Sprint("s", s))
				}
				r, err := keyed(ctx, b, typCreate, message.ClusterKey(fmt.Sprint("scope-", s)), "p", []message.VChannel{vch(s%4, "v")}, key)
				ret := time.Since(start).Nanoseconds()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: c, Input: keyOp{s}, Call: call, Output: r.BroadcastID, Return: ret})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	model := porcupine.Model{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[int][]porcupine.Operation{}
			for _, op := range h {
				s := op.Input.(keyOp).scope
				by[s] = append(by[s], op)
			}
			var out [][]porcupine.Operation
			for _, ops := range by {
				out = append(out, ops)
			}
			return out
		},
		Init: func() any { return uint64(0) },
		Step: func(state, _ any, output any) (bool, any) {
			owner, id := state.(uint64), output.(uint64)
			if owner == 0 {
				return true, id
			}
			return id == owner, owner
		},
	}
	if res := porcupine.CheckOperationsTimeout(model, history, 20*time.Second); res != porcupine.Ok {
		t.Fatalf("history of %d keyed broadcasts is not linearizable: %v", len(history), res)
	}
	ids := map[uint64]int{}
	for _, op := range history {
		ids[op.Output.(uint64)] = op.Input.(keyOp).scope
	}
	for id, s := range ids {
		for id2, s2 := range ids {
			if id == id2 && s != s2 {
				t.Fatalf("broadcast %d answers two scopes", id)
			}
		}
	}
	if len(ids) != 5 || b.Stats().Broadcasts != 5 {
		t.Fatalf("%d originals for 5 scopes", len(ids))
	}
}

// BenchmarkDuplicateHit measures a retry answered by a tombstoned original
// (SPEC B5).
func BenchmarkDuplicateHit(b *testing.B) {
	e := newEnv(b)
	bc := e.open()
	ctx := context.Background()
	k := message.CollectionKey(1, "bench-key")
	targets := []message.VChannel{vch(0, "a"), vch(1, "b"), vch(2, "c"), vch(3, "d")}
	if _, err := keyed(ctx, bc, typCreate, k, "p", targets, resource.ExclusiveCollection("db", "c")); err != nil {
		b.Fatal(err)
	}
	m, _ := message.NewBroadcast(typCreate, []byte("p"), targets, message.WithIdempotencyKey(k))
	b.ReportAllocs()
	for b.Loop() {
		h, err := bc.WithIdempotentResourceKeys(ctx, broadcast.Idempotent{Type: typCreate, Key: k}, resource.ExclusiveCollection("db", "c"))
		if err != nil {
			b.Fatal(err)
		}
		r, err := h.Broadcast(ctx, m)
		if err != nil || r.Duplicated == nil {
			b.Fatal(err)
		}
	}
}

// TestR7_4_KeyGivenOnceOnTheHandle: a keyed broadcast takes its key from
// its handle (the message need not repeat it; a message with another key is
// still refused), and its Result says as a plain bool whether an original
// answered it, the original's message still at hand.
func TestR7_4_KeyGivenOnceOnTheHandle(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	k := message.ClusterKey("once")
	send := func(payload string, msgKey message.IdempotencyKey, handleKey ...message.IdempotencyKey) (*broadcast.Result, error) {
		hk := k
		if len(handleKey) > 0 {
			hk = handleKey[0]
		}
		h, err := b.WithIdempotentResourceKeys(ctx, broadcast.Idempotent{Type: typCreate, Key: hk}, resource.ExclusiveDatabase("db"))
		if err != nil {
			return nil, err
		}
		defer h.Close()
		m := msgOf(t, typCreate, payload, []message.VChannel{vch(1, "a")})
		m.IdempotencyKey = msgKey
		return h.Broadcast(ctx, m)
	}
	first, err := send("p", "")
	if err != nil || first.Deduplicated || first.Duplicated != nil {
		t.Fatalf("first keyed broadcast, key on the handle only: %+v, %v", first, err)
	}
	again, err := send("p", "")
	if err != nil || !again.Deduplicated || again.BroadcastID != first.BroadcastID || again.Duplicated == nil ||
		again.Duplicated.IdempotencyKey != k {
		t.Fatalf("the retry was not answered by the original: %+v, %v", again, err)
	}
	if _, err := send("p", message.ClusterKey("other"), message.ClusterKey("fresh")); !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("a message keyed otherwise than its handle: %v", err)
	}
	// A handle its original answers refuses another key just the same:
	// it must not answer a request it was not made for.
	if r, err := send("p", message.ClusterKey("other")); !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("a message keyed otherwise than its duplicate handle: %+v, %v", r, err)
	}
}

// TestR7_5_LookupSaysWhenTheOriginalIsNotDurable: while a keyed original's
// PENDING record is being written, Lookup reports it as persisting (its id
// is not final: a crash now may forget it); once the record is durable, it
// does not.
func TestR7_5_LookupSaysWhenTheOriginalIsNotDurable(t *testing.T) {
	e := newEnv(t)
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b := e.open(func(c *broadcast.Config) {
		c.Catalog = hooked{Catalog: c.Catalog, commit: func(_ context.Context, ops []catalog.Op, next func() error) error {
			for _, op := range ops {
				if strings.Contains(op.Key, "/tasks/") {
					once.Do(func() { close(held); <-release })
					break
				}
			}
			return next()
		}}
	})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(letGo) // before the broadcaster closes, even on a failure
	ctx := ctxT(t, 20*time.Second)
	k := message.ClusterKey("durable")
	done := make(chan error, 1)
	go func() {
		_, err := keyed(ctx, b, typCreate, k, "p", []message.VChannel{vch(1, "a")}, resource.ExclusiveDatabase("db"))
		done <- err
	}()
	<-held // the PENDING record's write waits
	ks, err := b.Lookup(ctx, typCreate, k)
	if err != nil || !ks.Persisting || ks.State != broadcast.Pending {
		t.Fatalf("lookup while the PENDING record is written: %+v, %v; want PENDING, persisting", ks, err)
	}
	letGo()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ks, err = b.Lookup(ctx, typCreate, k)
	if err != nil || ks.Persisting || ks.State != broadcast.Tombstone {
		t.Fatalf("lookup after the broadcast: %+v, %v; want a TOMBSTONE, not persisting", ks, err)
	}
}
