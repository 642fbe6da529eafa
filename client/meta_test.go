package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/meta"
	"github.com/walcast/walcast/server"
	"github.com/walcast/walcast/server/apitest"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// metaServer serves the meta app over an in-memory broadcaster; leader, if
// set, replaces the broadcaster as the handlers' leader.
func metaServer(t *testing.T, leader app.Leader, wrap func(http.Handler) http.Handler) *httptest.Server {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	ps := []message.PChannel{"wal-0", "wal-1"}
	ma, err := meta.NewApp(meta.Config{PChannels: ps, Logger: quiet, ImporterInterval: 10 * time.Millisecond, ImportRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if leader == nil {
		types, cbs := message.NewRegistry(), broadcast.NewCallbacks()
		if err := ma.Register(types, cbs); err != nil {
			t.Fatal(err)
		}
		b, err := broadcast.New(context.Background(), broadcast.Config{Catalog: cmem.NewStore().Open(), WAL: wal.New(wmem.New(ps...)),
			Types: types, Callbacks: cbs, ControlChannel: ps[0].Control(), Prefix: "bc/", Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		leader = app.StaticLeader(b)
	}
	mux := http.NewServeMux()
	for path, h := range ma.Handlers(leader, server.AppHandlerOptions(quiet)...) {
		if wrap != nil {
			h = wrap(h)
		}
		mux.Handle(path, h)
	}
	t.Cleanup(func() { _ = ma.Close() })
	return apitest.ServeHandler(t, mux)
}

// lossy fails the first n requests with Unavailable (Connect protocol),
// before running the handler (the request was lost) or after (the answer
// was), and records the idempotency key of each.
type lossy struct {
	n     int64
	after bool
	calls atomic.Int64
	mu    sync.Mutex
	keys  []string
	// decode reads the key of a request body.
	decode func([]byte) string
}

func (l *lossy) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		l.mu.Lock()
		l.keys = append(l.keys, l.decode(body))
		l.mu.Unlock()
		if l.calls.Add(1) > l.n {
			h.ServeHTTP(w, r)
			return
		}
		if l.after {
			h.ServeHTTP(httptest.NewRecorder(), r)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"code":"unavailable","message":"injected: connection lost"}`))
	})
}

// TestMetaRetryReusesTheKey: a MetaService DDL without a key gets one minted
// before its first attempt, sent on every attempt, so an operation retried
// after lost requests or lost answers is done exactly once; the caller
// repeating it with the same request is answered by the original.
func TestMetaRetryReusesTheKey(t *testing.T) {
	importKey := func(b []byte) string {
		var r walcastv1.ImportRequest
		_ = proto.Unmarshal(b, &r)
		return r.GetIdempotencyKey()
	}
	for _, after := range []bool{false, true} {
		name := map[bool]string{false: "request lost", true: "answer lost"}[after]
		t.Run(name, func(t *testing.T) {
			var cur atomic.Pointer[lossy]
			cur.Store(&lossy{decode: func([]byte) string { return "" }}) // no faults while setting up
			srv := metaServer(t, nil, func(h http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { cur.Load().wrap(h).ServeHTTP(w, r) })
			})
			c := newClient(t, protocol{name: "connect"}, []string{srv.URL})
			ctx := ctxT(t)
			if _, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "c"}); err != nil {
				t.Fatal(err)
			}
			l := &lossy{n: 2, after: after, decode: importKey}
			cur.Store(l)
			req := &walcastv1.ImportRequest{Database: "db", Collection: "c", Files: []string{"f.jsonl"}}
			res, err := c.Import(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if len(req.IdempotencyKey) != 32 {
				t.Fatalf("minted key %q", req.IdempotencyKey)
			}
			l.mu.Lock()
			keys := l.keys
			l.mu.Unlock()
			if len(keys) != 3 || keys[0] != req.IdempotencyKey || keys[1] != keys[0] || keys[2] != keys[0] {
				t.Fatalf("keys per attempt %q, want %q thrice", keys, req.IdempotencyKey)
			}
			if res.Result.Duplicated != after {
				t.Fatalf("duplicated %v, want %v", res.Result.Duplicated, after)
			}
			again, err := c.Import(ctx, req)
			if err != nil || !again.Result.Duplicated || again.Job.Id != res.Job.Id {
				t.Fatalf("repeat %v, %v", again, err)
			}
			jobs, err := c.ListImportJobs(ctx, "db", "c")
			if err != nil || len(jobs) != 1 || jobs[0].Id != res.Job.Id {
				t.Fatalf("jobs %v, %v", jobs, err)
			}
		})
	}
}

// TestMetaFollowsTheLeader: a MetaService call at a coordinator that does
// not lead is redirected to the leader it names, and the client keeps
// talking to the leader.
func TestMetaFollowsTheLeader(t *testing.T) {
	leader := metaServer(t, nil, nil)
	var hits atomic.Int64
	follower := metaServer(t, app.LeaderFunc(func() (*broadcast.Broadcaster, error) {
		return nil, &server.NotLeaderError{Leader: leader.URL}
	}), counting(&hits))
	c := newClient(t, protocol{name: "connect"}, []string{follower.URL})
	ctx := ctxT(t)
	res, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"})
	if err != nil || res.Database.GetName() != "db" {
		t.Fatalf("create database %v, %v", res, err)
	}
	dbs, err := c.ListDatabases(ctx)
	if err != nil || len(dbs) != 1 {
		t.Fatalf("databases %v, %v", dbs, err)
	}
	if n := hits.Load(); n != 1 {
		t.Fatalf("the follower got %d requests, want 1 before the redirect", n)
	}
}

// TestMetaErrorsAreTyped: the service's refusals match the client's
// sentinels: a taken name is ErrAlreadyExists (not ErrKeyReused), a missing
// one ErrNotFound, bad input ErrInvalidArgument; none is retried.
func TestMetaErrorsAreTyped(t *testing.T) {
	srv := metaServer(t, nil, nil)
	c := newClient(t, protocol{name: "grpc", grpc: true}, []string{srv.URL})
	ctx := ctxT(t)
	if _, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"}); err != nil {
		t.Fatal(err)
	}
	_, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"})
	if !errorsIs(err, client.ErrAlreadyExists) || errorsIs(err, client.ErrKeyReused) {
		t.Fatalf("taken name: %v", err)
	}
	_, err = c.DropDatabase(ctx, &walcastv1.DropDatabaseRequest{Name: "nope"})
	if !errorsIs(err, client.ErrNotFound) {
		t.Fatalf("missing name: %v", err)
	}
	_, err = c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "bad name"})
	if !errorsIs(err, client.ErrInvalidArgument) {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := c.CreateDatabase(ctx, nil); !errorsIs(err, client.ErrInvalidArgument) {
		t.Fatalf("nil request: %v", err)
	}
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }

func TestMetaReasonsMatchTheServer(t *testing.T) {
	if client.ReasonAlreadyExists != server.ReasonAlreadyExists || client.ReasonQuotaExceeded != server.ReasonQuotaExceeded {
		t.Fatal("reasons differ from the server's")
	}
}

// TestMetaRetryAfterConnectionReset: a coordinator killed mid-call resets
// the connection, which connect-go reports as Canceled; the client retries
// it like any lost answer (the caller did not cancel), and the key makes the
// retry safe.
func TestMetaRetryAfterConnectionReset(t *testing.T) {
	var resets atomic.Int64
	srv := metaServer(t, nil, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if resets.Add(1) > 2 {
				h.ServeHTTP(w, r)
				return
			}
			if resets.Load() == 2 {
				h.ServeHTTP(httptest.NewRecorder(), r) // ran, then the answer was lost
			}
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			if tc, ok := conn.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // close with RST
			}
			_ = conn.Close()
		})
	})
	c := newClient(t, protocol{name: "connect"}, []string{srv.URL})
	req := &walcastv1.CreateDatabaseRequest{Name: "db"}
	res, err := c.CreateDatabase(ctxT(t), req)
	if err != nil || !res.Result.Duplicated {
		t.Fatalf("create after resets: %v, %v", res, err)
	}
	if dbs, err := c.ListDatabases(ctxT(t)); err != nil || len(dbs) != 1 {
		t.Fatalf("databases %v, %v", dbs, err)
	}
}
