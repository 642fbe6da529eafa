package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/server"
	"github.com/walcast/walcast/server/apitest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// protocol is how a test client talks: the Connect protocol over HTTP/1.1,
// or gRPC over h2c with the client's own HTTP client.
type protocol struct {
	name string
	grpc bool
}

var protocols = []protocol{{name: "connect"}, {name: "grpc", grpc: true}}

func forProtocols(t *testing.T, fn func(t *testing.T, p protocol)) {
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) { fn(t, p) })
	}
}

// newClient returns a client of addrs with fast retries, closed when the
// test ends.
func newClient(t *testing.T, p protocol, addrs []string, opts ...client.Option) *client.Client {
	t.Helper()
	base := []client.Option{client.WithBackoff(time.Millisecond, 10*time.Millisecond)}
	if p.grpc {
		base = append(base, client.WithGRPC())
	} else {
		base = append(base, client.WithHTTPClient(apitest.HTTPClient(t, false)))
	}
	c, err := client.New(addrs, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newReq() *client.BroadcastRequest {
	return &client.BroadcastRequest{
		Type:         apitest.Create,
		Payload:      []byte("import job 1"),
		VChannels:    []message.VChannel{"wal-0/c7v0", "wal-1/c7v1"},
		ResourceKeys: []resource.Key{resource.SharedDatabase("db1"), resource.ExclusiveCollection("db1", "c7")},
	}
}

// flaky fails the first n calls with Unavailable, before running the
// handler (the request never arrived) or after (the answer was lost), and
// records the idempotency key of every Broadcast call.
type flaky struct {
	n     int64
	after bool

	// onCall, if set, runs at the start of call n (from 1).
	onCall func(n int64)

	calls atomic.Int64
	mu    sync.Mutex
	keys  []string
}

func (f *flaky) interceptor() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if br, ok := req.Any().(*walcastv1.BroadcastRequest); ok {
				f.mu.Lock()
				f.keys = append(f.keys, br.GetIdempotencyKey())
				f.mu.Unlock()
			}
			n := f.calls.Add(1)
			if f.onCall != nil {
				f.onCall(n)
			}
			if n > f.n {
				return next(ctx, req)
			}
			if f.after {
				if _, err := next(ctx, req); err != nil {
					return nil, err
				}
			}
			return nil, connect.NewError(connect.CodeUnavailable, errors.New("injected: connection lost"))
		}
	})
}

func (f *flaky) seenKeys() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.keys...)
}

// counting counts the HTTP requests a handler gets.
func counting(n *atomic.Int64) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n.Add(1)
			h.ServeHTTP(w, r)
		})
	}
}

func TestConstantsMatchTheServer(t *testing.T) {
	if client.LeaderHeader != server.LeaderHeader {
		t.Fatalf("leader header %q, server %q", client.LeaderHeader, server.LeaderHeader)
	}
	pairs := [][2]string{
		{client.ReasonNotLeader, server.ReasonNotLeader},
		{client.ReasonTaskNotCreated, server.ReasonTaskNotCreated},
		{client.ReasonBroadcasterClosed, server.ReasonBroadcasterClosed},
		{client.ReasonNotPrimary, server.ReasonNotPrimary},
		{client.ReasonKeyReused, server.ReasonKeyReused},
	}
	for _, p := range pairs {
		if p[0] != p[1] {
			t.Errorf("reason %q, server %q", p[0], p[1])
		}
	}
}

