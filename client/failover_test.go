package client_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/server"
	"github.com/walcast/walcast/server/apitest"
)

// frozenAddr returns the URL of a coordinator that froze: the kernel still
// accepts its connections (as for a SIGSTOPped process) but nothing ever
// answers, /healthz included.
func frozenAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return "http://" + ln.Addr().String()
}

// fastLiveness checks a slow attempt's coordinator after 50ms and gives it
// 100ms to answer.
var fastLiveness = client.WithLiveness(50*time.Millisecond, 100*time.Millisecond)

// TestFrozenCoordinatorIsAbandoned: an attempt at a coordinator that
// stopped answering is abandoned once it fails a liveness check, long
// before the attempt timeout, and the keyed call goes on at the next
// address; the frozen one is not tried again.
func TestFrozenCoordinatorIsAbandoned(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		srv := apitest.Serve(t, app.StaticLeader(env.Open()), nil)
		c := newClient(t, p, []string{frozenAddr(t), srv.URL}, fastLiveness, client.WithAttemptTimeout(time.Hour))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		req := newReq()
		req.Scope = client.CollectionScope(7)
		res, err := c.Broadcast(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		// The attempt timeout is a third of the minute left: the attempt
		// was abandoned by the check, not by the timeout.
		if res.Attempts != 2 || time.Since(start) >= 20*time.Second {
			t.Fatalf("attempts %d after %v", res.Attempts, time.Since(start))
		}
		if res, err := c.Broadcast(ctx, newReq()); err != nil || res.Attempts != 1 {
			t.Fatalf("next call: %+v, %v", res, err)
		}
	})
}

// TestStandbyNamingAFrozenLeaderIsNotFollowed: during a failover the
// standby names the old, frozen leader until its lease expires; the client
// does not go back to it, and is served as soon as the standby leads.
func TestStandbyNamingAFrozenLeaderIsNotFollowed(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		b := env.Open()
		frozen := frozenAddr(t)
		var leads atomic.Bool
		var standbyCalls atomic.Int64
		standby := apitest.Serve(t, app.LeaderFunc(func() (*broadcast.Broadcaster, error) {
			if standbyCalls.Add(1) >= 4 {
				leads.Store(true)
			}
			if !leads.Load() {
				return nil, &server.NotLeaderError{Leader: frozen}
			}
			return b, nil
		}), nil)
		c := newClient(t, p, []string{frozen, standby.URL}, fastLiveness)
		req := newReq()
		req.Scope = client.CollectionScope(8)
		res, err := c.Broadcast(ctxT(t), req)
		if err != nil {
			t.Fatal(err)
		}
		// Attempt 1 hung at the frozen leader; every later one went to
		// the standby (3 "not the leader", then served).
		if res.Attempts != 5 || standbyCalls.Load() != 4 {
			t.Fatalf("attempts %d, standby calls %d", res.Attempts, standbyCalls.Load())
		}
	})
}

