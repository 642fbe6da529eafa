package client_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/server"
	"github.com/walcast/walcast/server/apitest"
)

// fakeReplication is a ReplicationService: a standby (leader set) answers
// every call NOT_LEADER naming the leader; the leader records the calls and
// fails the first failConfigure Configure calls with a bare Unavailable (the
// answer may have been lost).
type fakeReplication struct {
	walcastv1connect.UnimplementedReplicationServiceHandler
	leader        string
	failConfigure int

	mu    sync.Mutex
	calls []string
}

func (f *fakeReplication) record(name string) error {
	if f.leader != "" {
		return &server.NotLeaderError{Leader: f.leader}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, name)
	if name == "Configure" && f.failConfigure > 0 {
		f.failConfigure--
		return connect.NewError(connect.CodeUnavailable, errors.New("injected: connection lost"))
	}
	return nil
}

func (f *fakeReplication) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakeReplication) Follow(_ context.Context, req *connect.Request[walcastv1.FollowRequest]) (*connect.Response[walcastv1.FollowResponse], error) {
	if err := f.record("Follow " + req.Msg.GetTopology().GetPrimary()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&walcastv1.FollowResponse{}), nil
}

func (f *fakeReplication) Configure(context.Context, *connect.Request[walcastv1.ConfigureRequest]) (*connect.Response[walcastv1.ConfigureResponse], error) {
	if err := f.record("Configure"); err != nil {
		return nil, err
	}
	return connect.NewResponse(&walcastv1.ConfigureResponse{BroadcastId: 7}), nil
}

func (f *fakeReplication) Status(context.Context, *connect.Request[walcastv1.ReplicationStatusRequest]) (*connect.Response[walcastv1.ReplicationStatusResponse], error) {
	if err := f.record("Status"); err != nil {
		return nil, err
	}
	return connect.NewResponse(&walcastv1.ReplicationStatusResponse{Cluster: "west", Role: "secondary"}), nil
}

func (f *fakeReplication) ForcePromote(context.Context, *connect.Request[walcastv1.ForcePromoteRequest]) (*connect.Response[walcastv1.ForcePromoteResponse], error) {
	if err := f.record("ForcePromote"); err != nil {
		return nil, err
	}
	return nil, broadcast.ErrNotSecondary
}

// TestR9_5_ReplicationCallsUseTheClientsRetries: the replication methods
// follow a standby's redirect to the leader, give typed errors, and retry a
// Configure (a broadcast) only when it certainly did not run.
func TestR9_5_ReplicationCallsUseTheClientsRetries(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		// The process's handler options map the fakes' errors as the
		// server maps its own.
		opts := server.AppHandlerOptions(slog.New(slog.DiscardHandler))
		leader := &fakeReplication{failConfigure: 1}
		path, h := walcastv1connect.NewReplicationServiceHandler(leader, opts...)
		lsrv := apitest.ServeHandler(t, handlerAt(path, h))
		standby := &fakeReplication{leader: lsrv.URL}
		path, h = walcastv1connect.NewReplicationServiceHandler(standby, opts...)
		ssrv := apitest.ServeHandler(t, handlerAt(path, h))

		c := newClient(t, p, []string{ssrv.URL})
		ctx := ctxT(t)
		topo := &walcastv1.Topology{Primary: "east", Secondaries: []*walcastv1.SecondaryCluster{{Name: "west", Source: "nats://east:4222"}}}
		if err := c.Follow(ctx, topo); err != nil {
			t.Fatal(err)
		}
		st, err := c.ReplicationStatus(ctx)
		if err != nil || st.GetCluster() != "west" || st.GetRole() != "secondary" {
			t.Fatalf("status %v, %v", st, err)
		}
		// The answer may have been lost: not retried, since a repeat
		// would broadcast the topology twice.
		if _, err := c.Configure(ctx, topo); !errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrTaskNotCreated) {
			t.Fatalf("configure with a lost answer: %v", err)
		}
		if id, err := c.Configure(ctx, topo); err != nil || id != 7 {
			t.Fatalf("configure: %d, %v", id, err)
		}
		var ce *client.Error
		if _, err := c.ForcePromote(ctx); !errors.Is(err, client.ErrFailedPrecondition) || !errors.As(err, &ce) || ce.Reason != "NOT_SECONDARY" {
			t.Fatalf("promote of a primary: %v", err)
		}
		want := []string{"Follow east", "Status", "Configure", "Configure", "ForcePromote"}
		if got := leader.seen(); !slices.Equal(got, want) {
			t.Fatalf("leader saw %q, want %q", got, want)
		}
		if err := c.Follow(ctx, nil); !errors.Is(err, client.ErrInvalidArgument) {
			t.Fatalf("follow without a topology: %v", err)
		}
	})
}

func handlerAt(path string, h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(path, h)
	return mux
}