// TestRetryReusesTheKey: a keyed broadcast retried after Unavailable sends
// the key minted before its first attempt every time and ends with exactly
// one task, whether the failed attempts ran on the server or not.
func TestRetryReusesTheKey(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		for _, after := range []bool{false, true} {
			name := map[bool]string{false: "request lost", true: "answer lost"}[after]
			t.Run(name, func(t *testing.T) {
				env := apitest.New(t)
				b := env.Open()
				f := &flaky{n: 2, after: after}
				srv := apitest.Serve(t, app.StaticLeader(b), nil, server.WithConnectOptions(connect.WithInterceptors(f.interceptor())))
				c := newClient(t, p, []string{srv.URL})

				req := newReq()
				req.Scope = client.CollectionScope(7)
				res, err := c.Broadcast(ctxT(t), req)
				if err != nil {
					t.Fatal(err)
				}
				if len(req.ClientKey) != 32 {
					t.Fatalf("minted client key %q", req.ClientKey)
				}
				want := string(message.CollectionKey(7, req.ClientKey))
				if string(res.IdempotencyKey) != want || res.Attempts != 3 {
					t.Fatalf("result key %q attempts %d, want %q and 3", res.IdempotencyKey, res.Attempts, want)
				}
				keys := f.seenKeys()
				if len(keys) != 3 || keys[0] != want || keys[1] != want || keys[2] != want {
					t.Fatalf("keys per attempt %q, want %q thrice", keys, want)
				}
				// When the first attempts ran, the retry is answered by the
				// original; when they did not, the last attempt is the original.
				if res.Duplicated != after {
					t.Fatalf("duplicated %v, want %v", res.Duplicated, after)
				}
				tasks, err := b.Tasks(broadcast.Filter{})
				if err != nil {
					t.Fatal(err)
				}
				if len(tasks) != 1 || tasks[0].ID != res.BroadcastID || len(env.TaskKeys()) != 1 || b.Stats().Broadcasts != 1 {
					t.Fatalf("tasks %d (%v), result %d, task keys %v", len(tasks), tasks, res.BroadcastID, env.TaskKeys())
				}
				if len(res.Appends) != 3 || res.Outcome.GetStatus() != walcastv1.OutcomeStatus_OUTCOME_STATUS_SUCCEEDED || res.Window == nil {
					t.Fatalf("result %+v", res)
				}

				// The caller repeating the whole operation with the same
				// request keeps the key too.
				again, err := c.Broadcast(ctxT(t), req)
				if err != nil || !again.Duplicated || again.BroadcastID != res.BroadcastID {
					t.Fatalf("repeat %+v, %v", again, err)
				}
			})
		}
	})
}

// TestAttemptTimeoutRetriesOntoTheRunningOriginal: an attempt cut short by
// the per-attempt timeout while its broadcast runs is retried, and the retry
// waits for the original instead of broadcasting again.
func TestAttemptTimeoutRetriesOntoTheRunningOriginal(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		b := env.Open()
		var runs atomic.Int64
		env.SetCallback(func(ctx context.Context, _ *broadcast.Event) error {
			if runs.Add(1) == 1 {
				select {
				case <-time.After(300 * time.Millisecond):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		})
		srv := apitest.Serve(t, app.StaticLeader(b), nil)
		c := newClient(t, p, []string{srv.URL}, client.WithAttemptTimeout(60*time.Millisecond))

		req := newReq()
		req.Scope = client.CollectionScope(7)
		res, err := c.Broadcast(ctxT(t), req)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Duplicated || res.Attempts < 2 || b.Stats().Broadcasts != 1 || len(env.TaskKeys()) != 1 {
			t.Fatalf("result %+v, %d broadcasts", res, b.Stats().Broadcasts)
		}
	})
}

// TestUnkeyedBroadcastIsNotRetriedWhenAmbiguous: without a key, an
// Unavailable that may have followed the broadcast is returned at once:
// here the broadcast did happen, and a retry would have made a second one.
func TestUnkeyedBroadcastIsNotRetriedWhenAmbiguous(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		b := env.Open()
		f := &flaky{n: 1, after: true}
		srv := apitest.Serve(t, app.StaticLeader(b), nil, server.WithConnectOptions(connect.WithInterceptors(f.interceptor())))
		c := newClient(t, p, []string{srv.URL})

		_, err := c.Broadcast(ctxT(t), newReq())
		if !errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrTaskNotCreated) {
			t.Fatalf("error %v", err)
		}
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Attempts != 1 || f.calls.Load() != 1 {
			t.Fatalf("attempts %v, calls %d", ce, f.calls.Load())
		}
		if n := b.Stats().Broadcasts; n != 1 {
			t.Fatalf("%d broadcasts", n)
		}
	})
}

