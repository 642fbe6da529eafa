package client

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/internal/wait"
)

// h1Server is an HTTP server that counts the connections clients open and
// answers with what handle writes.
type h1Server struct {
	*httptest.Server
	conns atomic.Int64
}

func newH1Server(t *testing.T, handle http.HandlerFunc) *h1Server {
	t.Helper()
	s := &h1Server{}
	s.Server = httptest.NewUnstartedServer(handle)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// echo answers with the request's method, body and one header.
func echo(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("X-Got", r.Header.Get("X-Send"))
	io.WriteString(w, r.Method+" "+r.URL.RequestURI()+" "+string(b))
}

// recordingRT is a fallback transport that records what reaches it.
type recordingRT struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (r *recordingRT) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	r.mu.Unlock()
	if req.Body != nil {
		req.Body.Close()
	}
	return &http.Response{StatusCode: 299, Body: http.NoBody, Request: req}, nil
}

func (r *recordingRT) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reqs)
}

// call sends one request through rt and returns the response's status and
// body.
func call(t *testing.T, ctx context.Context, rt http.RoundTripper, method, url, body string) (int, string, error) {
	t.Helper()
	var rb io.Reader
	if body != "" {
		rb = &streamBody{r: strings.NewReader(body)}
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rb)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("X-Send", "v")
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b), err
}

// TestH1RoundTripsKeepOneConnection: sequential calls are answered in full
// on one kept connection, each request in one write.
func TestH1RoundTripsKeepOneConnection(t *testing.T) {
	srv := newH1Server(t, echo)
	rt := newH1Transport(&recordingRT{}, nil, 4)
	defer rt.close()
	var writes atomic.Int64
	d := &net.Dialer{}
	rt.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: &writes}, nil
	}
	for i := range 20 {
		code, body, err := call(t, context.Background(), rt, http.MethodPost, srv.URL+"/p/q?x=1", strings.Repeat("b", 180+i))
		if err != nil {
			t.Fatal(err)
		}
		if want := "POST /p/q?x=1 " + strings.Repeat("b", 180+i); code != 200 || body != want {
			t.Fatalf("call %d: %d %q, want 200 %q", i, code, body, want)
		}
	}
	if code, body, err := call(t, context.Background(), rt, http.MethodGet, srv.URL+"/g", ""); err != nil || code != 200 || body != "GET /g " {
		t.Fatalf("GET: %d %q %v", code, body, err)
	}
	if n := srv.conns.Load(); n != 1 {
		t.Errorf("21 sequential calls opened %d connections, want 1", n)
	}
	if n := writes.Load(); n != 21 {
		t.Errorf("21 calls made %d writes, want one each", n)
	}
}

// TestH1ServerClosedKeptConnection: a kept connection the server closed is
// not used: the next call succeeds on a new one.
func TestH1ServerClosedKeptConnection(t *testing.T) {
	srv := newH1Server(t, echo)
	rt := newH1Transport(&recordingRT{}, nil, 4)
	defer rt.close()
	for i := range 3 {
		if _, _, err := call(t, context.Background(), rt, http.MethodPost, srv.URL, "x"); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		srv.CloseClientConnections()
		// The close must have reached the client's side before the next
		// call for the peek to see it: wait for the end of stream there.
		waitClosed(t, rt, srv.Listener.Addr().String())
	}
	if n := srv.conns.Load(); n != 3 {
		t.Errorf("%d connections, want 3 (one per call)", n)
	}
}

// waitClosed waits until the kept connection to hostport reads as closed.
func waitClosed(t *testing.T, rt *h1Transport, hostport string) {
	t.Helper()
	rt.mu.Lock()
	idle := append([]*h1Conn(nil), rt.idle[hostport]...)
	rt.mu.Unlock()
	for _, c := range idle {
		waitFor(t, "the server's close to reach the kept connection", c.peerClosed)
	}
}

// waitFor waits for an event: see wait.For.
var waitFor = wait.For

