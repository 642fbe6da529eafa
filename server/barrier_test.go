package server_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/server/apitest"
)

// TestR3_4_NamedClusterKeyRefusedWhileBarrierHeld: while the exclusive
// Cluster key is held (as a force promote holds it), a broadcast naming a
// Cluster key with a name — which used to replace the implicit shared
// Cluster key and so run beside the barrier — is refused at once with
// InvalidArgument, and nothing is persisted, appended or locked. A broadcast
// with ordinary keys waits for the barrier, and runs once it is released.
func TestR3_4_NamedClusterKeyRefusedWhileBarrierHeld(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		b := env.Open()
		c := dial(t, apitest.Serve(t, app.StaticLeader(b), nil), p)
		ctx := ctxT(t)

		barrier, err := b.WithResourceKeys(ctx, resource.ExclusiveCluster())
		if err != nil {
			t.Fatal(err)
		}
		defer barrier.Close()
		before := snap(env, b)
		for _, keys := range [][]string{
			{"Cluster:foo@R"},
			{"Cluster:foo@X"},
			{"Database:db1@R", "Collection:db1:c1@X", "Cluster:x@R"},
		} {
			r := newReq()
			r.ResourceKeys = keys
			_, err := c.Broadcast(ctx, connect.NewRequest(r))
			ce := wantCode(t, err, connect.CodeInvalidArgument)
			if !strings.Contains(ce.Message(), "the Cluster domain has one key, the empty name") {
				t.Errorf("keys %v: message %q does not say why", keys, ce.Message())
			}
			if after := snap(env, b); !after.equal(before) {
				t.Fatalf("keys %v: state changed: before %+v, after %+v", keys, before, after)
			}
		}

		// The barrier holds ordinary broadcasts back...
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err = c.Broadcast(short, connect.NewRequest(newReq()))
		cancel()
		if connect.CodeOf(err) != connect.CodeDeadlineExceeded && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("broadcast beside the exclusive Cluster key: %v, want it to wait", err)
		}
		if after := snap(env, b); after.broadcasts != before.broadcasts || len(after.taskKeys) != len(before.taskKeys) {
			t.Fatalf("a broadcast ran beside the barrier: before %+v, after %+v", before, after)
		}
		// ...until it is released.
		barrier.Close()
		broadcastOK(t, ctx, c, newReq())
	})
}
