package kafka

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walcast/walcast/message"
)

// TestR9_10_UnreachableKafkaNamedWithItsCause: once the brokers are gone,
// End (what /readyz probes and a replicator reads of its primary),
// Identity, Append (what a task's append error shows: the coordinator's
// appends wait for the producer's delivery timeout, an append with a
// deadline for the deadline) and New fail naming the broker and why it
// cannot be reached ("cannot reach Kafka at 127.0.0.1:port: connection
// refused"), not with franz-go's "unable to dial: dial tcp ..." or a bare
// timeout.
func TestR9_10_UnreachableKafkaNamedWithItsCause(t *testing.T) {
	c := newCluster(t)
	addr := c.ListenAddrs()[0]
	l := open(t, c, Config{PChannels: []message.PChannel{"wal-0"}, ReplicationFactor: 1,
		ClientOptions: []kgo.Opt{kgo.RecordDeliveryTimeout(time.Second)}})
	c.Close()
	want := "cannot reach Kafka at " + addr + ": connection refused"
	call := func(what string, f func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if err := f(ctx); err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "unable to dial") {
			t.Errorf("%s without the brokers: %v\nwant it to contain %q", what, err, want)
		}
	}
	call("End", func(ctx context.Context) error { _, err := l.End(ctx, "wal-0"); return err })
	call("Identity", func(ctx context.Context) error { _, err := l.Identity(ctx, "wal-0"); return err })
	call("Append", func(ctx context.Context) error { _, err := l.Append(ctx, "wal-0", "id-1", []byte("x")); return err })
	call("Append until the delivery timeout", func(context.Context) error {
		_, err := l.Append(context.Background(), "wal-0", "id-2", []byte("x"))
		return err
	})

	// A log opened on a port where nothing listens.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	want = "cannot reach Kafka at " + dead + ": connection refused"
	call("New", func(ctx context.Context) error {
		l, err := New(ctx, Config{Brokers: []string{dead}, PChannels: []message.PChannel{"wal-0"}, ReplicationFactor: 1})
		if err == nil {
			_ = l.Close()
		}
		return err
	})
}
