package nats

import (
	"errors"
	"testing"

	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/message"
)

// TestExistingCreatesNoStream: a reader of another cluster's WAL
// (Config.Existing) fails on a missing stream, naming it, instead of
// creating it — a replicator with a wrong stream prefix must not read an
// empty stream it made itself and report itself replicating — and opens
// the streams once they exist, under the prefix given.
func TestExistingCreatesNoStream(t *testing.T) {
	srv := startServer(t, embednats.Config{})
	cfg := Config{URL: srv.ClientURL(), PChannels: []message.PChannel{"p0", "p1"}, StreamPrefix: "EAST", Existing: true}
	if _, err := New(tctx(t), cfg); !errors.Is(err, ErrNoStream) {
		t.Fatalf("Existing on missing streams: %v, want ErrNoStream", err)
	}
	owner := cfg
	owner.Existing = false
	l, err := New(tctx(t), owner)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Close()
	r, err := New(tctx(t), cfg)
	if err != nil {
		t.Fatalf("Existing once the streams exist: %v", err)
	}
	defer r.Close()
	if ch := r.chans["p0"]; ch.stream != "EAST_p0" {
		t.Fatalf("stream %q, want EAST_p0", ch.stream)
	}
}