// TestUnreachableEndsEarly: with WithUnreachable, a call to an address where
// nothing listens ends once no coordinator could be connected to for that
// long, saying so, instead of retrying until the caller's deadline.
func TestUnreachableEndsEarly(t *testing.T) {
	c := newClient(t, protocols[0], []string{deadAddr(t)}, client.WithUnreachable(200*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := c.GetTask(ctx, 1)
	var ce *client.Error
	if !errors.Is(err, client.ErrUnreachable) || !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, client.ErrTaskNotCreated) ||
		!errors.As(err, &ce) || ce.Attempts < 2 || ctx.Err() != nil {
		t.Fatalf("error %v (context %v)", err, ctx.Err())
	}
}

// TestUnreachableKeepsRetryingWhileACoordinatorAnswers: a standby that
// answers "not the leader" makes a leader change plausible, so an
// unreachable leader does not end the call early: it ends with the caller's
// context.
func TestUnreachableKeepsRetryingWhileACoordinatorAnswers(t *testing.T) {
	dead := deadAddr(t)
	standby := apitest.Serve(t, app.LeaderFunc(func() (*broadcast.Broadcaster, error) {
		return nil, &server.NotLeaderError{Leader: dead}
	}), nil)
	c := newClient(t, protocols[0], []string{dead, standby.URL}, client.WithUnreachable(50*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := c.GetTask(ctx, 1)
	if errors.Is(err, client.ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v", err)
	}
}

// TestLivenessCheckSparesASlowCoordinator: a coordinator that answers its
// checks is not abandoned, however long the call takes.
func TestLivenessCheckSparesASlowCoordinator(t *testing.T) {
	env := apitest.New(t)
	b := env.Open()
	env.SetCallback(func(ctx context.Context, _ *broadcast.Event) error {
		select {
		case <-time.After(400 * time.Millisecond): // eight liveness intervals
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	var healthz atomic.Int64
	mux := http.NewServeMux()
	path, h := server.NewBroadcastHandler(app.StaticLeader(b))
	mux.Handle(path, h)
	mux.HandleFunc("GET /healthz", func(http.ResponseWriter, *http.Request) { healthz.Add(1) })
	srv := apitest.ServeHandler(t, mux)
	c := newClient(t, protocols[0], []string{srv.URL}, fastLiveness)
	req := newReq()
	req.Scope = client.CollectionScope(9)
	res, err := c.Broadcast(ctxT(t), req)
	if err != nil || res.Attempts != 1 || res.Duplicated || healthz.Load() == 0 {
		t.Fatalf("result %+v, %v; %d checks", res, err, healthz.Load())
	}
}

// bannerAddr returns the URL of a server that does not speak HTTP: like a
// NATS server, it writes a line of its own to every connection.
func bannerAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_, _ = conn.Write([]byte(`INFO {"server_id":"NDXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX","server_name":"nats","jetstream":true}` + "\r\n"))
				_, _ = io.Copy(io.Discard, conn) // until the client hangs up
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// TestForeignServerIsNoCoordinator: an address where something that does
// not speak HTTP answers (the NATS port given for the API's) is treated as
// one where no coordinator listens: the call goes on at another address,
// and with no other it ends as unreachable (WithUnreachable), saying what
// answered, its quote of the answer cut short. An HTTP server without the
// API (a metrics port) is refused at once, saying so.
func TestForeignServerIsNoCoordinator(t *testing.T) {
	banner := bannerAddr(t)
	c := newClient(t, protocols[0], []string{banner}, client.WithUnreachable(100*time.Millisecond))
	start := time.Now()
	_, err := c.GetTask(ctxT(t), 1)
	quoted := strings.Contains(err.Error(), "malformed HTTP") // else the greeting came before the request
	if !errors.Is(err, client.ErrUnreachable) || !strings.Contains(err.Error(), "does not speak HTTP") ||
		quoted && (!strings.Contains(err.Error(), `XXX..."`) || strings.Contains(err.Error(), "jetstream")) {
		t.Fatalf("error %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("failed after %v", d)
	}

	env := apitest.New(t)
	srv := apitest.Serve(t, app.StaticLeader(env.Open()), nil)
	c = newClient(t, protocols[0], []string{banner, srv.URL}, client.WithUnreachable(time.Minute))
	if _, err := c.ListTypes(ctxT(t)); err != nil {
		t.Fatalf("with a coordinator at the second address: %v", err)
	}

	metrics := apitest.ServeHandler(t, http.NotFoundHandler())
	c = newClient(t, protocols[0], []string{metrics.URL})
	_, err = c.GetTask(ctxT(t), 1)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Attempts != 1 || !strings.Contains(err.Error(), "HTTP 404: the server at this address has no such walcast API") {
		t.Fatalf("an HTTP server without the API: %v", err)
	}
}

// TestR8_5_ClientFollowsThePromotedPrimary: a client configured with the
// addresses of a superseded primary and of the cluster promoted over it
// gets "superseded" from the first and moves to the second with the same
// call (a keyed one keeps its key; an unkeyed one too, since nothing was
// done); a client of the superseded primary alone gets ErrSuperseded,
// naming the new primary, and so does one whose every address refuses.
func TestR8_5_ClientFollowsThePromotedPrimary(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		superseded := func() string {
			return apitest.Serve(t, app.LeaderFunc(func() (*broadcast.Broadcaster, error) {
				return nil, &server.SupersededError{Cluster: "east", By: "west", Generation: 1, PromotedAt: time.Now()}
			}), nil).URL
		}
		east, west := superseded(), apitest.Serve(t, app.StaticLeader(env.Open()), nil).URL
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := newClient(t, p, []string{east, west})
		keyed := newReq()
		keyed.Scope, keyed.ClientKey = client.CollectionScope(7), "retry-me"
		res, err := c.Broadcast(ctx, keyed)
		if err != nil || res.Attempts != 2 {
			t.Fatalf("keyed broadcast through the superseded primary first: %+v, %v", res, err)
		}
		again, err := newClient(t, p, []string{east, west}).Broadcast(ctx, keyed)
		if err != nil || !again.Duplicated || again.BroadcastID != res.BroadcastID {
			t.Fatalf("the retry of the key at the promoted primary: %+v, %v; want the original %d", again, err, res.BroadcastID)
		}
		if res, err := newClient(t, p, []string{east, west}).Broadcast(ctx, newReq()); err != nil || res.Attempts != 2 {
			t.Fatalf("unkeyed broadcast through the superseded primary first: %+v, %v", res, err)
		}
		for _, addrs := range [][]string{{east}, {east, superseded()}} {
			_, err := newClient(t, p, addrs).Broadcast(ctx, newReq())
			var ce *client.Error
			if !errors.Is(err, client.ErrSuperseded) || !errors.Is(err, client.ErrNotPrimary) || !errors.As(err, &ce) || ce.Primary != "west" ||
				ce.Attempts != len(addrs) || !strings.Contains(err.Error(), "follow west or reset") {
				t.Fatalf("%d superseded addresses: %v (%+v), want ErrSuperseded naming west after %d attempts", len(addrs), err, ce, len(addrs))
			}
		}
	})
}

// TestR8_5_SecondaryWithAStandbyAnswersNotPrimary: a client of a secondary
// cluster's leader and standby (the standby names the leader) gets
// ErrNotPrimary after a few attempts, not a round of redirects until its
// deadline.
func TestR8_5_SecondaryWithAStandbyAnswersNotPrimary(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		leader := apitest.Serve(t, app.LeaderFunc(func() (*broadcast.Broadcaster, error) { return nil, broadcast.ErrNotPrimary }), nil).URL
		standby := apitest.Serve(t, app.LeaderFunc(func() (*broadcast.Broadcaster, error) {
			return nil, &server.NotLeaderError{Leader: strings.TrimPrefix(leader, "http://")}
		}), nil).URL
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		_, err := newClient(t, p, []string{leader, standby}).Broadcast(ctx, newReq())
		var ce *client.Error
		if !errors.Is(err, client.ErrNotPrimary) || errors.Is(err, client.ErrSuperseded) || !errors.As(err, &ce) || ce.Attempts > 4 || time.Since(start) > 20*time.Second {
			t.Fatalf("a secondary's leader and standby: %v (%+v) after %v", err, ce, time.Since(start))
		}
	})
}
