package etcd

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/embedetcd"
)

// Tests share one embedded member (each catalog under its own prefix),
// started on first use and closed by TestMain before the leak check.
var shared struct {
	mu   sync.Mutex
	srv  *embedetcd.Server
	dirs []string
}

func TestMain(m *testing.M) {
	code := m.Run()
	shared.mu.Lock()
	if shared.srv != nil {
		shared.srv.Close()
	}
	for _, d := range shared.dirs {
		os.RemoveAll(d)
	}
	shared.mu.Unlock()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// server returns the shared member, starting one if there is none (or the
// last one was stopped).
func server(tb testing.TB) *embedetcd.Server {
	tb.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv == nil {
		dir, err := os.MkdirTemp("", "walcast-etcd-catalog-")
		if err != nil {
			tb.Fatal(err)
		}
		shared.dirs = append(shared.dirs, dir)
		shared.srv = startServer(tb, dir)
	}
	return shared.srv
}

// stopServer closes s; if it is the shared member, the next server call
// starts a new one.
func stopServer(s *embedetcd.Server) {
	shared.mu.Lock()
	if shared.srv == s {
		shared.srv = nil
	}
	shared.mu.Unlock()
	s.Close()
}

func startServer(tb testing.TB, dir string) *embedetcd.Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := embedetcd.Start(ctx, embedetcd.Config{Dir: dir})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// ownServer starts a member for tb alone.
func ownServer(tb testing.TB) *embedetcd.Server {
	tb.Helper()
	s := startServer(tb, tb.TempDir())
	tb.Cleanup(func() { s.Close() })
	return s
}

func newClient(tb testing.TB, s *embedetcd.Server) *clientv3.Client {
	tb.Helper()
	c, err := s.Client()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

func serverLimits(s *embedetcd.Server) catalog.Limits {
	return catalog.Limits{MaxOps: s.MaxTxnOps(), MaxBytes: s.MaxRequestBytes()}
}

var unique struct {
	mu sync.Mutex
	n  int
}

// uniquePrefixes returns a fresh catalog prefix and election prefix.
func uniquePrefixes() (prefix, election string) {
	unique.mu.Lock()
	unique.n++
	n := unique.n
	unique.mu.Unlock()
	return fmt.Sprintf("/test/catalog/%d/", n), fmt.Sprintf("/test/election/%d", n)
}

func testCtx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

func campaign(tb testing.TB, client *clientv3.Client, election, value string, ttl time.Duration) *Term {
	tb.Helper()
	t, err := Campaign(testCtx(tb), client, election, value, ttl)
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

func newCatalog(tb testing.TB, client *clientv3.Client, cfg Config) *Catalog {
	tb.Helper()
	c, err := New(client, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}
