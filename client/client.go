// Package client is the Go client of walcast's API: BroadcastService, the
// reference metadata service's MetaService and ReplicationService.
//
// A Client talks to one or more coordinators. It sends each call to the
// coordinator that answered last, follows a non-leader's redirect to the
// leader (the walcast-leader header), moves on to the next address when one
// cannot be reached, and retries Unavailable and per-attempt timeouts with
// exponential backoff until the caller's context ends. It never retries what
// the server decided (InvalidArgument, NotFound, AlreadyExists,
// FailedPrecondition, ...).
//
// # Idempotency
//
// A retry of a broadcast is safe only if the server can recognise it. A
// broadcast with a Scope carries an idempotency key: Broadcast mints the
// client key once, before the first attempt (unless the caller gave one),
// and sends the same key on every attempt, so an attempt that timed out
// after the server accepted it is answered by the original (Duplicated set)
// instead of broadcasting twice. To keep that guarantee across your own
// retries of the operation, even across a restart of your process, store
// the key (BroadcastRequest.ClientKey is filled in, and
// BroadcastResult.IdempotencyKey reports it) and pass it again.
//
// A broadcast without a Scope is retried only when the server certainly did
// nothing: it did not lead, refused before creating the task, or was never
// reached. Any other failure is returned at once, since the broadcast may
// have happened.
package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/cenkalti/backoff/v5"

	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/auth"
	"github.com/walcast/walcast/internal/tlsfiles"
	"github.com/walcast/walcast/internal/wait"
)

// Defaults of the options.
const (
	// DefaultAttemptTimeout bounds one attempt of a call that is safe to
	// retry.
	DefaultAttemptTimeout = 30 * time.Second
	// DefaultInitialBackoff and DefaultMaxBackoff pace retries.
	DefaultInitialBackoff = 50 * time.Millisecond
	DefaultMaxBackoff     = 5 * time.Second
)

// maxImmediateRedirects bounds the redirects followed without backing off,
// so two coordinators naming each other cannot spin.
const maxImmediateRedirects = 3

// Option configures New.
type Option func(*config)

type config struct {
	httpClient     connect.HTTPClient
	tls            *tls.Config
	token          string
	tokenFile      string
	grpc           bool
	connectOpts    []connect.ClientOption
	attemptTimeout time.Duration
	initialBackoff time.Duration
	maxBackoff     time.Duration
	maxAttempts    int
}

// WithHTTPClient sends requests with hc instead of a client of New's own.
// For gRPC over http:// URLs it must speak unencrypted HTTP/2 (h2c).
func WithHTTPClient(hc connect.HTTPClient) Option { return func(c *config) { c.httpClient = hc } }

// WithTLS makes the client speak TLS with tc (nil: the system's roots,
// no client certificate): addresses without a scheme, and leaders named by
// redirects, mean https://. Build tc from PEM files with TLSConfig.
// It is ignored with WithHTTPClient, whose transport decides.
func WithTLS(tc *tls.Config) Option {
	return func(c *config) {
		if tc == nil {
			tc = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		c.tls = tc
	}
}

// TLSConfig returns a client TLS configuration from PEM files: caFile the
// CA bundle the server's certificate must chain to ("" for the system's
// roots), certFile and keyFile a client certificate for mTLS (both or
// neither).
func TLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	c, err := tlsfiles.Client(tlsfiles.ClientFiles{CAFile: caFile, CertFile: certFile, KeyFile: keyFile})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return c, nil
}

// WithToken authenticates every call with a bearer token (walcast auth
// token create). Send tokens over TLS only, except to 127.0.0.1.
func WithToken(token string) Option { return func(c *config) { c.token = token } }

// WithTokenFile is WithToken with the token read from a file (surrounding
// white space ignored) when New runs.
func WithTokenFile(path string) Option { return func(c *config) { c.tokenFile = path } }

// WithGRPC speaks gRPC instead of the Connect protocol. New's own HTTP client
// then uses HTTP/2, unencrypted for http:// addresses.
func WithGRPC() Option { return func(c *config) { c.grpc = true } }

// WithConnectOptions passes options (interceptors, codecs, compression) to
// the Connect client.
func WithConnectOptions(opts ...connect.ClientOption) Option {
	return func(c *config) { c.connectOpts = append(c.connectOpts, opts...) }
}

// WithAttemptTimeout bounds each attempt of a call that is safe to retry, so
// a hung coordinator is abandoned for another attempt; 0 means only the
// caller's context bounds it. A broadcast without a Scope is never cut short
// (its retry would not be safe). Default DefaultAttemptTimeout.
func WithAttemptTimeout(d time.Duration) Option { return func(c *config) { c.attemptTimeout = d } }