// TestH1UnsentIsRetriedOnANewConnection: when a kept connection fails
// before a byte of the request was written, the request goes out on a new
// connection; one that fails after is not sent again.
func TestH1UnsentIsRetriedOnANewConnection(t *testing.T) {
	var served atomic.Int64
	srv := newH1Server(t, func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		echo(w, r)
	})
	rt := newH1Transport(&recordingRT{}, nil, 4)
	defer rt.close()
	if _, _, err := call(t, context.Background(), rt, http.MethodPost, srv.URL, "a"); err != nil {
		t.Fatal(err)
	}
	// Break the kept connection so that writes fail at once: closing our
	// own end makes every write fail with nothing written.
	hostport := srv.Listener.Addr().String()
	rt.mu.Lock()
	kept := rt.idle[hostport][0]
	rt.mu.Unlock()
	kept.raw = nil // the peek would see the close; skip it to reach the write
	kept.nc.Close()
	if _, body, err := call(t, context.Background(), rt, http.MethodPost, srv.URL, "b"); err != nil || body != "POST / b" {
		t.Fatalf("after a failed write on a kept connection: %q, %v; want the call sent again and answered", body, err)
	}
	if n := served.Load(); n != 2 {
		t.Fatalf("the server served %d requests, want 2", n)
	}
}

// TestH1ContextEndsARoundTrip: a caller's cancellation ends a call waiting
// for its answer, with the cancellation's cause (as net/http's Transport
// reports it), and its connection is not kept.
func TestH1ContextEndsARoundTrip(t *testing.T) {
	release := make(chan struct{})
	srv := newH1Server(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
		}
		echo(w, r)
	})
	defer close(release)
	rt := newH1Transport(&recordingRT{}, nil, 4)
	defer rt.close()
	ctx, cancelCause := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := call(t, ctx, rt, http.MethodPost, srv.URL+"/slow", "x")
		done <- err
	}()
	waitFor(t, "the call's connection", func() bool { return srv.conns.Load() > 0 })
	errGaveUp := errors.New("gave up")
	cancelCause(errGaveUp)
	select {
	case err := <-done:
		if !errors.Is(err, errGaveUp) {
			t.Fatalf("cancelled call: %v, want its cause", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a cancelled call did not end")
	}
	if _, _, err := call(t, context.Background(), rt, http.MethodPost, srv.URL, "y"); err != nil {
		t.Fatal(err)
	}
	if n := srv.conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2: the cancelled call's must not be kept", n)
	}

	// A deadline passed before the call: nothing is sent.
	ctx, cancel := context.WithTimeout(context.Background(), -time.Second)
	defer cancel()
	if _, _, err := call(t, ctx, rt, http.MethodPost, srv.URL, "z"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("expired context: %v, want context.DeadlineExceeded", err)
	}
}

// TestH1ContextEndsADial: a context that ends while the connection is
// still being dialled ends the call with its cause too, as it does a round
// trip (the dial is held until the context ends, as a dial to a slow peer).
func TestH1ContextEndsADial(t *testing.T) {
	rt := newH1Transport(&recordingRT{}, nil, 4)
	defer rt.close()
	dialing := make(chan struct{})
	rt.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		close(dialing)
		<-ctx.Done()
		return nil, &net.OpError{Op: "dial", Net: network, Err: ctx.Err()} // as net.Dialer says it
	}
	ctx, cancelCause := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := call(t, ctx, rt, http.MethodPost, "http://127.0.0.1:1/x", "x")
		done <- err
	}()
	<-dialing
	errGaveUp := errors.New("gave up")
	cancelCause(errGaveUp)
	if err := <-done; !errors.Is(err, errGaveUp) {
		t.Fatalf("call cancelled while dialling: %v, want its cause", err)
	}
}