// TestUnkeyedBroadcastRetriedWhenNotCreated: a coordinator that refused
// before creating the task (its broadcaster stopped, as in a failover) is
// retried even without a key.
func TestUnkeyedBroadcastRetriedWhenNotCreated(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		old := env.Open()
		_ = old.Close()
		cur := env.Open()
		var calls atomic.Int64
		leader := app.LeaderFunc(func() (*broadcast.Broadcaster, error) {
			if calls.Add(1) == 1 {
				return old, nil
			}
			return cur, nil
		})
		srv := apitest.Serve(t, leader, nil)
		c := newClient(t, p, []string{srv.URL})

		res, err := c.Broadcast(ctxT(t), newReq())
		if err != nil {
			t.Fatal(err)
		}
		if res.Attempts != 2 || res.Duplicated || res.IdempotencyKey != "" || cur.Stats().Broadcasts != 1 {
			t.Fatalf("result %+v", res)
		}
	})
}

// deadAddr returns the URL of a port nothing listens on.
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return "http://" + addr
}

func TestUnreachableAddressIsSkipped(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		srv := apitest.Serve(t, app.StaticLeader(env.Open()), nil)
		c := newClient(t, p, []string{deadAddr(t), srv.URL})

		// Unkeyed: a request that never reached a server is safe to repeat.
		res, err := c.Broadcast(ctxT(t), newReq())
		if err != nil {
			t.Fatal(err)
		}
		if res.Attempts != 2 {
			t.Fatalf("attempts %d", res.Attempts)
		}
		// The client now starts with the address that answered.
		if res, err := c.Broadcast(ctxT(t), newReq()); err != nil || res.Attempts != 1 {
			t.Fatalf("second broadcast %+v, %v", res, err)
		}
	})
}

func TestLeaderRedirect(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		b := env.Open()
		leaderSrv := apitest.Serve(t, app.StaticLeader(b), nil)
		var followerHits atomic.Int64
		follower := apitest.Serve(t, app.LeaderFunc(func() (*broadcast.Broadcaster, error) {
			return nil, &server.NotLeaderError{Leader: leaderSrv.URL}
		}), counting(&followerHits))
		c := newClient(t, p, []string{follower.URL})
		ctx := ctxT(t)

		res, err := c.Broadcast(ctx, newReq()) // unkeyed: a redirect is safe
		if err != nil {
			t.Fatal(err)
		}
		if res.Attempts != 2 || followerHits.Load() != 1 {
			t.Fatalf("attempts %d, follower hits %d", res.Attempts, followerHits.Load())
		}
		// Later calls go straight to the leader.
		task, err := c.GetTask(ctx, res.BroadcastID)
		if err != nil || task.GetId() != res.BroadcastID || task.GetState() != "TOMBSTONE" {
			t.Fatalf("task %v, %v", task, err)
		}
		if followerHits.Load() != 1 {
			t.Fatalf("follower hits %d after the redirect", followerHits.Load())
		}
	})
}

// TestNonRetryableErrorsReturnAtOnce: what the server decided is returned
// after one request, as a typed error.
func TestNonRetryableErrorsReturnAtOnce(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		b := env.Open()
		var hits atomic.Int64
		srv := apitest.Serve(t, app.StaticLeader(b), counting(&hits))
		c := newClient(t, p, []string{srv.URL}, client.WithBackoff(time.Second, time.Second))
		ctx := ctxT(t)

		keyed := newReq()
		keyed.Scope = client.CollectionScope(9)
		if _, err := c.Broadcast(ctx, keyed); err != nil {
			t.Fatal(err)
		}
		secondaryB := env.Open(func(cfg *broadcast.Config) {
			cfg.CheckRole = func(context.Context) error { return server.ErrNotPrimary }
		})
		secondarySrv := apitest.Serve(t, app.StaticLeader(secondaryB), counting(&hits))
		secondary := newClient(t, p, []string{secondarySrv.URL}, client.WithBackoff(time.Second, time.Second))

		cases := []struct {
			name string
			call func() error
			want []error
		}{
			{"invalid argument", func() error {
				r := newReq()
				r.Type = message.Type{Name: "Nope", Version: 1}
				_, err := c.Broadcast(ctx, r)
				return err
			}, []error{client.ErrInvalidArgument}},
			{"key reused", func() error {
				r := newReq()
				r.Scope, r.ClientKey, r.Payload = keyed.Scope, keyed.ClientKey, []byte("another job")
				_, err := c.Broadcast(ctx, r)
				return err
			}, []error{client.ErrKeyReused}},
			{"not found", func() error {
				_, err := c.GetTask(ctx, 424242)
				return err
			}, []error{client.ErrNotFound}},
			{"unknown key", func() error {
				_, err := c.LookupKey(ctx, apitest.Create, message.CollectionKey(9, "never-sent"))
				return err
			}, []error{client.ErrNotFound}},
			{"not primary", func() error {
				_, err := secondary.Broadcast(ctx, newReq())
				return err
			}, []error{client.ErrNotPrimary, client.ErrFailedPrecondition}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				before := hits.Load()
				err := tc.call()
				for _, want := range tc.want {
					if !errors.Is(err, want) {
						t.Errorf("error %v is not %v", err, want)
					}
				}
				var ce *client.Error
				if !errors.As(err, &ce) || ce.Attempts != 1 {
					t.Errorf("error %#v", err)
				}
				if errors.Is(err, client.ErrUnavailable) {
					t.Errorf("error %v is Unavailable", err)
				}
				if n := hits.Load() - before; n != 1 {
					t.Errorf("%d requests, want 1", n)
				}
			})
		}

		// Refused before sending: a client key without a scope.
		r := newReq()
		r.ClientKey = "k"
		_, err := c.Broadcast(ctx, r)
		var ce *client.Error
		if !errors.Is(err, client.ErrInvalidArgument) || !errors.As(err, &ce) || ce.Attempts != 0 {
			t.Fatalf("client key without scope: %v", err)
		}
	})
}

