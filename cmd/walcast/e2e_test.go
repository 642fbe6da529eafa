package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/internal/embedetcd"
	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/internal/longtest"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// workload runs keyed broadcasts from several goroutines, each retried by
// the client (which reuses the operation's key) until it succeeds or the
// deadline passes. It returns the broadcast id each key resolved to.
type workload struct {
	mu     sync.Mutex
	ids    map[string]uint64 // client key -> broadcast id
	issued atomic.Int32
	done   atomic.Int32
}

func newWorkload() *workload { return &workload{ids: map[string]uint64{}} }

func runWorkload(ctx context.Context, t *testing.T, c *client.Client, workers, perWorker int, syncUp func(i int) bool) *workload {
	w := newWorkload()
	w.run(ctx, t, c, workers, perWorker, syncUp)
	return w
}

func (w *workload) run(ctx context.Context, t *testing.T, c *client.Client, workers, perWorker int, syncUp func(i int) bool) {
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			for i := range perWorker {
				key := fmt.Sprintf("w%d-op%d", g, i)
				typ := app.GenericType
				if syncUp != nil && syncUp(i) {
					typ = app.GenericSyncType
				}
				req := &client.BroadcastRequest{Type: typ, Payload: []byte(key), Scope: client.ClusterScope(), ClientKey: key,
					VChannels:    []message.VChannel{message.VChannel(fmt.Sprintf("wal-%d/w%d", i%4, g)), message.VChannel(fmt.Sprintf("wal-%d/x%d", (i+1)%4, g))},
					ResourceKeys: []resource.Key{resource.ExclusiveCollection("db", fmt.Sprint("c", g%3))}}
				w.issued.Add(1)
				res, err := c.Broadcast(ctx, req)
				if err != nil {
					t.Errorf("%s: %v", key, err)
					return
				}
				w.mu.Lock()
				w.ids[key] = res.BroadcastID
				w.mu.Unlock()
				w.done.Add(1)
			}
		})
	}
	wg.Wait()
}

// checkExactlyOnce checks that every key resolved to its own broadcast, that
// the coordinator still answers each key with that broadcast, and that no
// task is left unfinished.
func checkExactlyOnce(ctx context.Context, t *testing.T, c *client.Client, w *workload) {
	t.Helper()
	seen := map[uint64]string{}
	for key, id := range w.ids {
		if other, dup := seen[id]; dup {
			t.Errorf("keys %s and %s resolved to one broadcast %d", key, other, id)
		}
		seen[id] = key
		typ := app.GenericType
		r, err := c.LookupKey(ctx, typ, message.ClusterKey(key))
		if errors.Is(err, client.ErrNotFound) {
			r, err = c.LookupKey(ctx, app.GenericSyncType, message.ClusterKey(key))
		}
		if err != nil {
			t.Errorf("lookup %s: %v", key, err)
			continue
		}
		if r.GetBroadcastId() != id || r.GetState() != "TOMBSTONE" {
			t.Errorf("key %s: original %d (%s), client got %d", key, r.GetBroadcastId(), r.GetState(), id)
		}
	}
	wait.ForNil(t, "no live task", func() error {
		live, err := c.ListTasks(ctx, &walcastv1.ListTasksRequest{States: []string{"PENDING", "REPLICATED"}})
		if err == nil && len(live) > 0 {
			err = fmt.Errorf("tasks still live: %v", live)
		}
		return err
	})
}

