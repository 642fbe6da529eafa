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
// # A hung or lost leader
//
// A call that is safe to repeat (reads, acks, keyed broadcasts and DDL) is
// never stuck behind a coordinator that stopped answering. Each attempt gets
// a fraction of the time the caller's context has left (a third, at least
// MinAttemptTimeout, at most WithAttemptTimeout), and while an attempt runs
// longer than a second the client checks that the coordinator still answers
// at all (its /healthz, WithLiveness): a coordinator that does not is
// abandoned at once, marked down, and the next attempt goes to another
// address. A down address is not tried again, not even when a standby names
// it as the leader, until it answers a check again; so once a standby has
// taken over (after the election's TTL), the next attempt reaches it. Keyed
// retries make this safe: a retry of an attempt that did reach the old
// leader is answered by the original.
//
// Connection failures (refused, no route) are retried like any Unavailable,
// across every address, since another coordinator may lead; WithUnreachable
// ends the call early when no coordinator at all could be connected to for
// that long (a server that is not running), with an error matching
// ErrUnreachable. An address where something that does not speak HTTP
// answers (a NATS or etcd port) counts as one where nothing listens, and
// the error says what answered.
//
// # Several clusters
//
// The addresses may also be those of a primary cluster and its
// secondaries. A cluster that does not take DDL — a secondary
// (ErrNotPrimary), or a primary another cluster's force promote superseded
// (ErrSuperseded, R8.5) — did nothing, so the call moves on to the next
// address, keyed or not, until a primary serves it or every address
// refused in a row. After a failover, the client moves to the promoted
// cluster by itself; a retry of a key the old primary accepted is answered
// there by its original, if it was replicated (R8.4).
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
//
// # Transactions and try-acquire
//
// BeginTxn, TxnBody, CommitTxn and RollbackTxn run a broadcast transaction
// (one set of resource keys held from its Begin to its end) as separate
// calls, by the transaction's id, from any process; their Scope and
// ClientKey make them idempotent as a broadcast's do. GetGroup and
// ListGroups show open transactions (and resource-key owners). A request
// with NoWait fails at once with an error matching ErrBusy, whose Holder
// names who holds the key, instead of queueing for it.
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/cenkalti/backoff/v5"

	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/auth"
	"github.com/walcast/walcast/internal/apicodec"
	"github.com/walcast/walcast/internal/tlsfiles"
	"github.com/walcast/walcast/internal/wait"
)

// Defaults of the options.
const (
	// DefaultAttemptTimeout bounds one attempt of a call that is safe to
	// retry; an attempt also gets at most a third of the time the caller's
	// context has left (but MinAttemptTimeout).
	DefaultAttemptTimeout = 30 * time.Second
	// MinAttemptTimeout is the shortest attempt timeout the share of the
	// deadline gives (unless less time is left, or WithAttemptTimeout is
	// shorter).
	MinAttemptTimeout = 2 * time.Second
	// DefaultInitialBackoff and DefaultMaxBackoff pace retries. The pause is
	// short because retries during a failover go to a standby that answers
	// at once ("not the leader"), and the first attempt after the takeover
	// should not wait long.
	DefaultInitialBackoff = 50 * time.Millisecond
	DefaultMaxBackoff     = time.Second
	// DefaultLivenessInterval and DefaultLivenessTimeout: while an attempt
	// runs longer than the interval, the coordinator's /healthz is checked
	// every interval, and a coordinator that does not answer within the
	// timeout is abandoned (see WithLiveness).
	DefaultLivenessInterval = time.Second
	DefaultLivenessTimeout  = 2 * time.Second
	// MaxIdleConnsPerHost is how many idle connections New's own HTTP
	// client keeps per coordinator, for callers that share the Client.
	MaxIdleConnsPerHost = 256
)