// TestRetriesEndWithTheCallersContext: retries of an unavailable service
// stop when the caller's context ends, with an error that says both why the
// retries ran and why they stopped.
func TestRetriesEndWithTheCallersContext(t *testing.T) {
	env := apitest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := &flaky{n: 1 << 30, onCall: func(n int64) {
		if n == 3 {
			cancel() // the caller gives up during the third attempt
		}
	}}
	srv := apitest.Serve(t, app.StaticLeader(env.Open()), nil, server.WithConnectOptions(connect.WithInterceptors(f.interceptor())))
	c := newClient(t, protocols[0], []string{srv.URL})
	_, err := c.GetTask(ctx, 1)
	if !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v", err)
	}
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Attempts != 3 {
		t.Fatalf("attempts: %v", err)
	}
}

func TestAckAndAdminCalls(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		b := env.Open()
		f := &flaky{n: 2}
		srv := apitest.Serve(t, app.StaticLeader(b), nil, server.WithConnectOptions(connect.WithInterceptors(f.interceptor())))
		c := newClient(t, p, []string{srv.URL})
		ctx := ctxT(t)

		// An AckSyncUp broadcast completes on acks, each retried through
		// injected failures.
		done := make(chan *client.BroadcastResult, 1)
		go func() {
			r := newReq()
			r.Type = apitest.Sync
			r.Scope = client.DatabaseScope(1)
			res, err := c.Broadcast(ctx, r)
			if err != nil {
				t.Error(err)
			}
			done <- res
		}()
		var task *walcastv1.Task
		wait.ForNil(t, "a pending task, appended", func() error {
			tasks, err := c.ListTasks(ctx, &walcastv1.ListTasksRequest{States: []string{"PENDING"}})
			if err != nil {
				return err
			}
			if len(tasks) != 1 || slices.ContainsFunc(tasks[0].GetVchannels(), func(v *walcastv1.VChannelState) bool { return !v.GetAppended() }) {
				return fmt.Errorf("pending tasks %v", tasks)
			}
			task = tasks[0]
			return nil
		})
		locks, err := c.ListLocks(ctx)
		if err != nil || len(locks) == 0 {
			t.Fatalf("locks %v, %v", locks, err)
		}
		for _, v := range task.GetVchannels() {
			f.calls.Store(0) // each ack first fails twice
			if err := c.Ack(ctx, &walcastv1.AckRequest{BroadcastId: task.GetId(), Vchannel: v.GetVchannel()}); err != nil {
				t.Fatal(err)
			}
		}
		res := <-done
		if res == nil || res.BroadcastID != task.GetId() {
			t.Fatalf("broadcast %+v", res)
		}
		st, err := c.LookupKey(ctx, apitest.Sync, res.IdempotencyKey)
		if err != nil || st.GetBroadcastId() != res.BroadcastID || st.GetState() != "TOMBSTONE" {
			t.Fatalf("lookup %v, %v", st, err)
		}
		if err := c.RetryCallback(ctx, task.GetId()); !errors.Is(err, client.ErrFailedPrecondition) {
			t.Fatalf("retry callback of a finished task: %v", err)
		}
		if err := c.CompleteCallback(ctx, task.GetId(), "done"); !errors.Is(err, client.ErrFailedPrecondition) {
			t.Fatalf("complete callback of a finished task: %v", err)
		}
	})
}