// TestR4_8_StandaloneRestartRecovers stops standalone with Ctrl-C and starts
// it again on the same data directory: every task and key is still there.
func TestR4_8_StandaloneRestartRecovers(t *testing.T) {
	dir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", freePortRun(t)) // with the embedded NATS's and etcd's next to it
	args := []string{"standalone", "--data-dir", dir, "--api-addr", addr, "--metrics-addr", ""}
	p := start(t, "standalone", args...)
	c, err := client.New([]string{p.api})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := runWorkload(ctx, t, c, 3, 4, func(i int) bool { return i%2 == 0 })
	before := embeddedURLs(t, p)
	p.stop()
	p = start(t, "standalone", args...)
	// The embedded NATS and etcd listen next to the API port, on the same
	// ports after the restart (a secondary keeps reading the WAL).
	if after := embeddedURLs(t, p); after != before || !strings.Contains(before, fmt.Sprintf("nats://127.0.0.1:%d ", port(t, addr)+2)) ||
		!strings.Contains(before, fmt.Sprintf("etcd=http://127.0.0.1:%d", port(t, addr)+3)) {
		t.Errorf("embedded servers at %q before the restart, %q after; API at %s", before, after, addr)
	}
	checkExactlyOnce(ctx, t, c, w)
	// The CLI reads the recovered tasks.
	out, err := run(t, "tasks", "list", "--addr", p.api, "--state", "tombstone")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out, "TOMBSTONE"); n != 12 {
		t.Fatalf("%d tombstones listed after restart, want 12:\n%s", n, out)
	}
	p.stop()
}

// TestR4_8_StandaloneKill9MidWorkload kills the standalone process with
// SIGKILL while clients broadcast, restarts it on the same data directory,
// and lets the clients' retries (same keys) finish: every operation is
// applied exactly once.
func TestR4_8_StandaloneKill9MidWorkload(t *testing.T) {
	dir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", freePortRun(t)) // with the embedded NATS's and etcd's next to it
	args := []string{"standalone", "--data-dir", dir, "--api-addr", addr, "--metrics-addr", ""}
	p := start(t, "standalone", args...)
	c, err := client.New([]string{p.api}, client.WithAttemptTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newWorkload()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		w.run(ctx, t, c, 4, 10, func(i int) bool { return i%3 == 0 })
	}()
	waitUntil(t, "a quarter of the workload", func() bool { return w.done.Load() >= 10 })
	p.kill()
	p = start(t, "standalone", args...)
	<-finished
	if w.done.Load() != 40 {
		t.Fatalf("%d of 40 operations finished", w.done.Load())
	}
	checkExactlyOnce(ctx, t, c, w)
	p.stop()
}

// embeddedURLs returns the wal= and etcd= part of a standalone's ready line.
func embeddedURLs(t *testing.T, p *proc) string {
	t.Helper()
	m := regexp.MustCompile(`ready: .*(wal=\S+ etcd=\S+)`).FindStringSubmatch(p.out())
	if m == nil {
		t.Fatalf("no wal= and etcd= in the ready line:\n%s", p.out())
	}
	return m[1] + " "
}

// port returns the port of a host:port address.
func port(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(p)
	if err != nil || perr != nil {
		t.Fatalf("address %q: %v %v", addr, err, perr)
	}
	return n
}

// waitUntil waits for an event: see wait.For.
var waitUntil = wait.For

// shared is an etcd and a NATS server run by the test process, standing in
// for a cluster's external services.
var shared struct {
	once sync.Once
	dir  string
	etcd *embedetcd.Server
	nats *embednats.Server
	err  error
}

func startShared(t *testing.T) {
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if shared.dir, shared.err = os.MkdirTemp("", "walcast-e2e-"); shared.err != nil {
			return
		}
		if shared.etcd, shared.err = embedetcd.Start(ctx, embedetcd.Config{Dir: filepath.Join(shared.dir, "etcd")}); shared.err != nil {
			return
		}
		shared.nats, shared.err = embednats.Start(ctx, embednats.Config{Dir: filepath.Join(shared.dir, "nats"), SyncAlways: true, Monitor: true})
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
}

