package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/server/apitest"
)

// cancelingLeader answers its first n calls with a cancellation of the
// server's own (as a coordinator stepping down would), then leads with b.
func cancelingLeader(b *broadcast.Broadcaster, n int64) (app.Leader, *atomic.Int64) {
	var calls atomic.Int64
	return app.LeaderFunc(func() (*broadcast.Broadcaster, error) {
		if calls.Add(1) <= n {
			return nil, fmt.Errorf("term ending: %w", context.Canceled)
		}
		return b, nil
	}), &calls
}

// A call the server cancels while its client still waits is answered
// Unavailable, not Canceled: Canceled says the client gave up, and a client
// treats it as final.
func TestServerCanceledCallIsUnavailable(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		l, _ := cancelingLeader(env.Open(), 1)
		c := dial(t, apitest.Serve(t, l, nil), p)
		ctx := ctxT(t)
		_, err := c.Broadcast(ctx, connect.NewRequest(newReq()))
		ce := wantCode(t, err, connect.CodeUnavailable)
		if !strings.Contains(ce.Message(), "the coordinator canceled the call, not the client") {
			t.Fatalf("error %v does not say who canceled the call", ce)
		}
		broadcastOK(t, ctx, c, newReq()) // the next call is served
	})
}

// The Go client retries a keyed broadcast the server canceled, and it
// succeeds on the next attempt.
func TestKeyedBroadcastRetriedAfterServerCancel(t *testing.T) {
	env := apitest.New(t)
	l, calls := cancelingLeader(env.Open(), 1)
	srv := apitest.Serve(t, l, nil)
	c, err := client.New([]string{srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Broadcast(ctxT(t), &client.BroadcastRequest{Type: apitest.Create, Payload: []byte("create db1.c1"),
		VChannels:    []message.VChannel{"wal-0/c1v0"},
		ResourceKeys: []resource.Key{resource.ExclusiveCollection("db1", "c1")},
		Scope:        client.CollectionScope(1), ClientKey: "create-c1"})
	if err != nil {
		t.Fatalf("Broadcast: %v", err)
	}
	if res.BroadcastID == 0 || calls.Load() != 2 {
		t.Fatalf("result %+v after %d calls to the leader, want 2", res, calls.Load())
	}
}

// cancelingApp is the generic application plus one service of its own
// whose every call the server cancels, as a metadata call cut short by
// its coordinator's term ending.
type cancelingApp struct{ app.Generic }

const cancelingPath = "/walcast.test.v1.Canceling/Call"

func (cancelingApp) Handlers(_ app.Leader, opts ...connect.HandlerOption) map[string]http.Handler {
	return map[string]http.Handler{cancelingPath: connect.NewUnaryHandler(cancelingPath,
		func(context.Context, *connect.Request[emptypb.Empty]) (*connect.Response[emptypb.Empty], error) {
			return nil, fmt.Errorf("term ending: %w", context.Canceled)
		}, opts...)}
}

// TestAppServiceCanceledCallIsUnavailable: the process gives an
// application's own services (the metadata service's, in walcast) the same
// answer to a call it cancels as BroadcastService: Unavailable, which a
// client retries.
func TestAppServiceCanceledCallIsUnavailable(t *testing.T) {
	ctx := ctxT(t)
	p := standaloneApp(t, ctx, "cancel", cancelingApp{}, nil)
	c := connect.NewClient[emptypb.Empty, emptypb.Empty](http.DefaultClient, "http://"+p.APIAddr()+cancelingPath)
	_, err := c.CallUnary(ctx, connect.NewRequest(&emptypb.Empty{}))
	ce := wantCode(t, err, connect.CodeUnavailable)
	if !strings.Contains(ce.Message(), "the coordinator canceled the call, not the client") {
		t.Fatalf("error %v does not say who canceled the call", ce)
	}
}
