// Package apitest serves walcast's BroadcastService on in-memory backends,
// for tests of code that talks to the API: the server's own tests, the Go
// client, the CLI. Servers listen on 127.0.0.1 and speak HTTP/1.1 and
// unencrypted HTTP/2 (h2c), so the Connect, gRPC-Web and gRPC protocols all
// work without TLS.
package apitest

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/server"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// Message types every Env registers.
var (
	// Create has an ack callback (see Env.SetCallback).
	Create = message.Type{Name: "CreateCollection", Version: 1}
	// Sync is AckSyncUp by default: only consumer acks complete it.
	Sync = message.Type{Name: "TruncateCollection", Version: 1}
)

// PChannels are the Env's WAL partitions; Control is its control channel.
var (
	PChannels = []message.PChannel{"wal-0", "wal-1"}
	Control   = message.PChannel("wal-0").Control()
)

// Prefix is the catalog prefix of the Env's broadcasters.
const Prefix = "walcast/"

// Env is a durable state (catalog store and WAL log, in memory) on which
// broadcasters can be opened, as successive coordinators would.
type Env struct {
	t     testing.TB
	Store *cmem.Store
	Log   *wmem.Log
	Types *message.Registry

	mu      sync.Mutex
	cb      func(context.Context, *broadcast.Event) error
	ackOnce func(context.Context, *broadcast.AckEvent) error
}

// New returns an empty Env.
func New(t testing.TB) *Env {
	e := &Env{t: t, Store: cmem.NewStore(), Log: wmem.New(PChannels...), Types: message.NewRegistry()}
	e.Types.MustRegister(message.TypeInfo{Type: Create})
	e.Types.MustRegister(message.TypeInfo{Type: Sync, AckSyncUp: true})
	return e
}

// SetCallback sets what the ack callback of every type does; nil (the
// default) succeeds at once.
func (e *Env) SetCallback(fn func(context.Context, *broadcast.Event) error) {
	e.mu.Lock()
	e.cb = fn
	e.mu.Unlock()
}

// SetAckOnce sets what the ack-once callback of Sync does; nil (the
// default) succeeds at once.
func (e *Env) SetAckOnce(fn func(context.Context, *broadcast.AckEvent) error) {
	e.mu.Lock()
	e.ackOnce = fn
	e.mu.Unlock()
}

// Open starts a broadcaster on a new catalog term, fencing any earlier one;
// mod adjusts its config. The broadcaster is closed when the test ends.
func (e *Env) Open(mod ...func(*broadcast.Config)) *broadcast.Broadcaster {
	e.t.Helper()
	cbs := broadcast.NewCallbacks()
	for _, typ := range []message.Type{Create, Sync} {
		err := broadcast.OnAck(cbs, typ, broadcast.Raw(), func(ctx context.Context, ev *broadcast.TypedEvent[[]byte]) error {
			e.mu.Lock()
			fn := e.cb
			e.mu.Unlock()
			if fn == nil {
				return nil
			}
			return fn(ctx, ev.Event)
		})
		if err != nil {
			e.t.Fatal(err)
		}
	}
	err := broadcast.OnAckOnce(cbs, Sync, broadcast.Raw(), func(ctx context.Context, ev *broadcast.TypedAckEvent[[]byte]) error {
		e.mu.Lock()
		fn := e.ackOnce
		e.mu.Unlock()
		if fn == nil {
			return nil
		}
		return fn(ctx, ev.AckEvent)
	})
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := broadcast.Config{
		Catalog: e.Store.Open(), WAL: wal.New(e.Log), Types: e.Types, Callbacks: cbs,
		ControlChannel: Control, Prefix: Prefix,
		Backoff: broadcast.Backoff{Initial: time.Millisecond, Multiplier: 2, Max: 20 * time.Millisecond},
		Logger:  slog.New(slog.DiscardHandler),
	}
	for _, m := range mod {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := broadcast.New(ctx, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = b.Close() })
	return b
}

// TaskKeys returns the catalog keys of every task record.
func (e *Env) TaskKeys() []string { return e.Store.Keys(Prefix + "tasks/") }

// Serve serves the BroadcastService of l on 127.0.0.1 until the test ends,
// and returns the server (its URL is the client's base URL). wrap, if not
// nil, wraps the handler (to count or fail requests).
func Serve(t testing.TB, l app.Leader, wrap func(http.Handler) http.Handler, opts ...server.APIOption) *httptest.Server {
	t.Helper()
	path, h := server.NewBroadcastHandler(l, append([]server.APIOption{server.WithAPILogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if wrap != nil {
		h = wrap(h)
	}
	mux := http.NewServeMux()
	mux.Handle(path, h)
	return ServeHandler(t, mux)
}

// ServeHandler serves h on 127.0.0.1 over HTTP/1.1 and h2c until the test
// ends.
func ServeHandler(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_ = srv.Listener.Close()
	srv.Listener = ln
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// HTTPClient returns an HTTP client for the servers of this package: h2c
// when http2 is set (gRPC needs HTTP/2), HTTP/1.1 otherwise. Its idle
// connections are closed when the test ends.
func HTTPClient(t testing.TB, http2 bool) *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	if http2 {
		tr.Protocols.SetUnencryptedHTTP2(true)
	} else {
		tr.Protocols.SetHTTP1(true)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}
