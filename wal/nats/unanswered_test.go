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

// infoRelay stands between a log and the real server's JetStream API: it
// forwards every request to $JS.API, except that it leaves the next drop
// stream info requests unanswered, as servers moving leaders may. seen
// counts the stream info requests since the last arm.
type infoRelay struct {
	drop, seen atomic.Int64
}

// arm makes the relay leave the next n stream info requests unanswered
// and restarts its count.
func (r *infoRelay) arm(n int64) {
	r.seen.Store(0)
	r.drop.Store(n)
}

// relayInfo points l's JetStream API at a new infoRelay.
func relayInfo(t *testing.T, l *Log, srv *embednats.Server) *infoRelay {
	t.Helper()
	nc, err := natsgo.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	r := &infoRelay{}
	if _, err := nc.Subscribe("$RELAY.API.>", func(m *natsgo.Msg) {
		subject := "$JS.API." + strings.TrimPrefix(m.Subject, "$RELAY.API.")
		if strings.HasPrefix(subject, "$JS.API.STREAM.INFO.") {
			r.seen.Add(1)
			if r.drop.Add(-1) >= 0 {
				return // unanswered
			}
		}
		resp, err := nc.Request(subject, m.Data, 5*time.Second)
		if err == nil {
			_ = m.Respond(resp.Data)
		}
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

// TestUnansweredStreamInfoIsRetried: a stream info request (End,
// StreamInfo) that no server answers costs a caller with a deadline one
// RequestTimeout, not its whole deadline: the request is sent again and
// the answer to that one returned. Without a deadline it is one attempt,
// bounded by RequestTimeout, as before.
func TestUnansweredStreamInfoIsRetried(t *testing.T) {
	srv := startServer(t, embednats.Config{})
	l, err := New(tctx(t), Config{URL: srv.ClientURL(), PChannels: []message.PChannel{"p"}, RequestTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Append(tctx(t), "p", "id-1", []byte("one")); err != nil {
		t.Fatal(err)
	}

	relay := relayInfo(t, l, srv)
	relay.arm(1)
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

	relay.arm(1)
	info, err := l.StreamInfo(ctx, "p")
	if err != nil || info.State.Msgs != 1 || relay.seen.Load() != 2 {
		t.Fatalf("StreamInfo after an unanswered request: %v, %v (%d requests)", err, info.State, relay.seen.Load())
	}

	// No deadline: one attempt, which JetStream ends after RequestTimeout.
	relay.arm(1)
	if _, err := l.End(context.Background(), "p"); !errors.Is(err, context.DeadlineExceeded) || relay.seen.Load() != 1 {
		t.Fatalf("End without a deadline, unanswered: %v (%d requests), want one attempt ending in its timeout", err, relay.seen.Load())
	}
}
