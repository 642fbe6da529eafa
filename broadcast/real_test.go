package broadcast_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/walcast/walcast/catalog"
	etcdcat "github.com/walcast/walcast/catalog/etcd"
	"github.com/walcast/walcast/internal/embedetcd"
	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
	walnats "github.com/walcast/walcast/wal/nats"
)

// The engine's integration tests on the real backends: an embedded etcd and
// an embedded NATS JetStream server (file storage, sync always), shared by
// the tests of this binary; each env gets its own etcd prefix and streams.
var real struct {
	once sync.Once
	dir  string
	etcd *embedetcd.Server
	nats *embednats.Server
	err  error
	seq  atomic.Int32
}

func startReal(t testing.TB) {
	real.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		real.dir, real.err = os.MkdirTemp("", "walcast-broadcast-real-")
		if real.err != nil {
			return
		}
		if real.etcd, real.err = embedetcd.Start(ctx, embedetcd.Config{Dir: real.dir + "/etcd"}); real.err != nil {
			return
		}
		real.nats, real.err = embednats.Start(ctx, embednats.Config{Dir: real.dir + "/nats", SyncAlways: true})
	})
	if real.err != nil {
		t.Fatal(real.err)
	}
}

// stopReal runs from TestMain after every test.
func stopReal() {
	if real.nats != nil {
		real.nats.Close()
	}
	if real.etcd != nil {
		_ = real.etcd.Close()
	}
	if real.dir != "" {
		_ = os.RemoveAll(real.dir)
	}
}

type realBackend struct {
	client *clientv3.Client
	prefix string
	l      *walnats.Log

	mu   sync.Mutex
	term *etcdcat.Term
}

func newRealEnv(t *testing.T) *env {
	startReal(t)
	n := real.seq.Add(1)
	client, err := real.etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	l, err := walnats.New(ctx, walnats.Config{URL: real.nats.ClientURL(), PChannels: pchans, StreamPrefix: fmt.Sprint("T", n)})
	if err != nil {
		t.Fatal(err)
	}
	be := &realBackend{client: client, prefix: fmt.Sprintf("t%d/", n), l: l}
	t.Cleanup(func() {
		be.mu.Lock()
		if be.term != nil {
			_ = be.term.Resign(context.Background())
		}
		be.mu.Unlock()
		_ = l.Close()
		_ = client.Close()
	})
	return newEnvOn(t, be)
}

// catalog resigns the previous term (as the lease of a crashed coordinator
// expires) and campaigns for a new one; the catalog is fenced by it.
func (r *realBackend) catalog(t testing.TB) catalog.Catalog {
	ctx := ctxT(t, 30*time.Second)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.term != nil {
		if err := r.term.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	}
	term, err := etcdcat.Campaign(ctx, r.client, r.prefix+"election", "test", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r.term = term
	c, err := etcdcat.New(r.client, etcdcat.Config{Prefix: r.prefix + "cat/", Fence: term.Fence(),
		Limits: catalog.Limits{MaxOps: real.etcd.MaxTxnOps(), MaxBytes: etcdcat.DefaultMaxBytes}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (r *realBackend) log() wal.Log { return r.l }

func (r *realBackend) keys(t testing.TB, prefix string) []string {
	c, err := etcdcat.New(r.client, etcdcat.Config{Prefix: r.prefix + "cat/"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var out []string
	if err := c.List(ctxT(t, 30*time.Second), prefix, func(k string, _ []byte) error {
		out = append(out, k)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func (r *realBackend) entries(t testing.TB, p message.PChannel) [][]byte {
	ctx := ctxT(t, 30*time.Second)
	cur, err := r.l.Read(ctx, p, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	var out [][]byte
	for {
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		off, data, err := cur.Next(short)
		cancel()
		if err != nil {
			return out
		}
		if int(off) != len(out) {
			t.Fatalf("%s: entry at offset %d after %d entries", p, off, len(out))
		}
		out = append(out, data)
	}
}

// TestReal_R4_8_CrashPoints runs the crash-point harness on etcd + NATS.
func TestReal_R4_8_CrashPoints(t *testing.T) {
	for _, pt := range crashPoints {
		t.Run(pt.name, func(t *testing.T) { runCrashPointOn(t, newRealEnv(t), pt) })
	}
}

// TestReal_ConcurrentConflictingBroadcasts drives concurrent, partly
// conflicting, partly keyed broadcasts on etcd + NATS and checks SPEC §11.
func TestReal_ConcurrentConflictingBroadcasts(t *testing.T) {
	e := newRealEnv(t)
	b := e.open()
	ctx := ctxT(t, 60*time.Second)
	var mu sync.Mutex
	created := map[uint64][]message.VChannel{}
	byKey := map[message.IdempotencyKey]uint64{}
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			targets := []message.VChannel{vch(i%4, fmt.Sprint("v", i)), vch((i+1)%4, fmt.Sprint("w", i))}
			k := message.ClusterKey(fmt.Sprint("req-", i%10))
			r, err := keyed(ctx, b, typCreate, k, fmt.Sprint("p", i%10), targets, resource.ExclusiveCollection("db", fmt.Sprint("c", i%5)))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if prev, ok := byKey[k]; ok && prev != r.BroadcastID {
				t.Errorf("key %d answered by %d and %d", i%10, prev, r.BroadcastID)
			}
			byKey[k] = r.BroadcastID
			if r.Duplicated == nil {
				created[r.BroadcastID] = append(targets, cchan)
			}
		})
	}
	wg.Wait()
	if len(created) != 10 {
		t.Fatalf("%d originals for 10 keys", len(created))
	}
	e.checkInvariants(b, created)
	conflictOrder(t, e.callsCopy())
	st := b.Stats()
	t.Logf("stats %+v", st)
	if st.Broadcasts != 10 || st.Duplicates != 30 {
		t.Fatalf("stats %+v", st)
	}
}