func stopShared() {
	if shared.nats != nil {
		shared.nats.Close()
	}
	if shared.etcd != nil {
		_ = shared.etcd.Close()
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
}

// leaderOf tells which of two coordinators leads: a standby answers a
// lookup with Unavailable (not leader).
func leaderOf(ctx context.Context, t *testing.T, addrs ...string) int {
	t.Helper()
	leader := -1
	waitUntil(t, "a coordinator to lead", func() bool {
		for i, a := range addrs {
			c, err := client.New([]string{a}, client.WithMaxAttempts(1))
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.LookupKey(ctx, app.GenericType, message.ClusterKey("probe"))
			c.Close()
			if errors.Is(err, client.ErrNotFound) {
				leader = i
				return true
			}
		}
		return ctx.Err() != nil
	})
	if leader < 0 {
		t.Fatal("no coordinator leads")
	}
	return leader
}

// TestR9_2_CoordinatorFailover runs two coordinators and two nodes as real
// processes against one etcd and NATS, kills -9 the leader in the middle of
// a workload, and checks that every accepted broadcast completes exactly
// once and that the standby took over.
func TestR9_2_CoordinatorFailover(t *testing.T) {
	longtest.Require(t)
	startShared(t)
	prefix := fmt.Sprintf("failover%d/", time.Now().UnixNano())
	etcd := strings.Join(shared.etcd.Endpoints(), ",")
	t.Setenv("WALCAST_ELECTION_TTL", "2s")
	t.Setenv("WALCAST_CATALOG_PREFIX", prefix)
	t.Setenv("WALCAST_CATALOG_MAX_TXN_OPS", "1024")
	streams := streamPrefix() // this cluster's own streams on the shared NATS
	common := []string{"--etcd", etcd, "--nats", shared.nats.ClientURL(), "--nats-monitor", shared.nats.MonitorURL(), "--nats-stream-prefix", streams, "--metrics-addr", ""}
	nodeCommon := []string{"--nats", shared.nats.ClientURL(), "--nats-stream-prefix", streams, "--metrics-addr", ""} // a node has no etcd
	coords := []*proc{
		start(t, "coord-a", append([]string{"coord", "--api-addr", "127.0.0.1:0", "--data-dir", t.TempDir()}, common...)...),
		start(t, "coord-b", append([]string{"coord", "--api-addr", "127.0.0.1:0", "--data-dir", t.TempDir()}, common...)...),
	}
	addrs := []string{coords[0].api, coords[1].api}
	for i, consume := range []string{"0,2", "1,3"} {
		start(t, fmt.Sprint("node-", i), append([]string{"node", "--name", fmt.Sprint("n", i), "--consume", consume,
			"--coordinators", strings.Join(addrs, ","), "--data-dir", t.TempDir()}, nodeCommon...)...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	leader := leaderOf(ctx, t, addrs...)
	c, err := client.New(addrs, client.WithAttemptTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w := newWorkload()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		w.run(ctx, t, c, 4, 8, func(i int) bool { return i%2 == 0 })
	}()
	waitUntil(t, "a quarter of the workload", func() bool { return w.done.Load() >= 8 })
	coords[leader].kill()
	killed := time.Now()
	if now := leaderOf(ctx, t, addrs...); now == leader {
		t.Fatal("the killed coordinator still leads")
	}
	// Bounded by election.ttl (docs/operations.md quotes it).
	t.Logf("standby leads %v after the leader's kill -9 (election.ttl 2s)", time.Since(killed).Round(time.Millisecond))
	<-finished
	if w.done.Load() != 32 {
		t.Fatalf("%d of 32 operations finished", w.done.Load())
	}
	if now := leaderOf(ctx, t, addrs...); now == leader {
		t.Fatal("the killed coordinator still leads")
	}
	checkExactlyOnce(ctx, t, c, w)
}

// streamPrefix returns a stream prefix no other cluster of the test run
// uses: clusters sharing the shared NATS server need their own streams (a
// new catalog prefix on the same streams is refused, R8.2).
func streamPrefix() string { return fmt.Sprintf("T%d", time.Now().UnixNano()%1e12) }