func TestNewRejectsBadAddresses(t *testing.T) {
	for _, addrs := range [][]string{nil, {"ftp://x"}, {"http://"}, {"http://a b"}} {
		if _, err := client.New(addrs); !errors.Is(err, client.ErrInvalidArgument) {
			t.Errorf("New(%q): %v", addrs, err)
		}
	}
	// A bare host:port, as coordinators advertise themselves, means http.
	c, err := client.New([]string{"http://127.0.0.1:7000/", "127.0.0.1:7001"})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if k1, k2 := client.NewRequestKey(), client.NewRequestKey(); len(k1) != 32 || k1 == k2 {
		t.Fatalf("keys %q %q", k1, k2)
	}
}

// TestR9_4_NilRequestsAreInvalid: a nil request is refused before any
// attempt with ErrInvalidArgument, never a panic.
func TestR9_4_NilRequestsAreInvalid(t *testing.T) {
	c, err := client.New([]string{deadAddr(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := ctxT(t)
	var ce *client.Error
	if _, err := c.Broadcast(ctx, nil); !errors.Is(err, client.ErrInvalidArgument) || !errors.As(err, &ce) || ce.Attempts != 0 {
		t.Fatalf("Broadcast(nil): %v", err)
	}
	if err := c.Ack(ctx, nil); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("Ack(nil): %v", err)
	}
	if _, err := c.Configure(ctx, nil); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("Configure(nil): %v", err)
	}
}

// A token is never sent over plain HTTP off loopback: such an address is
// refused (a coordinator that takes tokens there serves TLS).
func TestR9_8_NoTokenOverPlainHTTP(t *testing.T) {
	tok := "wct_0123456789abcdef_" + strings.Repeat("A", 43)
	for addr, ok := range map[string]bool{
		"127.0.0.1:7070": true, "http://localhost:7070": true, "http://[::1]:7070": true,
		"https://10.0.0.1:7070": true, "http://10.0.0.1:7070": false, "walcast.example:7070": false,
	} {
		c, err := client.New([]string{addr}, client.WithToken(tok))
		if ok != (err == nil) {
			t.Errorf("%s: %v, want ok=%v", addr, err, ok)
		}
		if err == nil {
			c.Close()
		} else if !errors.Is(err, client.ErrInvalidArgument) {
			t.Errorf("%s: %v is not ErrInvalidArgument", addr, err)
		}
	}
	if c, err := client.New([]string{"walcast.example:7070"}, client.WithToken(tok), client.WithTLS(nil)); err != nil {
		t.Errorf("bare address with TLS: %v", err)
	} else {
		c.Close()
	}
	if _, err := client.New([]string{"127.0.0.1:7070"}, client.WithToken("not-a-token")); !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("malformed token: %v", err)
	}
}