// TestH1ResponseBodies: a body closed unread costs its connection (its
// bytes would be read as the next answer), chunked and close-delimited
// answers are read whole.
func TestH1ResponseBodies(t *testing.T) {
	srv := newH1Server(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/chunked":
			w.Write([]byte("part1-"))
			w.(http.Flusher).Flush()
			w.Write([]byte("part2"))
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		case "/close":
			w.Header().Set("Connection", "close")
			w.Write([]byte("bye"))
		default:
			w.Write([]byte(strings.Repeat("z", 5000)))
		}
	})
	rt := newH1Transport(&recordingRT{}, nil, 4)
	defer rt.close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/big", nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := resp.Body.Read(buf); err == nil {
		t.Error("a read after Close succeeded")
	}
	// An answer without a body keeps its connection even if its (empty)
	// body is only closed.
	for range 3 {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/empty", nil)
		resp, err := rt.RoundTrip(req)
		if err != nil || resp.StatusCode != http.StatusNoContent {
			t.Fatalf("/empty: %v, %v", resp, err)
		}
		resp.Body.Close()
	}
	for _, path := range []string{"/chunked", "/close", "/big"} {
		_, body, err := call(t, context.Background(), rt, http.MethodGet, srv.URL+path, "")
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		want := map[string]string{"/chunked": "part1-part2", "/close": "bye", "/big": strings.Repeat("z", 5000)}[path]
		if body != want {
			t.Fatalf("%s: got %d bytes, want %d", path, len(body), len(want))
		}
	}
	// Connections: the first (closed unread), the one the empty answers
	// and /chunked shared, which the server closed after /close, and the
	// one /big took then.
	if n := srv.conns.Load(); n != 3 {
		t.Errorf("%d connections, want 3", n)
	}
}

// TestH1Fallback: what h1Transport does not serve the way net/http would
// goes to the fallback transport untouched.
func TestH1Fallback(t *testing.T) {
	fb := &recordingRT{}
	rt := newH1Transport(fb, nil, 4)
	defer rt.close()
	mk := func(method, url string, body io.Reader, n int64, edit func(*http.Request)) *http.Request {
		req, _ := http.NewRequest(method, url, body)
		req.ContentLength = n
		if edit != nil {
			edit(req)
		}
		return req
	}
	cases := map[string]*http.Request{
		"https":          mk(http.MethodPost, "https://127.0.0.1:1/x", strings.NewReader("a"), 1, nil),
		"unknown length": mk(http.MethodPost, "http://127.0.0.1:1/x", &streamBody{r: strings.NewReader("a")}, -1, nil),
		"zero with body": mk(http.MethodPost, "http://127.0.0.1:1/x", &streamBody{r: strings.NewReader("a")}, 0, nil),
		"large body":     mk(http.MethodPost, "http://127.0.0.1:1/x", strings.NewReader(strings.Repeat("a", h1Max+1)), h1Max+1, nil),
		"PUT":            mk(http.MethodPut, "http://127.0.0.1:1/x", nil, 0, nil),
		"bad header":     mk(http.MethodGet, "http://127.0.0.1:1/x", nil, 0, func(r *http.Request) { r.Header.Set("X-Bad", "a\r\nInjected: 1") }),
		"close":          mk(http.MethodGet, "http://127.0.0.1:1/x", nil, 0, func(r *http.Request) { r.Close = true }),
		"bad host":       mk(http.MethodGet, "http://127.0.0.1:1/x", nil, 0, func(r *http.Request) { r.Host = "a\r\nInjected: 1" }),
		"trailer":        mk(http.MethodGet, "http://127.0.0.1:1/x", nil, 0, func(r *http.Request) { r.Trailer = http.Header{"X-T": nil} }),
	}
	for name, req := range cases {
		before := fb.count()
		resp, err := rt.RoundTrip(req)
		if err != nil || resp.StatusCode != 299 || fb.count() != before+1 {
			t.Errorf("%s: %v, %v: want it passed to the fallback transport", name, resp, err)
		}
	}
	proxied := newH1Transport(fb, func(r *http.Request) (*url.URL, error) {
		if r.URL.Hostname() == "127.0.0.1" {
			return nil, nil
		}
		return url.Parse("http://127.0.0.1:1")
	}, 4)
	defer proxied.close()
	before := fb.count()
	if resp, err := proxied.RoundTrip(mk(http.MethodGet, "http://walcast.example:7070/x", nil, 0, nil)); err != nil || resp.StatusCode != 299 || fb.count() != before+1 {
		t.Errorf("a URL the fallback's proxy serves: %v, %v: want it passed to the fallback transport", resp, err)
	}
}

