package nats

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/message"
)

// apiRelay stands between a log and the real server's JetStream API: it
// passes every request on to $JS.API (the server answers the requester),
// except that it leaves the next drop requests whose subject starts with
// prefix unanswered, as servers moving leaders may: not passed on, or with
// lose, passed on and the answer lost. seen counts the requests of prefix
// since the last arm.
type apiRelay struct {
	prefix     string
	lose       atomic.Bool
	drop, seen atomic.Int64
}

// arm makes the relay leave the next n requests of its prefix unanswered
// (lose: passed on, the answer lost) and restarts its count.
func (r *apiRelay) arm(n int64, lose bool) {
	r.lose.Store(lose)
	r.seen.Store(0)
	r.drop.Store(n)
}

// relayAPI points l's JetStream API at a new apiRelay of requests whose
// subject starts with prefix.
func relayAPI(t *testing.T, l *Log, srv *embednats.Server, prefix string) *apiRelay {
	t.Helper()
	nc, err := natsgo.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	r := &apiRelay{prefix: prefix}
	if _, err := nc.Subscribe("$RELAY.API.>", func(m *natsgo.Msg) {
		subject := "$JS.API." + strings.TrimPrefix(m.Subject, "$RELAY.API.")
		reply := m.Reply
		if strings.HasPrefix(subject, r.prefix) {
			r.seen.Add(1)
			if r.drop.Add(-1) >= 0 {
				if !r.lose.Load() {
					return
				}
				reply = natsgo.NewInbox() // nobody listens
			}
		}
		_ = nc.PublishRequest(subject, reply, m.Data)
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.NewWithAPIPrefix(l.nc, "$RELAY.API", jetstream.WithDefaultTimeout(l.reqTimeout))
	if err != nil {
		t.Fatal(err)
	}
	l.js = js
	return r
}

// impatientLog starts a server and a log of its pchannel "p" whose
// requests time out after 300 ms.
func impatientLog(t *testing.T) (*embednats.Server, *Log) {
	t.Helper()
	srv := startServer(t, embednats.Config{})
	l, err := New(tctx(t), Config{URL: srv.ClientURL(), PChannels: []message.PChannel{"p"}, RequestTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return srv, l
}

// TestUnansweredStreamInfoIsRetried: a stream info request (End,
// StreamInfo) that no server answers costs a caller with a deadline one
// RequestTimeout, not its whole deadline: the request is sent again and
// the answer to that one returned. Without a deadline it is one attempt,
// bounded by RequestTimeout, as before.
func TestUnansweredStreamInfoIsRetried(t *testing.T) {
	srv, l := impatientLog(t)
	if _, err := l.Append(tctx(t), "p", "id-1", []byte("one")); err != nil {
		t.Fatal(err)
	}

	relay := relayAPI(t, l, srv, "$JS.API.STREAM.INFO.")
	relay.arm(1, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	end, err := l.End(ctx, "p")
	if err != nil || end != 1 {
		t.Fatalf("End after an unanswered request: %d, %v", end, err)
	}
	if n := relay.seen.Load(); n != 2 {
		t.Fatalf("%d stream info requests, want 2 (the unanswered one, then its retry)", n)
	}
	if ctx.Err() != nil {
		t.Fatal("End waited for the caller's whole deadline")
	}

	relay.arm(1, false)
	info, err := l.StreamInfo(ctx, "p")
	if err != nil || info.State.Msgs != 1 || relay.seen.Load() != 2 {
		t.Fatalf("StreamInfo after an unanswered request: %v, %v (%d requests)", err, info.State, relay.seen.Load())
	}

	// No deadline: one attempt, which JetStream ends after RequestTimeout.
	relay.arm(1, false)
	if _, err := l.End(context.Background(), "p"); !errors.Is(err, context.DeadlineExceeded) || relay.seen.Load() != 1 {
		t.Fatalf("End without a deadline, unanswered: %v (%d requests), want one attempt ending in its timeout", err, relay.seen.Load())
	}
}

// TestUnansweredConsumerCreateIsRetried: a cursor's consumer creation that
// gets no answer costs a caller with a deadline one RequestTimeout and is
// sent again, and one whose answer was lost after the server created the
// consumer leaves no second consumer behind: the retry names the same one.
func TestUnansweredConsumerCreateIsRetried(t *testing.T) {
	srv, l := impatientLog(t)
	for _, d := range []string{"one", "two"} {
		if _, err := l.Append(tctx(t), "p", "id-"+d, []byte(d)); err != nil {
			t.Fatal(err)
		}
	}
	admin, err := jetstream.New(l.nc)
	if err != nil {
		t.Fatal(err)
	}
	consumers := func() int {
		t.Helper()
		s, err := admin.Stream(tctx(t), l.chans["p"].stream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(tctx(t))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Consumers
	}
	relay := relayAPI(t, l, srv, "$JS.API.CONSUMER.CREATE.")
	for _, lose := range []bool{false, true} {
		relay.arm(1, lose)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cur, err := l.Read(ctx, "p", 1)
		if err != nil {
			cancel()
			t.Fatalf("lose=%v: Read after an unanswered consumer creation: %v", lose, err)
		}
		if n := relay.seen.Load(); n != 2 {
			t.Errorf("lose=%v: %d consumer creations, want 2 (the unanswered one, then its retry)", lose, n)
		}
		if ctx.Err() != nil {
			t.Errorf("lose=%v: Read waited for the caller's whole deadline", lose)
		}
		off, data, err := cur.Next(ctx)
		if err != nil || off != 1 || string(data) != "two" {
			t.Errorf("lose=%v: Next = %d %q %v, want entry 1 \"two\"", lose, off, data, err)
		}
		if n := consumers(); n != 1 {
			t.Errorf("lose=%v: the stream has %d consumers, want the cursor's one", lose, n)
		}
		cur.Close()
		cancel()
		waitFor(t, func() bool { return consumers() == 0 }) // Close deletes the cursor's consumer
	}
}