// attemptShare is the share of the caller's remaining time one attempt may
// take.
const attemptShare = 3

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
	livenessEvery  time.Duration
	livenessWait   time.Duration
	unreachable    time.Duration
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
// caller's context bounds it. An attempt also takes at most a third of the
// time the caller's context has left (at least MinAttemptTimeout). A
// broadcast without a Scope is never cut short (its retry would not be
// safe). Default DefaultAttemptTimeout.
func WithAttemptTimeout(d time.Duration) Option { return func(c *config) { c.attemptTimeout = d } }

// WithLiveness makes an attempt of a call that is safe to retry, once it has
// run for every, check every that the coordinator still answers (an HTTP GET
// of its /healthz, any answer counts); a coordinator that gives no answer
// within wait is abandoned as hung, marked down, and the call retried
// elsewhere. every 0 turns the checks off. Defaults DefaultLivenessInterval,
// DefaultLivenessTimeout.
func WithLiveness(every, wait time.Duration) Option {
	return func(c *config) { c.livenessEvery, c.livenessWait = every, wait }
}

// WithUnreachable ends a call with an error matching ErrUnreachable once no
// coordinator could be connected to for d: every attempt in that time failed
// to connect (refused, no route, no such host), so no server runs there to
// lead. An answer of any coordinator (a standby's "not the leader" too)
// restarts the count, since a leader change is then plausible. 0 (the
// default) retries until the caller's context ends, as a streaming node must
// while its coordinators restart.
func WithUnreachable(d time.Duration) Option { return func(c *config) { c.unreachable = d } }

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
	ownHTTP idleCloser             // New's own transport, closed by Close; nil if given
	opts    []connect.ClientOption // of every RPC client (connectOptions)
	addrs   []string

	mu        sync.Mutex
	endpoints map[string]*endpoint // by address, built on first use
	current   string               // address tried first: the last to answer, or the leader named
	next      int                  // index in addrs of the last address rotated to
	closed    bool                 // Close ran: no background check starts

	// bg is the context of background checks (recheck), cancelled by
	// Close, which then waits for checks.
	bg       context.Context
	bgCancel context.CancelFunc
	checks   sync.WaitGroup
}

// endpoint is one coordinator address and the RPC clients of it, each built
// once.
type endpoint struct {
	addr      string
	broadcast walcastv1connect.BroadcastServiceClient

	mu    sync.Mutex
	procs map[string]any // procedure -> *connect.Client[Req, Res] (procClient)
	// down is when the address last failed to answer at all (no
	// connection, a hung attempt, a failed check); zero once it answered
	// again. probing is the check under way; checked is when the last
	// one ended. Protected by mu.
	down    time.Time
	probing *probe
	checked time.Time
}

// probe is one liveness check, shared by the callers that ask while it runs.
type probe struct {
	done chan struct{} // closed when the check ends
	// settled is set before done is closed when the check came to a
	// verdict (recorded in down); a check cut short by its owner's context
	// says nothing, and its waiters must not read a stale down.
	settled bool
}

// isDown reports whether e failed to answer and has not answered since.
func (e *endpoint) isDown() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.down.IsZero()
}

// setDown records whether e answered (false) or failed to (true).
func (e *endpoint) setDown(down bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case !down:
		e.down = time.Time{}
	case e.down.IsZero():
		e.down = time.Now()
	}
}