// TestH1RefusesABodyOfAnotherLength: a body longer or shorter than its
// announced length fails the call, as in net/http, and closes the body.
func TestH1RefusesABodyOfAnotherLength(t *testing.T) {
	srv := newH1Server(t, echo)
	rt := newH1Transport(&recordingRT{}, nil, 4)
	defer rt.close()
	for _, b := range []string{"short", "much too long"} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, &streamBody{r: strings.NewReader(b)})
		req.ContentLength = 7
		if _, err := rt.RoundTrip(req); !errors.Is(err, errBodyLength) {
			t.Errorf("a body of %d bytes announced as 7: got %v, want errBodyLength", len(b), err)
		}
	}
	failing := &closeTracker{err: errors.New("disk on fire")}
	req, _ := http.NewRequest(http.MethodPost, srv.URL, failing)
	req.ContentLength = 10
	if _, err := rt.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("a body that fails to read: got %v, want its error", err)
	}
	if !failing.closed {
		t.Fatal("the failed body was not closed")
	}
	if _, body, err := call(t, context.Background(), rt, http.MethodPost, srv.URL, "ok"); err != nil || body != "POST / ok" {
		t.Fatalf("after the refusals: %q, %v", body, err)
	}
}

// TestH1Closed: a closed transport keeps nothing and sends nothing.
func TestH1Closed(t *testing.T) {
	srv := newH1Server(t, echo)
	rt := newH1Transport(&recordingRT{}, nil, 4)
	if _, _, err := call(t, context.Background(), rt, http.MethodPost, srv.URL, "a"); err != nil {
		t.Fatal(err)
	}
	rt.close()
	if _, _, err := call(t, context.Background(), rt, http.MethodPost, srv.URL, "b"); !errors.Is(err, errH1Closed) {
		t.Fatalf("a call after close: %v, want errH1Closed", err)
	}
}

// TestH1GetSentAgainWhenAKeptConnectionEndsUnanswered: a server may close
// a kept connection as idle just as a request goes out on it. The request
// was written but not answered: a GET (the liveness check's) is sent again
// on a new connection, as net/http does; a POST, which may have been
// served, is not.
func TestH1GetSentAgainWhenAKeptConnectionEndsUnanswered(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		t.Run(method, func(t *testing.T) {
			var served atomic.Int64
			srv := newH1Server(t, func(w http.ResponseWriter, r *http.Request) {
				if served.Add(1) == 2 {
					// The second request: close without a byte of answer.
					conn, _, err := http.NewResponseController(w).Hijack()
					if err == nil {
						conn.Close()
					}
					return
				}
				echo(w, r)
			})
			rt := newH1Transport(&recordingRT{}, nil, 4)
			defer rt.close()
			body := ""
			if method == http.MethodPost {
				body = "p"
			}
			if _, _, err := call(t, context.Background(), rt, method, srv.URL, body); err != nil {
				t.Fatal(err)
			}
			_, got, err := call(t, context.Background(), rt, method, srv.URL, body)
			switch method {
			case http.MethodGet:
				if err != nil || got != "GET / " {
					t.Fatalf("GET on a kept connection closed unanswered: %q, %v; want it sent again and answered", got, err)
				}
				if n := served.Load(); n != 3 {
					t.Fatalf("the server saw %d requests, want 3", n)
				}
			default:
				if !unanswered(err) {
					t.Fatalf("POST on a kept connection closed unanswered: %q, %v; want the failure, unanswered", got, err)
				}
				if n := served.Load(); n != 2 {
					t.Fatalf("the server saw %d requests, want 2: a POST is not sent twice", n)
				}
			}
		})
	}
}
