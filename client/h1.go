package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"
)

// h1Max is the largest request body h1Transport sends itself; a larger one,
// or one of unknown length, goes through the fallback transport.
const h1Max = 64 << 10

// h1WriteBuf and h1ReadBuf are the sizes of a connection's write and read
// buffers: a request of up to h1WriteBuf bytes (headers and body) goes out
// in one write.
const (
	h1WriteBuf = 8 << 10
	h1ReadBuf  = 4 << 10
)

// aLongTimeAgo is a deadline in the past: setting it ends a connection's
// blocked reads and writes at once.
var aLongTimeAgo = time.Unix(1, 0)

// errH1Closed is what a round trip on a closed h1Transport returns.
var errH1Closed = errors.New("client: transport closed")

// h1Transport is New's own transport for plain http:// coordinators. It
// speaks HTTP/1.1 and runs each round trip on its caller's goroutine: it
// writes the request (headers and body in one write), reads the response
// with net/http's own parser, and keeps the connection for the next call
// once the response body has been read to its end. net/http's Transport
// hands every request to a connection's write goroutine and its response
// back from the connection's read goroutine; for unary calls, whose caller
// only waits, those hand-overs cost about as much CPU as the HTTP itself
// (docs/bench/history.md, "A transport on the caller's goroutine").
//
// It serves only what it can serve the way net/http would: http:// URLs
// reached without a proxy (as fallback's proxy function decides, once per
// host), GET and POST with a body of known length up to h1Max, and valid
// header fields. Everything else (https://, a proxy, streamed or large
// bodies) goes to fallback, which keeps the TLS and HTTP/2 paths as they
// were.
type h1Transport struct {
	fallback http.RoundTripper
	proxy    func(*http.Request) (*url.URL, error) // fallback's choice of proxy; nil: none
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	maxIdle  int // idle connections kept per host

	mu     sync.Mutex
	idle   map[string][]*h1Conn // by host:port, the most recently used last
	direct map[string]bool      // by host:port: no proxy from the environment
	closed bool
}

// newH1Transport returns a transport that sends what it cannot serve
// itself through fallback, among it what proxy (fallback's choice of proxy,
// nil for none) sends through a proxy.
func newH1Transport(fallback http.RoundTripper, proxy func(*http.Request) (*url.URL, error), maxIdle int) *h1Transport {
	// The dialer of net/http's DefaultTransport.
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	return &h1Transport{fallback: fallback, proxy: proxy, maxIdle: maxIdle, dial: d.DialContext,
		idle: make(map[string][]*h1Conn), direct: make(map[string]bool)}
}

// h1Conn is one HTTP/1.1 connection, used by one round trip at a time.
type h1Conn struct {
	nc       net.Conn
	raw      syscall.RawConn // nc's descriptor, to peek at it while kept; nil if it has none
	cc       *byteCounter    // nc, counting what the round trip wrote and read
	br       *bufio.Reader   // over cc
	bw       *bufio.Writer   // over cc
	hostport string
	reused   bool // it served a round trip before this one
}

// byteCounter is a connection that counts the bytes written to and read
// from it.
type byteCounter struct {
	nc            net.Conn
	written, read int64
}

func (c *byteCounter) Write(p []byte) (int, error) {
	n, err := c.nc.Write(p)
	c.written += int64(n)
	return n, err
}

func (c *byteCounter) Read(p []byte) (int, error) {
	n, err := c.nc.Read(p)
	c.read += int64(n)
	return n, err
}

// RoundTrip sends req and returns its response, whose body must be read to
// its end or closed, as with any RoundTripper.
func (t *h1Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	hostport, ok := t.serves(req)
	if !ok {
		return t.fallback.RoundTrip(req)
	}
	ctx := req.Context()
	body, err := readBody(req)
	if err != nil {
		return nil, err
	}
	defer bodies.Put(body)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := t.conn(ctx, hostport)
	if err != nil {
		return nil, err
	}
	resp, err := t.roundTrip(ctx, c, req, *body)
	if err != nil && c.reused && (!sent(err) || idempotent(req) && unanswered(err)) {
		// A kept connection that failed before a byte of the request was
		// written: nothing reached the server, so it is sent again on a
		// new connection, as net/http does. So is a GET whose kept
		// connection ended without a byte of answer (the server closed
		// it as idle while the request was on its way): net/http sends
		// such a request again when it is idempotent.
		if c, err = t.open(ctx, hostport); err != nil {
			return nil, err
		}
		resp, err = t.roundTrip(ctx, c, req, *body)
	}
	return resp, err
}

// bodies holds request bodies read in full (*[]byte).
var bodies = sync.Pool{New: func() any { return new([]byte) }}

// errBodyLength is a request whose body is not as long as it says.
var errBodyLength = errors.New("client: request body length differs from ContentLength")

