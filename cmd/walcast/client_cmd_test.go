package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/server"
	"github.com/walcast/walcast/server/apitest"
)

// execCLI runs one walcast command in process and returns its output.
func execCLI(args ...string) (string, error) {
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// closedAddr returns a 127.0.0.1 address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// ackRecorder is a BroadcastService that records the acks it gets.
type ackRecorder struct {
	walcastv1connect.UnimplementedBroadcastServiceHandler
	mu   sync.Mutex
	acks []*walcastv1.AckRequest
}

func (r *ackRecorder) Ack(_ context.Context, req *connect.Request[walcastv1.AckRequest]) (*connect.Response[walcastv1.AckResponse], error) {
	r.mu.Lock()
	r.acks = append(r.acks, req.Msg)
	r.mu.Unlock()
	return connect.NewResponse(&walcastv1.AckResponse{}), nil
}

// TestR9_3_NodeAcksSendTheMessageOnlyForReplicatedCopies: a node's ack
// carries the encoded message only when the coordinator needs it, to create
// a replicated copy's task on a secondary; ordinary acks send the id,
// vchannel and checkpoint alone.
func TestR9_3_NodeAcksSendTheMessageOnlyForReplicatedCopies(t *testing.T) {
	rec := &ackRecorder{}
	path, h := walcastv1connect.NewBroadcastServiceHandler(rec)
	srv := apitest.ServeHandler(t, handlerOn(path, h))
	c, err := client.New([]string{srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	m, err := message.NewBroadcast(app.GenericType, []byte("payload"), []message.VChannel{"wal-0/a"})
	if err != nil {
		t.Fatal(err)
	}
	m.Broadcast.ID = 5
	a := clientAcker{c}
	if err := a.Ack(ctx, broadcast.Ack{BroadcastID: 5, VChannel: "wal-0/a", Message: m}); err != nil {
		t.Fatal(err)
	}
	replicated := *m
	replicated.Replicate = &message.ReplicateHeader{SourceCluster: "east", SourcePChannel: "wal-0", SourceMessageID: 9}
	if err := a.Ack(ctx, broadcast.Ack{BroadcastID: 5, VChannel: "wal-0/a", Message: &replicated}); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.acks) != 2 {
		t.Fatalf("%d acks", len(rec.acks))
	}
	if ack := rec.acks[0]; len(ack.GetMessage()) != 0 || ack.GetBroadcastId() != 5 || ack.GetVchannel() != "wal-0/a" {
		t.Fatalf("ordinary ack %v: want no message", ack)
	}
	got, err := message.Unmarshal(rec.acks[1].GetMessage())
	if err != nil || got.Replicate == nil || got.Replicate.SourceCluster != "east" || got.Broadcast.ID != 5 {
		t.Fatalf("replicated copy's ack: message %+v, %v", got, err)
	}
}

// handlerOn serves h at path.
func handlerOn(path string, h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(path, h)
	return mux
}

// TestR9_5_TasksLimitNegative: a negative --limit is a usage error, refused
// before anything is sent (any positive one is fine: the command pages).
func TestR9_5_TasksLimitNegative(t *testing.T) {
	addr := closedAddr(t)
	_, err := execCLI("tasks", "list", "--addr", addr, "--timeout", "2s", "--limit", "-1")
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--limit -1 is negative") {
		t.Errorf("--limit -1: %v, want a usage error", err)
	}
}

// TestR9_5_ServerCommandsReportAnAppError: the application a server command
// runs is built from its configuration, and a failure to build it is the
// command's error (walcast node used to start without it).
func TestR9_5_ServerCommandsReportAnAppError(t *testing.T) {
	cfg := server.Default()
	if a, err := newApp(cfg); err != nil || a == nil {
		t.Fatalf("app of the default configuration: %v, %v", a, err)
	}
	cfg.WAL.PChannelPrefix = "bad/" // Validate refuses it; app must too
	if a, err := newApp(cfg); err == nil || a != nil || !strings.Contains(err.Error(), "PChannels") {
		t.Fatalf("app of a bad configuration: %v, %v", a, err)
	}
}

// TestR9_5_ReplicateCommandsUseTheClient: the replicate commands take every
// --addr (skipping one that is down) and give the client's typed errors.
func TestR9_5_ReplicateCommandsUseTheClient(t *testing.T) {
	m := startMetaCLI(t)
	addrs := closedAddr(t) + "," + m.addr
	out, err := execCLI("--addr", addrs, "--timeout", "20s", "replicate", "status")
	if err != nil {
		t.Fatalf("replicate status: %v\n%s", err, out)
	}
	wantOutput(t, out, `(?m)^cluster\s+walcast$`, `(?m)^role\s+primary$`, `(?m)^replicating false$`, `(?m)^0 incomplete tasks$`)
	out, err = execCLI("--addr", addrs, "--timeout", "20s", "replicate", "status", "--json")
	if err != nil {
		t.Fatalf("replicate status --json: %v\n%s", err, out)
	}
	wantOutput(t, out, `"role":\s*"primary"`)
	_, err = execCLI("--addr", addrs, "--timeout", "20s", "replicate", "promote")
	if !errors.Is(err, client.ErrFailedPrecondition) || !strings.Contains(err.Error(), "not secondary") {
		t.Fatalf("promote of a primary: %v", err)
	}
	_, err = execCLI("--addr", addrs, "--timeout", "20s", "replicate", "follow", "--primary", "walcast")
	if !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("follow of itself: %v", err)
	}
}
