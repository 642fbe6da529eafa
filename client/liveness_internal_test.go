package client

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// silentAddr returns the URL of a listener that accepts connections and
// never answers on them: a frozen coordinator.
func silentAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	return "http://" + ln.Addr().String()
}

// TestHungAttemptIsRetriedAtItsTimeout: an attempt the liveness check
// abandoned is reported as hung (and so retried), even when its own attempt
// timeout has run out by the time it returns. The transport reports the
// abandoned attempt as canceled, which, taken for the caller's own
// cancellation, ended the call for good: a keyed broadcast of the frozen
// etcd/NATS test failed with "canceled: context canceled".
func TestHungAttemptIsRetriedAtItsTimeout(t *testing.T) {
	c, err := New([]string{silentAddr(t)}, WithLiveness(20*time.Millisecond, 30*time.Millisecond), WithAttemptTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e := c.endpoint(c.target())
	err = c.attempt(context.Background(), anyTransient, e, func(ctx context.Context, _ *endpoint) error {
		<-ctx.Done() // abandoned by the check (its /healthz is never answered)
		if cause := context.Cause(ctx); !errors.Is(cause, errHung) {
			t.Errorf("the attempt ended with %v, not as hung", cause)
		}
		// Return only once the attempt's own timeout has run out: its
		// context is not reachable from here, only its deadline, which
		// the abandoned one inherited.
		dl, ok := ctx.Deadline()
		if !ok {
			t.Fatal("the attempt has no deadline")
		}
		time.Sleep(time.Until(dl) + 20*time.Millisecond)
		return context.Canceled // what the transport says of a canceled request
	})
	var hung *hungError
	if !errors.As(err, &hung) {
		t.Fatalf("attempt: %v, want a hung attempt", err)
	}
	if f := inspect(err); !f.retryable(anyTransient) {
		t.Fatalf("a hung attempt is not retried: %+v", f)
	}
}

// doneHook is a context whose Done calls hook once: it tells a test that
// a caller of alive reached its wait.
type doneHook struct {
	context.Context
	hook func()
	once atomic.Bool
}

func (d *doneHook) Done() <-chan struct{} {
	if d.once.CompareAndSwap(false, true) {
		d.hook()
	}
	return d.Context.Done()
}

// TestLivenessCheckCutShortSaysNothingToItsWaiters: callers of alive share
// one check; when the check's owner gives up (its attempt ended) before
// the coordinator answered, the check reached no verdict, and a caller
// that waited for it must not take the coordinator's earlier "down" as the
// answer: that abandoned a healthy attempt as hung.
func TestLivenessCheckCutShortSaysNothingToItsWaiters(t *testing.T) {
	asked := make(chan struct{}, 4)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	c, err := New([]string{srv.URL}, WithLiveness(time.Hour, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e := c.endpoint(c.target())
	e.setDown(true) // an earlier check failed

	owner, cancelOwner := context.WithCancel(context.Background())
	ownerUp := make(chan bool, 1)
	go func() { ownerUp <- c.alive(owner, e) }()
	<-asked // the owner's check waits for the coordinator's answer

	// The waiter cancels the owner's check once it waits for it.
	waiter := &doneHook{Context: context.Background(), hook: cancelOwner}
	if !c.alive(waiter, e) {
		t.Error("a waiter of a check cut short reported the coordinator dead")
	}
	if !<-ownerUp {
		t.Error("a check cut short by its owner's context reported the coordinator dead")
	}
	if !e.isDown() {
		t.Error("a check cut short changed the coordinator's state")
	}
}

// TestLivenessCheckKeepsItsConnection: a check reads /healthz's short
// answer to its end, so that its connection is kept for the next call
// instead of closed (a body closed unread costs its connection).
func TestLivenessCheckKeepsItsConnection(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c, err := New([]string{srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e := c.endpoint(c.target())
	for i := range 3 {
		if !c.alive(context.Background(), e) {
			t.Fatalf("check %d: a coordinator that answers reported dead", i)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("three checks opened %d connections, want 1", n)
	}
}