// readBody reads req's body, of the length it announces (at most h1Max),
// into a buffer of bodies, and closes it. A body of another length is
// refused, as net/http refuses it.
func readBody(req *http.Request) (*[]byte, error) {
	buf := bodies.Get().(*[]byte)
	if req.Body == nil || req.Body == http.NoBody {
		*buf = (*buf)[:0]
		return buf, nil
	}
	n := int(req.ContentLength)
	if cap(*buf) < n+1 {
		*buf = make([]byte, n+1, max(n+1, 1024))
	}
	b := (*buf)[:n+1] // one byte more, to see a longer body
	m, err := io.ReadFull(req.Body, b)
	switch {
	case err == nil, errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		err = nil
		if m != n {
			err = fmt.Errorf("%w: ContentLength=%d with a body of another length", errBodyLength, n)
		}
	default:
		err = fmt.Errorf("client: reading the request body: %w", err)
	}
	if cerr := req.Body.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("client: closing the request body: %w", cerr)
	}
	if err != nil {
		bodies.Put(buf)
		return nil, err
	}
	*buf = b[:n]
	return buf, nil
}

// serves reports whether t sends req itself, and where to.
func (t *h1Transport) serves(req *http.Request) (string, bool) {
	u := req.URL
	hasBody := req.Body != nil && req.Body != http.NoBody
	if u == nil || u.Scheme != "http" || u.Host == "" || req.ContentLength < 0 || req.ContentLength > h1Max ||
		// A client request's length 0 with a body means "unknown".
		req.ContentLength == 0 && hasBody || req.ContentLength > 0 && !hasBody ||
		len(req.TransferEncoding) > 0 || len(req.Trailer) > 0 || req.Close ||
		req.Host != "" && !httpguts.ValidHostHeader(req.Host) {
		return "", false
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodPost:
	default:
		return "", false
	}
	for k, vs := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return "", false
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return "", false
			}
		}
	}
	hostport := u.Host
	if u.Port() == "" {
		hostport = net.JoinHostPort(u.Hostname(), "80")
	}
	t.mu.Lock()
	direct, known := t.direct[hostport]
	t.mu.Unlock()
	if !known {
		direct = true
		if t.proxy != nil {
			p, err := t.proxy(req)
			direct = err == nil && p == nil
		}
		t.mu.Lock()
		t.direct[hostport] = direct
		t.mu.Unlock()
	}
	return hostport, direct
}

// conn returns a kept connection to hostport that is still open, or a new
// one.
func (t *h1Transport) conn(ctx context.Context, hostport string) (*h1Conn, error) {
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return nil, errH1Closed
		}
		idle := t.idle[hostport]
		if len(idle) == 0 {
			t.mu.Unlock()
			return t.open(ctx, hostport)
		}
		c := idle[len(idle)-1]
		idle[len(idle)-1] = nil
		t.idle[hostport] = idle[:len(idle)-1]
		t.mu.Unlock()
		if c.peerClosed() {
			c.nc.Close()
			continue
		}
		c.reused = true
		return c, nil
	}
}

// open dials a new connection to hostport.
func (t *h1Transport) open(ctx context.Context, hostport string) (*h1Conn, error) {
	nc, err := t.dial(ctx, "tcp", hostport)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
			// Why the context ended, as a round trip says it, and which
			// dial it cut short.
			return nil, fmt.Errorf("%w: %w", cause, err)
		}
		return nil, err
	}
	cc := &byteCounter{nc: nc}
	c := &h1Conn{nc: nc, cc: cc, hostport: hostport, br: bufio.NewReaderSize(cc, h1ReadBuf), bw: bufio.NewWriterSize(cc, h1WriteBuf)}
	if sc, ok := nc.(syscall.Conn); ok {
		c.raw, _ = sc.SyscallConn()
	}
	return c, nil
}

// put keeps c for the next round trip to its host, or closes it.
func (t *h1Transport) put(c *h1Conn) {
	t.mu.Lock()
	if !t.closed && len(t.idle[c.hostport]) < t.maxIdle {
		t.idle[c.hostport] = append(t.idle[c.hostport], c)
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	c.nc.Close()
}

// CloseIdleConnections closes the kept connections; a connection in use is
// closed when its round trip ends.
func (t *h1Transport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = make(map[string][]*h1Conn)
	t.mu.Unlock()
	for _, cs := range idle {
		for _, c := range cs {
			c.nc.Close()
		}
	}
	if f, ok := t.fallback.(interface{ CloseIdleConnections() }); ok {
		f.CloseIdleConnections()
	}
}

// close closes the idle connections and keeps no connection from then on.
func (t *h1Transport) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.CloseIdleConnections()
}

// unsentError is a round trip's failure before a byte of its request was
// written. Only such a failure is sent again (on a new connection, when the
// failed one had been kept), as net/http's Transport does for a request
// without an idempotency header: a request that was written may have been
// served, and whether to repeat it is the caller's call.
type unsentError struct{ err error }

