package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/server"
	"github.com/walcast/walcast/server/apitest"
)

// TestR9_4_ReservedTypesRefused: types an application owns, and the
// replication topology type, cannot be broadcast through BroadcastService;
// nothing is created.
func TestR9_4_ReservedTypesRefused(t *testing.T) {
	e := apitest.New(t)
	b := e.Open()
	srv := apitest.Serve(t, app.StaticLeader(b), nil, server.WithReservedTypes(apitest.Create))
	c := walcastv1connect.NewBroadcastServiceClient(http.DefaultClient, srv.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, typ := range []string{apitest.Create.String(), "AlterReplicateConfig.v1"} {
		_, err := c.Broadcast(ctx, connect.NewRequest(&walcastv1.BroadcastRequest{Type: typ, Vchannels: []string{"wal-1/a"}}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", typ, err)
		}
	}
	if n := len(e.TaskKeys()); n != 0 {
		t.Fatalf("%d tasks created", n)
	}
	// An unreserved type passes the check (this one then waits for node
	// acks that never come: the short deadline ends it).
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelShort()
	if _, err := c.Broadcast(short, connect.NewRequest(&walcastv1.BroadcastRequest{Type: apitest.Sync.String(), Vchannels: []string{"wal-1/a"}})); connect.CodeOf(err) == connect.CodeInvalidArgument {
		t.Fatalf("an unreserved type was refused: %v", err)
	}
}