// TestConcurrentCallersKeepTheirConnections: callers sharing a Client over
// HTTP/1.1 hold a connection each while their calls run; once they are
// done, the connections stay open for the next calls, instead of all but two
// being closed (net/http's default) and opened again with a handshake each.
// Each wave's calls are held at the server until all of them arrived, so a
// wave needs `callers` connections at once.
func TestConcurrentCallersKeepTheirConnections(t *testing.T) {
	const callers = 16
	env := apitest.New(t)
	b := env.Open()
	path, h := server.NewBroadcastHandler(app.StaticLeader(b))
	var mu sync.Mutex
	arrived, wave := 0, make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle(path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrived++
		ch := wave
		if arrived%callers == 0 {
			close(wave)
			wave = make(chan struct{})
		}
		mu.Unlock()
		select {
		case <-ch:
		case <-r.Context().Done():
		}
		h.ServeHTTP(w, r)
	}))
	srv := httptest.NewUnstartedServer(mux)
	var opened atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			opened.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c, err := client.New([]string{srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx := ctxT(t)
	run := func(w int) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		for i := range callers {
			wg.Go(func() {
				req := newReq()
				req.ResourceKeys = []resource.Key{resource.ExclusiveCollection("db1", fmt.Sprintf("w%dc%d", w, i))}
				_, err := c.Broadcast(ctx, req)
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	run(1)
	if n := opened.Load(); n != callers {
		t.Fatalf("the first wave opened %d connections, want %d", n, callers)
	}
	run(2)
	if n := opened.Load(); n != callers {
		t.Fatalf("%d connections opened in all, want the first wave's %d kept for the second", n, callers)
	}
}

// TestR9_5_TasksIteratesPageByPage: Tasks walks every task the server
// pages (newest first, or oldest first), asking for one page at a time and
// no further than its caller reads; a caller that stops early has asked for
// the pages it read and no more.
func TestR9_5_TasksIteratesPageByPage(t *testing.T) {
	env := apitest.New(t)
	var pages atomic.Int32
	count := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
			if strings.HasSuffix(r.Spec().Procedure, "/ListTasks") {
				pages.Add(1)
			}
			return next(ctx, r)
		}
	})
	srv := apitest.Serve(t, app.StaticLeader(env.Open()), nil, server.WithMaxListTasks(2),
		server.WithConnectOptions(connect.WithInterceptors(count)))
	c := newClient(t, protocols[0], []string{srv.URL})
	ctx := ctxT(t)
	var ids []uint64
	for range 5 {
		res, err := c.Broadcast(ctx, newReq())
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.BroadcastID)
	}
	for _, oldest := range []bool{false, true} {
		pages.Store(0)
		var got []uint64
		for task, err := range c.Tasks(ctx, &walcastv1.ListTasksRequest{OldestFirst: oldest}) {
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, task.GetId())
		}
		want := slices.Clone(ids)
		if !oldest {
			slices.Reverse(want)
		}
		if !slices.Equal(got, want) || pages.Load() != 3 {
			t.Errorf("oldest first %v: %v in %d pages, want %v in 3", oldest, got, pages.Load(), want)
		}
	}
	pages.Store(0)
	n := 0
	for _, err := range c.Tasks(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		if n++; n == 3 {
			break
		}
	}
	if pages.Load() != 2 {
		t.Errorf("3 tasks read in %d pages, want 2", pages.Load())
	}
}

// TestR7_5_KeysIteratesPageByPage: Keys walks every remembered idempotency
// key by its original's id, one page at a time and no further than its
// caller reads.
func TestR7_5_KeysIteratesPageByPage(t *testing.T) {
	env := apitest.New(t)
	var pages atomic.Int32
	count := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
			if strings.HasSuffix(r.Spec().Procedure, "/ListKeys") {
				pages.Add(1)
			}
			return next(ctx, r)
		}
	})
	srv := apitest.Serve(t, app.StaticLeader(env.Open()), nil, server.WithMaxListTasks(2),
		server.WithConnectOptions(connect.WithInterceptors(count)))
	c := newClient(t, protocols[0], []string{srv.URL})
	ctx := ctxT(t)
	var ids []uint64
	for range 5 {
		req := newReq()
		req.Scope = client.ClusterScope() // a key minted per request
		res, err := c.Broadcast(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.BroadcastID)
		if _, err := c.Broadcast(ctx, newReq()); err != nil { // no key
			t.Fatal(err)
		}
	}
	var got []uint64
	for k, err := range c.Keys(ctx, 0) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, k.GetBroadcastId())
	}
	if !slices.Equal(got, ids) || pages.Load() != 3 {
		t.Errorf("keys of %v in %d pages, want %v in 3", got, pages.Load(), ids)
	}
	pages.Store(0)
	n := 0
	for _, err := range c.Keys(ctx, 1) {
		if err != nil {
			t.Fatal(err)
		}
		if n++; n == 2 {
			break
		}
	}
	if pages.Load() != 2 {
		t.Errorf("2 keys read in %d pages of 1, want 2", pages.Load())
	}
	page, err := c.ListKeysPage(ctx, &walcastv1.ListKeysRequest{Limit: 1})
	if err != nil || len(page.GetKeys()) != 1 || page.GetKeys()[0].GetBroadcastId() != ids[0] || page.GetNextPageToken() == "" {
		t.Fatalf("first page of 1: %v, %v", page, err)
	}
}