func (e *unsentError) Error() string { return "client: request not sent: " + e.err.Error() }
func (e *unsentError) Unwrap() error { return e.err }

// sent reports whether the request of a failed round trip may have reached
// the server.
func sent(err error) bool {
	var u *unsentError
	return !errors.As(err, &u)
}

// unansweredError is a round trip's failure after its request was written
// and before a byte of the answer came: the connection ended.
type unansweredError struct{ err error }

func (e *unansweredError) Error() string {
	return "client: connection closed before an answer: " + e.err.Error()
}
func (e *unansweredError) Unwrap() error { return e.err }

// unanswered reports whether a failed round trip ended before a byte of
// its answer was read.
func unanswered(err error) bool {
	var u *unansweredError
	return errors.As(err, &u)
}

// idempotent reports whether req may be sent twice: net/http's rule for
// the methods h1Transport serves (a POST is not).
func idempotent(req *http.Request) bool {
	return req.Method == "" || req.Method == http.MethodGet
}

// roundTrip sends req on c and reads its response. It owns c: the response
// body returns it to t, and a failure closes it.
func (t *h1Transport) roundTrip(ctx context.Context, c *h1Conn, req *http.Request, body []byte) (*http.Response, error) {
	// The context ends a blocked read or write by moving the deadline.
	stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(aLongTimeAgo) })
	fail := func(err error) (*http.Response, error) {
		stop()
		c.nc.Close()
		if ctx.Err() != nil {
			// Why the context ended, as net/http's Transport says.
			return nil, context.Cause(ctx)
		}
		return nil, err
	}
	c.cc.written, c.cc.read = 0, 0
	if err := c.writeRequest(req, body); err != nil {
		if c.cc.written == 0 {
			return fail(&unsentError{err: err})
		}
		return fail(err)
	}
	fresh := c.br.Buffered() == 0 // no byte of the answer read yet
	for {
		resp, err := http.ReadResponse(c.br, req)
		if err != nil {
			if fresh && c.cc.read == 0 && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)) {
				return fail(&unansweredError{err: err})
			}
			return fail(err)
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			// An informational answer before the real one: net/http's
			// Transport skips it too.
			continue
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return fail(fmt.Errorf("client: unexpected %s", resp.Status))
		}
		b := &h1Body{t: t, c: c, body: resp.Body, stop: stop, keep: !resp.Close}
		if resp.Body == http.NoBody {
			// Nothing to read (a 204, a Content-Length of 0): the round
			// trip ends here.
			b.release(b.keep)
			return resp, nil
		}
		resp.Body = b
		return resp, nil
	}
}

// writeRequest writes req, whose body is body, on c in one write: its
// request line, headers and body.
func (c *h1Conn) writeRequest(req *http.Request, body []byte) error {
	w := c.bw
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	w.WriteString(method)
	w.WriteByte(' ')
	w.WriteString(req.URL.RequestURI())
	w.WriteString(" HTTP/1.1\r\nHost: ")
	w.WriteString(host)
	w.WriteString("\r\n")
	for k, vs := range req.Header {
		switch k {
		case "Host", "Content-Length", "Connection", "Transfer-Encoding":
			continue // written here, or not a client's to send
		}
		for _, v := range vs {
			w.WriteString(k)
			w.WriteString(": ")
			w.WriteString(v)
			w.WriteString("\r\n")
		}
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		w.WriteString("User-Agent: Go-http-client/1.1\r\n")
	}
	if len(body) > 0 || method == http.MethodPost {
		w.WriteString("Content-Length: ")
		var num [20]byte
		w.Write(strconv.AppendInt(num[:0], int64(len(body)), 10))
		w.WriteString("\r\n")
	}
	w.WriteString("\r\n")
	w.Write(body)
	return w.Flush()
}

// h1Body is a response body: read to its end, it returns its connection to
// the transport.
type h1Body struct {
	t    *h1Transport
	c    *h1Conn
	body io.ReadCloser
	stop func() bool
	keep bool // the connection may serve another request
	done bool // c was returned or closed
}

func (b *h1Body) Read(p []byte) (int, error) {
	if b.done {
		return 0, errors.New("http: read on closed response body")
	}
	n, err := b.body.Read(p)
	if err == io.EOF {
		b.release(b.keep)
	} else if err != nil {
		b.release(false)
	}
	return n, err
}

func (b *h1Body) Close() error {
	if !b.done {
		// Unread bytes would be read as the next response: the
		// connection goes.
		b.release(false)
	}
	return nil
}

// release ends the round trip: the connection goes back to the transport
// when keep and when its context did not move its deadline, else it is
// closed.
func (b *h1Body) release(keep bool) {
	b.done = true
	if b.stop() && keep {
		b.t.put(b.c)
		return
	}
	b.c.nc.Close()
}
