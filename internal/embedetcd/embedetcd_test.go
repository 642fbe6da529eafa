package embedetcd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func startT(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := Start(ctx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func client(t *testing.T, s *Server) *clientv3.Client {
	t.Helper()
	c, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestStartServeClose(t *testing.T) {
	s := startT(t, Config{Dir: t.TempDir()})
	eps := s.Endpoints()
	if len(eps) != 1 || !strings.HasPrefix(eps[0], "http://127.0.0.1:") {
		t.Fatalf("endpoints %v, want one on 127.0.0.1", eps)
	}
	if s.MaxTxnOps() != DefaultMaxTxnOps || s.MaxRequestBytes() != DefaultMaxRequestBytes {
		t.Fatalf("limits %d ops / %d bytes", s.MaxTxnOps(), s.MaxRequestBytes())
	}
	c := client(t, s)
	if _, err := c.Put(ctx(t), "k", "v"); err != nil {
		t.Fatal(err)
	}
	// The raised bounds are in force: more ops than etcd's 128, and a
	// request above its 1.5 MiB.
	ops := make([]clientv3.Op, DefaultMaxTxnOps)
	for i := range ops {
		ops[i] = clientv3.OpPut(fmt.Sprintf("op/%04d", i), "x")
	}
	if _, err := c.Txn(ctx(t)).Then(ops...).Commit(); err != nil {
		t.Fatalf("txn of %d ops: %v", len(ops), err)
	}
	if _, err := c.Put(ctx(t), "big", strings.Repeat("x", 4<<20)); err != nil {
		t.Fatalf("4 MiB put: %v", err)
	}
	if _, err := c.Txn(ctx(t)).Then(append(ops, clientv3.OpPut("one-more", "x"))...).Commit(); err == nil {
		t.Fatal("txn beyond MaxTxnOps succeeded")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	cctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := c.Get(cctx, "k"); err == nil {
		t.Fatal("get after Close succeeded")
	}
}

func TestConcurrentClose(t *testing.T) {
	s := startT(t, Config{Dir: t.TempDir()})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { s.Close() })
	}
	wg.Wait()
}

func TestRestartKeepsData(t *testing.T) {
	dir := t.TempDir()
	s := startT(t, Config{Dir: dir})
	c := client(t, s)
	for i := range 100 {
		if _, err := c.Put(ctx(t), fmt.Sprintf("k/%03d", i), fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = startT(t, Config{Dir: dir})
	c = client(t, s)
	resp, err := c.Get(ctx(t), "k/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 100 || string(resp.Kvs[99].Value) != "99" {
		t.Fatalf("after restart: %d keys", len(resp.Kvs))
	}
}

func TestInvalidConfig(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{Dir: t.TempDir(), ClientPort: -1},
		{Dir: t.TempDir(), PeerPort: 70000},
		{Dir: t.TempDir(), ClientPort: 4000, PeerPort: 4000},
		{Dir: t.TempDir(), MaxTxnOps: -1},
		{Dir: t.TempDir(), MaxRequestBytes: -5},
	} {
		if _, err := Start(ctx(t), cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Start(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

func TestStartTimeout(t *testing.T) {
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Start(cctx, Config{Dir: t.TempDir()})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Start with a cancelled context: %v", err)
	}
}

func TestDirInUse(t *testing.T) {
	dir := t.TempDir()
	startT(t, Config{Dir: dir})
	if s, err := Start(ctx(t), Config{Dir: dir}); !errors.Is(err, ErrDirInUse) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("second member on a directory in use: %v, want ErrDirInUse", err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestLoggerGetsWarningsOnly(t *testing.T) {
	var buf syncBuffer
	l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := startT(t, Config{Dir: t.TempDir(), Logger: l})
	s.Close()
	out := buf.String()
	// etcd warns at start that HTTP and gRPC share one port.
	if !strings.Contains(out, "component=etcd") || !strings.Contains(out, "level=WARN") {
		t.Fatalf("no etcd warning logged:\n%s", out)
	}
	if strings.Contains(out, "level=INFO") || strings.Contains(out, "level=DEBUG") {
		t.Fatalf("etcd info logs passed on:\n%s", out)
	}
}

// TestConfigRestartsTheSameMember restarts a member from Config: the same
// ports and data.
func TestConfigRestartsTheSameMember(t *testing.T) {
	s := startT(t, Config{Dir: t.TempDir()})
	c := client(t, s)
	if _, err := c.Put(ctx(t), "k", "v"); err != nil {
		t.Fatal(err)
	}
	c.Close()
	cfg, eps := s.Config(), s.Endpoints()
	if cfg.ClientPort == 0 || cfg.PeerPort == 0 {
		t.Fatalf("config without the ports it picked: %+v", cfg)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := startT(t, cfg)
	if fmt.Sprint(s2.Endpoints()) != fmt.Sprint(eps) {
		t.Fatalf("endpoints %v after restart, were %v", s2.Endpoints(), eps)
	}
	c2 := client(t, s2)
	resp, err := c2.Get(ctx(t), "k")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("after restart: %v, %v", resp, err)
	}
}

func TestClusterMemberNeedsFixedPorts(t *testing.T) {
	_, err := Start(ctx(t), Config{Dir: t.TempDir(), Name: "e0", InitialCluster: "e0=http://127.0.0.1:1"})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("cluster member without ports: %v", err)
	}
}

// TestLoneMemberKeepsFewRaftEntries: a single member does not keep its
// applied transactions in memory for followers it does not have. 2,000
// puts of 16 KiB (32 MiB) over ten keys leave less than half of that on
// the heap; with etcd's default of 5,000 catch-up entries they all stay.
func TestLoneMemberKeepsFewRaftEntries(t *testing.T) {
	s := startT(t, Config{Dir: t.TempDir()})
	c := client(t, s)
	value := strings.Repeat("x", 16<<10)
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	if _, err := c.Put(ctx(t), "k0", value); err != nil {
		t.Fatal(err)
	}
	before := heap()
	for i := range 2000 {
		if _, err := c.Put(ctx(t), fmt.Sprint("k", i%10), value); err != nil {
			t.Fatal(err)
		}
	}
	grew := int64(heap()) - int64(before)
	t.Logf("heap grew %d KiB over 32 MiB of puts", grew>>10)
	if grew > 16<<20 {
		t.Fatalf("heap grew %d MiB over 32 MiB of puts: the member keeps its raft entries", grew>>20)
	}
}

// TestLocalClientIsTheSameServer: the in-process client reads what the
// network client wrote and the other way round, sees the same watch events,
// is refused with the same errors (too many ops, a request too large), and
// closes without an error; once the member is closed its calls fail rather
// than hang.
func TestLocalClientIsTheSameServer(t *testing.T) {
	s := startT(t, Config{Dir: t.TempDir(), MaxTxnOps: 8, MaxRequestBytes: 64 << 10})
	net := client(t, s)
	local, closeLocal := s.LocalClient()
	t.Cleanup(func() { closeLocal() })

	w := local.Watch(ctx(t), "w/", clientv3.WithPrefix())
	if _, err := net.Put(ctx(t), "w/a", "from the network"); err != nil {
		t.Fatal(err)
	}
	select {
	case wr := <-w:
		if len(wr.Events) != 1 || string(wr.Events[0].Kv.Value) != "from the network" {
			t.Fatalf("local watch got %+v", wr.Events)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the local client's watch saw no event")
	}
	if _, err := local.Put(ctx(t), "k", "from the process"); err != nil {
		t.Fatal(err)
	}
	got, err := net.Get(ctx(t), "k")
	if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "from the process" {
		t.Fatalf("network client read %+v, %v", got, err)
	}

	ops := make([]clientv3.Op, 9)
	for i := range ops {
		ops[i] = clientv3.OpPut(fmt.Sprintf("op/%d", i), "x")
	}
	big := strings.Repeat("x", 128<<10)
	for name, c := range map[string]*clientv3.Client{"network": net, "local": local} {
		_, errOps := c.Txn(ctx(t)).Then(ops...).Commit()
		_, errBig := c.Put(ctx(t), "big", big)
		for what, err := range map[string]error{"9 ops": errOps, "128 KiB": errBig} {
			if err == nil {
				t.Fatalf("%s client: a txn of %s went through", name, what)
			}
		}
		if !errors.Is(errOps, rpctypes.ErrTooManyOps) {
			t.Errorf("%s client: too many ops: %v, want %v", name, errOps, rpctypes.ErrTooManyOps)
		}
		if !errors.Is(errBig, rpctypes.ErrRequestTooLarge) {
			t.Errorf("%s client: a request too large: %v, want %v", name, errBig, rpctypes.ErrRequestTooLarge)
		}
	}

	other, closeOther := s.LocalClient()
	if err := closeOther(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if _, err := other.Get(ctx(t), "k"); err == nil {
		t.Fatal("a closed local client still reads")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := local.Put(cctx, "k", "after Close"); err == nil {
		t.Fatal("a put after the member closed succeeded")
	}
	if cctx.Err() != nil {
		t.Fatalf("a put after the member closed waited %v, for its deadline", time.Since(start))
	}
}

// TestLocalClientStreamsRanges: the in-process client serves RangeStream
// (etcd's in-process adapter has none): a streamed range returns every key
// once, in order, in more than one chunk, as the network client's does; a
// stream given up half way ends its server side; a closed local client's
// stream is refused.
func TestLocalClientStreamsRanges(t *testing.T) {
	s := startT(t, Config{Dir: t.TempDir()})
	local, closeLocal := s.LocalClient()
	const n = 3000
	for i := 0; i < n; i += 500 {
		var ops []clientv3.Op
		for j := i; j < i+500; j++ {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("s/%05d", j), strings.Repeat("v", 200)))
		}
		if _, err := local.Txn(ctx(t)).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	for name, c := range map[string]*clientv3.Client{"local": local, "network": client(t, s)} {
		ch, err := c.GetStream(ctx(t), "s/", clientv3.WithPrefix())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		chunks, i := 0, 0
		for r := range ch {
			if err := r.Err(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			chunks++
			for _, kv := range r.Kvs {
				if want := fmt.Sprintf("s/%05d", i); string(kv.Key) != want {
					t.Fatalf("%s: key %d is %q, want %q", name, i, kv.Key, want)
				}
				i++
			}
		}
		if i != n || chunks < 2 {
			t.Fatalf("%s: %d keys in %d chunks, want %d in several", name, i, chunks, n)
		}
	}
	// Given up after the first chunk: the server's handler ends (goleak
	// checks at the end of the package's tests).
	sctx, cancel := context.WithCancel(ctx(t))
	ch, err := local.GetStream(sctx, "s/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	<-ch
	cancel()
	for range ch {
	}
	if err := closeLocal(); err != nil {
		t.Fatal(err)
	}
	if _, err := local.GetStream(ctx(t), "s/", clientv3.WithPrefix()); err == nil {
		t.Fatal("a closed local client streams")
	}
}