// WithBackoff sets the first and the longest pause between attempts; pauses
// double in between, with jitter. Defaults DefaultInitialBackoff and
// DefaultMaxBackoff.
func WithBackoff(initial, maxPause time.Duration) Option {
	return func(c *config) { c.initialBackoff, c.maxBackoff = initial, maxPause }
}

// WithMaxAttempts stops retrying after n attempts; 0 (the default) retries
// until the caller's context ends, so give calls a context with a deadline.
func WithMaxAttempts(n int) Option { return func(c *config) { c.maxAttempts = n } }

// Client calls walcast coordinators. It is safe for concurrent use; Close it
// when done.
type Client struct {
	cfg     config
	http    connect.HTTPClient
	ownHTTP *http.Transport        // New's own transport, closed by Close; nil if given
	opts    []connect.ClientOption // of every RPC client (connectOptions)
	addrs   []string

	mu        sync.Mutex
	endpoints map[string]*endpoint // by address, built on first use
	current   string               // address tried first: the last to answer, or the leader named
	next      int                  // index in addrs of the last address rotated to
}

// endpoint is one coordinator address and the RPC clients of it, each built
// once.
type endpoint struct {
	addr      string
	broadcast walcastv1connect.BroadcastServiceClient

	mu    sync.Mutex
	procs map[string]any // procedure -> *connect.Client[Req, Res] (procClient)
}

// New returns a client of the coordinators at addrs, base URLs such as
// "http://127.0.0.1:7000". It makes no connection yet.
func New(addrs []string, opts ...Option) (*Client, error) {
	cfg := config{attemptTimeout: DefaultAttemptTimeout, initialBackoff: DefaultInitialBackoff, maxBackoff: DefaultMaxBackoff}
	for _, o := range opts {
		o(&cfg)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: no coordinator address", ErrInvalidArgument)
	}
	if cfg.initialBackoff <= 0 || cfg.maxBackoff < cfg.initialBackoff || cfg.attemptTimeout < 0 || cfg.maxAttempts < 0 {
		return nil, fmt.Errorf("%w: need 0 < initial backoff <= max backoff, attempt timeout >= 0, max attempts >= 0", ErrInvalidArgument)
	}
	if cfg.tokenFile != "" {
		raw, err := os.ReadFile(cfg.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("%w: token file: %w", ErrInvalidArgument, err)
		}
		cfg.token = strings.TrimSpace(string(raw))
	}
	if cfg.token != "" {
		if _, err := auth.ParseToken(cfg.token); err != nil {
			return nil, fmt.Errorf("%w: token: %w", ErrInvalidArgument, err)
		}
	}
	c := &Client{cfg: cfg, http: cfg.httpClient, opts: connectOptions(cfg), endpoints: make(map[string]*endpoint)}
	for _, a := range addrs {
		u, err := c.normalize(a)
		if err != nil {
			return nil, err
		}
		c.addrs = append(c.addrs, u)
	}
	c.current = c.addrs[0]
	if c.http == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		if cfg.tls != nil {
			tr.TLSClientConfig = cfg.tls.Clone()
			tr.ForceAttemptHTTP2 = true
		}
		if cfg.grpc {
			tr.Protocols = new(http.Protocols)
			tr.Protocols.SetHTTP2(true)
			tr.Protocols.SetUnencryptedHTTP2(true)
		}
		c.ownHTTP = tr
		c.http = &http.Client{Transport: tr}
	}
	return c, nil
}

// normalize checks a coordinator base URL and drops its trailing slashes. A
// bare host:port (as coordinators advertise themselves) means http://, or
// https:// with WithTLS.
func (c *Client) normalize(addr string) (string, error) {
	if !strings.Contains(addr, "://") {
		if c.cfg.tls != nil {
			addr = "https://" + addr
		} else {
			addr = "http://" + addr
		}
	}
	u, err := url.Parse(addr)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%w: coordinator address %q is not an http:// or https:// base URL", ErrInvalidArgument, addr)
	}
	if c.cfg.token != "" && u.Scheme == "http" && !loopbackHost(u.Hostname()) {
		// A server that takes tokens off loopback serves TLS (it refuses
		// to start otherwise): plain HTTP there would only leak the token.
		return "", fmt.Errorf("%w: refusing to send a token over plain HTTP to %s: use https:// (and WithTLS)", ErrInvalidArgument, u.Host)
	}
	return strings.TrimRight(addr, "/"), nil
}

func loopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// Close releases the client's idle connections.
func (c *Client) Close() {
	if c.ownHTTP != nil {
		c.ownHTTP.CloseIdleConnections()
	}
}

// connectOptions are the Connect options of every RPC client of a Client.
func connectOptions(cfg config) []connect.ClientOption {
	opts := slices.Clone(cfg.connectOpts)
	if cfg.grpc {
		opts = append([]connect.ClientOption{connect.WithGRPC()}, opts...)
	}
	if cfg.token != "" {
		bearer := "Bearer " + cfg.token
		opts = append(opts, connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", bearer)
				return next(ctx, req)
			}
		})))
	}
	return opts
}

// endpoint returns the RPC clients of addr.
func (c *Client) endpoint(addr string) *endpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.endpoints[addr]
	if e == nil {
		e = &endpoint{addr: addr, broadcast: walcastv1connect.NewBroadcastServiceClient(c.http, addr, c.opts...),
			procs: make(map[string]any)}
		c.endpoints[addr] = e
	}
	return e
}

// procClient returns e's client of one unary procedure (a path such as
// walcastv1connect.MetaServiceCreateDatabaseProcedure), built on first use.
func procClient[Req, Res any](c *Client, e *endpoint, procedure string) *connect.Client[Req, Res] {
	e.mu.Lock()
	defer e.mu.Unlock()
	if pc, ok := e.procs[procedure].(*connect.Client[Req, Res]); ok {
		return pc
	}
	pc := connect.NewClient[Req, Res](c.http, e.addr+procedure, c.opts...)
	e.procs[procedure] = pc
	return pc
}

func (c *Client) target() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.current
}

// answered makes addr the first address to try.
func (c *Client) answered(addr string) {
	c.mu.Lock()
	c.current = addr
	c.mu.Unlock()
}

// redirect makes the leader that from named the first address to try; it
// reports false if the name is unusable.
func (c *Client) redirect(from, leader string) bool {
	u, err := c.normalize(leader)
	if err != nil || u == from {
		return false
	}
	c.answered(u)
	return true
}

// rotate moves on from an address that failed, unless another call already
// did.
func (c *Client) rotate(from string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.current != from {
		return
	}
	c.next = (c.next + 1) % len(c.addrs)
	c.current = c.addrs[c.next]
}

// policy says which failures a call may retry.
type policy int

const (
	// anyTransient: repeating the call is harmless (reads, acks, keyed
	// broadcasts): retry every Unavailable and DeadlineExceeded.
	anyTransient policy = iota
	// ifNotRun: repeating the call could do it twice (unkeyed broadcasts):
	// retry only what certainly did not run.
	ifNotRun
)

// call runs attempt, each time at the endpoint to try, until it succeeds,
// fails for good, or ctx ends, and returns the number of attempts made.
func (c *Client) call(ctx context.Context, p policy, attempt func(context.Context, *endpoint) error) (int, error) {
	bo := &backoff.ExponentialBackOff{
		InitialInterval: c.cfg.initialBackoff, RandomizationFactor: 0.2, Multiplier: 2, MaxInterval: c.cfg.maxBackoff,
	}
	bo.Reset()
	redirects := 0
	var prev *failure // the last failure not caused by the caller's context
	giveUp := func(n int, f failure) error {
		if prev != nil && (f.code == connect.CodeDeadlineExceeded || f.code == connect.CodeCanceled) {
			f = *prev // say why the retries ran, not only that time ran out
		}
		return f.toError(n, ctx.Err())
	}
	for n := 1; ; n++ {
		addr := c.target()
		actx, cancel := ctx, context.CancelFunc(func() {})
		if p == anyTransient && c.cfg.attemptTimeout > 0 {
			actx, cancel = context.WithTimeout(ctx, c.cfg.attemptTimeout)
		}
		err := attempt(actx, c.endpoint(addr))
		cancel()
		if err == nil {
			c.answered(addr)
			return n, nil
		}
		f := inspect(err)
		if ctx.Err() != nil {
			return n, giveUp(n, f)
		}
		if !f.retryable(p) || c.cfg.maxAttempts > 0 && n >= c.cfg.maxAttempts {
			return n, f.toError(n, nil)
		}
		prev = &f
		if f.leader != "" && c.redirect(addr, f.leader) {
			if redirects < maxImmediateRedirects {
				redirects++
				continue
			}
		} else {
			c.rotate(addr)
		}
		if !wait.Sleep(ctx, bo.NextBackOff()) {
			return n, giveUp(n, f)
		}
	}
}