// New returns a client of the coordinators at addrs, base URLs such as
// "http://127.0.0.1:7000". It makes no connection yet.
func New(addrs []string, opts ...Option) (*Client, error) {
	cfg := config{attemptTimeout: DefaultAttemptTimeout, initialBackoff: DefaultInitialBackoff, maxBackoff: DefaultMaxBackoff,
		livenessEvery: DefaultLivenessInterval, livenessWait: DefaultLivenessTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: no coordinator address", ErrInvalidArgument)
	}
	if cfg.initialBackoff <= 0 || cfg.maxBackoff < cfg.initialBackoff || cfg.attemptTimeout < 0 || cfg.maxAttempts < 0 ||
		cfg.livenessEvery < 0 || cfg.livenessEvery > 0 && cfg.livenessWait <= 0 || cfg.unreachable < 0 {
		return nil, fmt.Errorf("%w: need 0 < initial backoff <= max backoff, attempt timeout >= 0, max attempts >= 0, liveness interval >= 0 (with a positive timeout), unreachable >= 0", ErrInvalidArgument)
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
	c.bg, c.bgCancel = context.WithCancel(context.Background())
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
		// A Client is shared by concurrent callers, and over HTTP/1.1
		// each call in flight holds a connection: keep as many idle as
		// were busy (up to MaxIdleConnsPerHost), where net/http's
		// default of 2 closed the others after every call and opened
		// new ones (a TCP handshake per call, sockets piling up in
		// TIME_WAIT: 64 callers on one Client made 25-35% fewer calls
		// per second than on 64 Clients).
		tr.MaxIdleConns = 0
		tr.MaxIdleConnsPerHost = MaxIdleConnsPerHost
		if cfg.tls != nil {
			tr.TLSClientConfig = cfg.tls.Clone()
			tr.ForceAttemptHTTP2 = true
		}
		if cfg.grpc {
			tr.Protocols = new(http.Protocols)
			tr.Protocols.SetHTTP2(true)
			tr.Protocols.SetUnencryptedHTTP2(true)
		}
		var rt http.RoundTripper = oneWrite{next: tr}
		c.ownHTTP = tr
		if cfg.tls == nil && !cfg.grpc {
			h1 := newH1Transport(rt, tr.Proxy, MaxIdleConnsPerHost)
			rt, c.ownHTTP = h1, h1
		}
		c.http = &http.Client{Transport: rt}
	}
	return c, nil
}

// idleCloser is a transport whose kept connections can be closed.
type idleCloser interface{ CloseIdleConnections() }

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

// Close ends the client's background checks of coordinators and releases
// its idle connections.
func (c *Client) Close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.bgCancel()
	c.checks.Wait()
	if c.ownHTTP != nil {
		c.ownHTTP.CloseIdleConnections()
	}
}

// connectOptions are the Connect options of every RPC client of a Client.
func connectOptions(cfg config) []connect.ClientOption {
	// apicodec.Codec reads a broadcast's answer without protobuf-go's
	// reflection over its maps; a codec of the caller's replaces it.
	opts := append([]connect.ClientOption{connect.WithCodec(apicodec.Codec{})}, cfg.connectOpts...)
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

// target returns the address to try: the current one, unless it is down and
// another is not (then that one becomes current).
func (c *Client) target() string {
	c.mu.Lock()
	cur, next, addrs := c.current, c.next, c.addrs
	c.mu.Unlock()
	if !c.endpoint(cur).isDown() {
		return cur
	}
	for i := 1; i <= len(addrs); i++ {
		j := (next + i) % len(addrs)
		if a := addrs[j]; a != cur && !c.endpoint(a).isDown() {
			c.mu.Lock()
			if c.current == cur {
				c.current, c.next = a, j
			}
			c.mu.Unlock()
			return a
		}
	}
	return cur // every address is down: try the current one again
}

// alive reports whether the coordinator at e answers at all: an HTTP GET of
// its /healthz answered within the liveness timeout, whatever the status.
// Concurrent callers share one check. A check cut short by ctx says
// nothing: alive then reports true and records no verdict.
func (c *Client) alive(ctx context.Context, e *endpoint) bool {
	e.mu.Lock()
	pr := e.probing
	owner := pr == nil
	if owner {
		pr = &probe{done: make(chan struct{})}
		e.probing = pr
	}
	e.mu.Unlock()
	if !owner {
		select {
		case <-pr.done:
			e.mu.Lock()
			defer e.mu.Unlock()
			return !pr.settled || e.down.IsZero()
		case <-ctx.Done():
			return true
		}
	}
	pctx, cancel := context.WithTimeout(ctx, c.cfg.livenessWait)
	defer cancel()
	up := false
	if req, err := http.NewRequestWithContext(pctx, http.MethodGet, e.addr+"/healthz", nil); err == nil {
		if resp, err := c.http.Do(req); err == nil {
			// Read the short answer to its end, so that its connection is
			// kept for the calls (a body closed unread costs it).
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, healthzRead))
			_ = resp.Body.Close()
			up = true
		}
	}
	verdict := up || ctx.Err() == nil
	e.mu.Lock()
	if verdict {
		if up {
			e.down = time.Time{}
		} else if e.down.IsZero() {
			e.down = time.Now()
		}
		e.checked = time.Now()
	}
	pr.settled = verdict
	e.probing = nil
	e.mu.Unlock()
	close(pr.done)
	return up || !verdict
}

