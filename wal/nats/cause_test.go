package nats

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/message"
)

// TestUnreachableServerNamedWithItsCause: once the NATS server is gone,
// End (what /readyz probes) and Append (what a task's status shows) fail
// naming the server and why it cannot be reached, not only with the
// client's "outbound buffer limit exceeded".
func TestUnreachableServerNamedWithItsCause(t *testing.T) {
	srv := startServer(t, embednats.Config{})
	l := open(t, srv, "wal-0")
	url := srv.ClientURL()
	srv.Close()
	// The first reconnect attempt has failed: the cause is known.
	waitFor(t, func() bool { lc := l.lost.Load(); return lc != nil && strings.Contains(netCause(lc.err), "refused") })
	want := "cannot reach NATS at " + url + ": connection refused (reconnecting"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := l.End(ctx, "wal-0"); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("End without the server: %v\nwant it to contain %q", err, want)
	}
	if _, err := l.Append(ctx, message.PChannel("wal-0"), "id-1", []byte("x")); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Append without the server: %v\nwant it to contain %q", err, want)
	}
}
