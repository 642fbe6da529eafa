package nats

import (
	"errors"
	"strings"
	"sync"
	"testing"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// TestEndIsOneRequest: End asks JetStream once, and answers the stream's
// last sequence.
func TestEndIsOneRequest(t *testing.T) {
	srv := startServer(t, embednats.Config{})
	l := open(t, srv, "p")
	ctx := tctx(t)
	for range 3 {
		if _, err := l.Append(ctx, "p", "", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var subjects []string
	js, err := jetstream.New(l.nc, jetstream.WithClientTrace(&jetstream.ClientTrace{
		RequestSent: func(subj string, _ []byte) {
			mu.Lock()
			subjects = append(subjects, subj)
			mu.Unlock()
		},
	}))
	if err != nil {
		t.Fatal(err)
	}
	l.js = js
	end, err := l.End(ctx, "p")
	if err != nil || end != 3 {
		t.Fatalf("End = %d, %v; want 3", end, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(subjects) != 1 || !strings.Contains(subjects[0], "STREAM.INFO") {
		t.Fatalf("End sent %q, want one stream info request", subjects)
	}
}

// TestReadRacingCloseDeletesConsumer: a Read whose consumer was created
// while Close ran fails with wal.ErrClosed and deletes the consumer rather
// than leaving it on the server until it expires.
func TestReadRacingCloseDeletesConsumer(t *testing.T) {
	srv := startServer(t, embednats.Config{})
	ctx := tctx(t)
	nc, err := natsgo.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// A borrowed connection stays open after Close, as in a process
	// that closes one log and goes on.
	l, err := New(ctx, Config{Conn: nc, PChannels: []message.PChannel{"p"}})
	if err != nil {
		t.Fatal(err)
	}
	testHookReadConsumer = func() { _ = l.Close() }
	defer func() { testHookReadConsumer = nil }()
	if _, err := l.Read(ctx, "p", 0); !errors.Is(err, wal.ErrClosed) {
		t.Fatalf("Read racing Close: %v, want wal.ErrClosed", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, DefaultStreamPrefix+"_p")
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Consumers; n != 0 {
		t.Fatalf("%d consumers left on the stream", n)
	}
}