// recheck checks a down coordinator in the background, unless a check is
// under way or one ended less than a liveness interval ago, so that a caller
// never waits for a hung coordinator's check (Close waits for them).
func (c *Client) recheck(e *endpoint) {
	e.mu.Lock()
	busy := e.probing != nil || time.Since(e.checked) < c.cfg.livenessEvery
	e.mu.Unlock()
	c.mu.Lock()
	closed := c.closed
	if !busy && !closed {
		c.checks.Add(1)
	}
	c.mu.Unlock()
	if busy || closed {
		return
	}
	go func() {
		defer c.checks.Done()
		c.alive(c.bg, e)
	}()
}

// answered makes addr the first address to try.
func (c *Client) answered(addr string) {
	c.mu.Lock()
	c.current = addr
	c.mu.Unlock()
}

// redirect makes the leader that from named the first address to try; it
// reports false if the name is unusable, or names a coordinator that is
// down and still does not answer (a standby names a hung leader until its
// lease expires).
func (c *Client) redirect(from, leader string) bool {
	u, err := c.normalize(leader)
	if err != nil || u == from {
		return false
	}
	if e := c.endpoint(u); e.isDown() {
		if c.cfg.livenessEvery > 0 {
			c.recheck(e) // follow it once it answers again
		}
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
	notPrimary := 0         // answers "not primary" so far
	var prev *failure       // the last failure not caused by the caller's context
	var unreached time.Time // when the current run of connection failures began
	giveUp := func(n int, f failure) error {
		if prev != nil && (f.code == connect.CodeDeadlineExceeded || f.code == connect.CodeCanceled) {
			f = *prev // say why the retries ran, not only that time ran out
		}
		return f.toError(n, ctx.Err())
	}
	for n := 1; ; n++ {
		addr := c.target()
		e := c.endpoint(addr)
		err := c.attempt(ctx, p, e, attempt)
		if err == nil {
			e.setDown(false)
			c.answered(addr)
			return n, nil
		}
		f := inspect(err)
		if ctx.Err() != nil {
			return n, giveUp(n, f)
		}
		// A coordinator that answered (even with an error) is up; one
		// that could not be connected to, hung or timed out is down.
		// An attempt timeout says "down" only without liveness checks
		// (with them, a coordinator that passed its checks is slow, not
		// gone).
		down := f.notSent && f.tlsHint == "" || f.hung || f.code == connect.CodeDeadlineExceeded && c.cfg.livenessEvery == 0
		e.setDown(down)
		switch {
		case f.notSent && f.tlsHint == "":
			if unreached.IsZero() {
				unreached = time.Now()
			}
		case !down:
			unreached = time.Time{}
		}
		// A cluster that is not primary did nothing: with the addresses
		// of other clusters (a primary and its secondaries), the call
		// moves on to the next, until it heard "not primary" as many
		// times as it has addresses (R8.5: a superseded primary's clients
		// follow the one promoted over it, keys unchanged). The count is
		// never reset: a standby's redirect back to a secondary's leader
		// must not make it go round for ever.
		moveOn := false
		if f.notPrimary() {
			notPrimary++
			moveOn = len(c.addrs) > 1 && notPrimary < len(c.addrs)
		}
		if !moveOn && !f.retryable(p) || c.cfg.maxAttempts > 0 && n >= c.cfg.maxAttempts {
			return n, f.toError(n, nil)
		}
		if c.cfg.unreachable > 0 && !unreached.IsZero() && time.Since(unreached) >= c.cfg.unreachable {
			f.unreachable = time.Since(unreached)
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
		pause := bo.NextBackOff()
		if c.cfg.unreachable > 0 && !unreached.IsZero() {
			// Say "unreachable" on time, not a backoff later.
			pause = min(pause, max(0, c.cfg.unreachable-time.Since(unreached)))
		}
		if !wait.Sleep(ctx, pause) {
			return n, giveUp(n, f)
		}
	}
}

// healthzRead bounds what a liveness check reads of /healthz's answer
// ("ok\n") to keep its connection.
const healthzRead = 4 << 10

// errHung is the cause of an attempt abandoned because its coordinator
// stopped answering.
var errHung = errors.New("the coordinator stopped answering (no answer to a liveness check): abandoned the attempt")

// attempt runs one attempt at e. An attempt of a call that is safe to retry
// gets a share of the caller's remaining time, and is abandoned as hung
// (its error wraps errHung) when e fails a liveness check while it runs.
func (c *Client) attempt(ctx context.Context, p policy, e *endpoint, attempt func(context.Context, *endpoint) error) error {
	if p != anyTransient {
		return attempt(ctx, e)
	}
	caller := ctx
	if d := c.attemptTimeout(ctx); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	if c.cfg.livenessEvery <= 0 {
		return attempt(ctx, e)
	}
	// The watchdog runs only once the attempt is slow: most attempts end
	// before it fires, and cost a timer.
	w := &watchdog{c: c, e: e}
	w.ctx, w.cancel = context.WithCancelCause(ctx)
	defer w.cancel(nil)
	w.mu.Lock()
	w.timer = time.AfterFunc(c.cfg.livenessEvery, w.check)
	w.mu.Unlock()
	err := attempt(w.ctx, e)
	w.mu.Lock()
	w.stopped = true
	w.timer.Stop()
	w.mu.Unlock()
	hung := errors.Is(context.Cause(w.ctx), errHung)
	w.cancel(nil) // ends a check under way
	w.running.Wait()
	// The caller's context, not the attempt's: an attempt abandoned as
	// hung just before its own timeout ran out is still a hung one (the
	// transport reports it as canceled), and is retried.
	if err != nil && hung && caller.Err() == nil {
		return &hungError{err: err}
	}
	return err
}

// watchdog checks, while an attempt runs longer than the liveness
// interval, that its coordinator still answers, and cancels the attempt
// (cause errHung) when it does not. One allocation holds what its timer's
// callback shares with the attempt.
type watchdog struct {
	c      *Client
	e      *endpoint
	ctx    context.Context // the attempt's
	cancel context.CancelCauseFunc

	mu      sync.Mutex // guards timer and stopped: a watchdog never starts or re-arms after the attempt
	timer   *time.Timer
	stopped bool
	running sync.WaitGroup // a check under way
}

// check is the timer's callback: one liveness check, re-armed while the
// coordinator answers.
func (w *watchdog) check() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.running.Add(1)
	w.mu.Unlock()
	defer w.running.Done()
	if !w.c.alive(w.ctx, w.e) && w.ctx.Err() == nil {
		w.cancel(errHung)
		return
	}
	w.mu.Lock()
	if !w.stopped {
		w.timer.Reset(w.c.cfg.livenessEvery)
	}
	w.mu.Unlock()
}

// hungError is an attempt abandoned because its coordinator stopped
// answering.
type hungError struct{ err error }

func (h *hungError) Error() string { return errHung.Error() + ": " + h.err.Error() }
func (h *hungError) Unwrap() error { return h.err }

// attemptTimeout is the timeout of one attempt: a share of the caller's
// remaining time, at least MinAttemptTimeout (or what is left), at most
// the configured attempt timeout; 0 for none.
func (c *Client) attemptTimeout(ctx context.Context) time.Duration {
	d := c.cfg.attemptTimeout
	if dl, ok := ctx.Deadline(); ok {
		share := max(time.Until(dl)/attemptShare, MinAttemptTimeout)
		if d == 0 || share < d {
			d = share
		}
	}
	return d
}
