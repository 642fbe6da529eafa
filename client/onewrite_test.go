package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// countingConn counts the writes made on a connection.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// streamBody is a request body net/http does not know to be in memory, as
// Connect's unary body is not.
type streamBody struct{ r io.Reader }

func (b *streamBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *streamBody) Close() error               { return nil }

// writesPerRequest sends n POSTs with a streamed body through rt (made from
// a transport whose connections count their writes) and returns the writes
// made, after one request that opens the connection.
func writesPerRequest(t *testing.T, wrap func(http.RoundTripper) http.RoundTripper, body string) float64 {
	t.Helper()
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Store(string(b))
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	var writes atomic.Int64
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: &writes}, nil
	}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: wrap(tr)}
	send := func() {
		req, err := http.NewRequest(http.MethodPost, srv.URL, &streamBody{r: strings.NewReader(body)})
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = int64(len(body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if s, _ := got.Load().(string); s != body {
			t.Fatalf("the server read a body of %d bytes, want the %d sent", len(s), len(body))
		}
	}
	send()
	writes.Store(0)
	const n = 20
	for range n {
		send()
	}
	return float64(writes.Load()) / n
}

// TestOneWriteSendsARequestInOneWrite: a small request with a streamed
// body (Connect's unary call) goes out in one write through oneWrite, where
// net/http alone makes two (headers, then body).
func TestOneWriteSendsARequestInOneWrite(t *testing.T) {
	body := strings.Repeat("b", 180)
	plain := writesPerRequest(t, func(rt http.RoundTripper) http.RoundTripper { return rt }, body)
	wrapped := writesPerRequest(t, func(rt http.RoundTripper) http.RoundTripper { return oneWrite{next: rt} }, body)
	if wrapped != 1 {
		t.Errorf("through oneWrite: %.2f writes per request, want 1", wrapped)
	}
	if plain <= wrapped {
		t.Errorf("net/http alone made %.2f writes per request, through oneWrite %.2f: the test no longer shows what oneWrite saves", plain, wrapped)
	}
	// A body over oneWriteMax is passed through as it is (and still arrives whole).
	big := strings.Repeat("x", oneWriteMax+1)
	if n := writesPerRequest(t, func(rt http.RoundTripper) http.RoundTripper { return oneWrite{next: rt} }, big); n < 2 {
		t.Errorf("a %d-byte body: %.2f writes per request, want it streamed as net/http does (2 or more)", len(big), n)
	}
}

// TestOneWriteKeepsTheRequest: oneWrite does not change the caller's
// request, its copy can be sent again (GetBody), and a body that fails to
// read fails the call, closed.
func TestOneWriteKeepsTheRequest(t *testing.T) {
	var sent *http.Request
	rt := oneWrite{next: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent = r
		return &http.Response{StatusCode: 200, Body: http.NoBody}, nil
	})}
	body := &streamBody{r: strings.NewReader("payload")}
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/x", body)
	req.ContentLength = 7
	if _, err := rt.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if req.Body != io.ReadCloser(body) || sent == req {
		t.Fatal("oneWrite changed the caller's request instead of sending a copy")
	}
	for range 2 {
		rc, err := sent.GetBody()
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := io.ReadAll(rc); !bytes.Equal(b, []byte("payload")) {
			t.Fatalf("GetBody gave %q, want %q", b, "payload")
		}
	}

	// A body of another length than announced fails, as in net/http.
	for _, b := range []string{"short", "much too long"} {
		req, _ = http.NewRequest(http.MethodPost, "http://127.0.0.1:1/x", &streamBody{r: strings.NewReader(b)})
		req.ContentLength = 7
		if _, err := rt.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "ContentLength=7") {
			t.Errorf("a body of %d bytes announced as 7: got %v, want a ContentLength error", len(b), err)
		}
	}

	failing := &closeTracker{err: errors.New("disk on fire")}
	req, _ = http.NewRequest(http.MethodPost, "http://127.0.0.1:1/x", failing)
	req.ContentLength = 10
	if _, err := rt.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("a body that fails to read: got %v, want its error", err)
	}
	if !failing.closed {
		t.Fatal("the failed body was not closed")
	}
}

// TestNewSendsThroughOneWrite: New's own transport serves plain HTTP/1.1
// itself (h1Transport), with oneWrite in front of net/http's for the rest;
// with TLS, oneWrite is in front.
func TestNewSendsThroughOneWrite(t *testing.T) {
	transport := func(opts ...Option) http.RoundTripper {
		c, err := New([]string{"127.0.0.1:1"}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		hc, ok := c.http.(*http.Client)
		if !ok {
			t.Fatalf("New's HTTP client is %T, want an *http.Client", c.http)
		}
		return hc.Transport
	}
	h1, ok := transport().(*h1Transport)
	if !ok {
		t.Fatalf("New's transport is %T, want *h1Transport", transport())
	}
	if _, ok := h1.fallback.(oneWrite); !ok {
		t.Fatalf("h1Transport's fallback is %T, want oneWrite", h1.fallback)
	}
	if rt := transport(WithTLS(&tls.Config{})); !isOneWrite(rt) {
		t.Fatalf("with TLS, New's transport is %T, want oneWrite", rt)
	}
}

func isOneWrite(rt http.RoundTripper) bool {
	_, ok := rt.(oneWrite)
	return ok
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type closeTracker struct {
	err    error
	closed bool
}

func (c *closeTracker) Read([]byte) (int, error) { return 0, c.err }
func (c *closeTracker) Close() error             { c.closed = true; return nil }
