package server_test

import (
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/server"
	"github.com/walcast/walcast/server/apitest"
)

// TestR13_11_TwoPhaseCopiesAndExtrasThroughTheAPI: a broadcast with
// per-target copies (a role, a payload of its own) and an append-first
// target, through the API. Its first phase alone is appended; WaitVChannelsAcked
// returns once the consumer acked it (with an extra result), and only then
// is the rest appended; every copy's role, phase and extra show in GetTask
// and the consumers' extras in the broadcast's response. The backends are
// in memory (apitest): the test is of the API's mapping, the engine's
// two-phase rules are tested on real backends in broadcast/.
func TestR13_11_TwoPhaseCopiesAndExtrasThroughTheAPI(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		srv := apitest.Serve(t, app.StaticLeader(env.Open()), nil)
		c := dial(t, srv, p)
		ctx := ctxT(t)
		src, dst := "wal-1/s0", "wal-0/s1"
		req := &walcastv1.BroadcastRequest{Type: apitest.Sync.String(), Payload: []byte("split"), Vchannels: []string{src, dst},
			ResourceKeys: []string{"Collection:db:c@X"}, AppendFirst: []string{src},
			Copies: map[string]*walcastv1.TargetCopy{src: {Role: "fence"}, dst: {Role: "genesis", Payload: []byte("shard-1")}}}
		done := make(chan *walcastv1.BroadcastResponse, 1)
		errc := make(chan error, 1)
		go func() {
			r, err := c.Broadcast(ctx, connect.NewRequest(req))
			if err != nil {
				errc <- err
				return
			}
			done <- r.Msg
		}()
		var task *walcastv1.Task
		waitFor(t, "the first phase's copy appended", func() bool {
			r, err := c.GetTask(ctx, connect.NewRequest(&walcastv1.GetTaskRequest{Id: 1}))
			if err != nil {
				return false
			}
			task = r.Msg
			return copyOf(task, src).GetAppended()
		})
		if copyOf(task, dst).GetAppended() || !copyOf(task, src).GetAppendFirst() || copyOf(task, dst).GetAppendFirst() ||
			copyOf(task, src).GetCopyRole() != "fence" || copyOf(task, dst).GetCopyRole() != "genesis" {
			t.Fatalf("first phase: %v", task.GetVchannels())
		}
		waited := make(chan *walcastv1.Task, 1)
		go func() {
			r, err := c.WaitVChannelsAcked(ctx, connect.NewRequest(&walcastv1.WaitVChannelsAckedRequest{Id: 1, Vchannels: []string{src}}))
			if err != nil {
				errc <- err
				return
			}
			waited <- r.Msg.GetTask()
		}()
		ack := func(v, extra string) {
			t.Helper()
			if _, err := c.Ack(ctx, connect.NewRequest(&walcastv1.AckRequest{BroadcastId: 1, Vchannel: v, Extra: []byte(extra)})); err != nil {
				t.Fatalf("ack %s: %v", v, err)
			}
		}
		ack(src, "fenced at 42")
		var wt *walcastv1.Task
		select {
		case wt = <-waited:
		case err := <-errc:
			t.Fatal(err)
		}
		if vs := copyOf(wt, src); !vs.GetAcked() || string(vs.GetExtra()) != "fenced at 42" {
			t.Fatalf("WaitVChannelsAcked returned %v", wt.GetVchannels())
		}
		waitFor(t, "the second phase appended", func() bool {
			r, err := c.GetTask(ctx, connect.NewRequest(&walcastv1.GetTaskRequest{Id: 1}))
			return err == nil && copyOf(r.Msg, dst).GetAppended()
		})
		ack(dst, "started")
		ack(string(apitest.Control), "")
		var res *walcastv1.BroadcastResponse
		select {
		case res = <-done:
		case err := <-errc:
			t.Fatal(err)
		}
		if string(res.GetExtras()[src]) != "fenced at 42" || string(res.GetExtras()[dst]) != "started" {
			t.Fatalf("broadcast's extras %q", res.GetExtras())
		}
		r, err := c.GetTask(ctx, connect.NewRequest(&walcastv1.GetTaskRequest{Id: 1}))
		if err != nil || string(copyOf(r.Msg, dst).GetExtra()) != "started" || r.Msg.GetState() != "TOMBSTONE" {
			t.Fatalf("the finished task: %v, %v", r.Msg, err)
		}
		// At once for a finished task.
		if _, err := c.WaitVChannelsAcked(ctx, connect.NewRequest(&walcastv1.WaitVChannelsAckedRequest{Id: 1, Vchannels: []string{dst}})); err != nil {
			t.Fatalf("WaitVChannelsAcked of a finished task: %v", err)
		}
	})
}

func copyOf(t *walcastv1.Task, v string) *walcastv1.VChannelState {
	for _, vs := range t.GetVchannels() {
		if vs.GetVchannel() == v {
			return vs
		}
	}
	return nil
}

// TestR13_10_CopiesAndWaitBadInput: copy specs, append-first lists, ack
// extras and WaitVChannelsAcked requests that do not fit get typed errors
// and create nothing.
func TestR13_10_CopiesAndWaitBadInput(t *testing.T) {
	env := apitest.New(t)
	srv := apitest.Serve(t, app.StaticLeader(env.Open()), nil)
	c := dial(t, srv, protocols[0])
	ctx := ctxT(t)
	base := func(mod func(*walcastv1.BroadcastRequest)) error {
		r := newReq()
		mod(r)
		_, err := c.Broadcast(ctx, connect.NewRequest(r))
		return err
	}
	done := broadcastOK(t, ctx, c, newReq())
	for _, tc := range []struct {
		name string
		err  error
		code connect.Code
		word string
	}{
		{"copy of a non-target", base(func(r *walcastv1.BroadcastRequest) {
			r.Copies = map[string]*walcastv1.TargetCopy{"wal-1/other": {Role: "x"}}
		}), connect.CodeInvalidArgument, "not a target"},
		{"long role", base(func(r *walcastv1.BroadcastRequest) {
			r.Copies = map[string]*walcastv1.TargetCopy{"wal-0/c1v0": {Role: strings.Repeat("r", 65)}}
		}), connect.CodeInvalidArgument, "limit 64"},
		{"append-first non-target", base(func(r *walcastv1.BroadcastRequest) { r.AppendFirst = []string{"wal-1/other"} }),
			connect.CodeInvalidArgument, "not a target"},
		{"append-first twice", base(func(r *walcastv1.BroadcastRequest) { r.AppendFirst = []string{"wal-0/c1v0", "wal-0/c1v0"} }),
			connect.CodeInvalidArgument, "twice"},
		{"extra too large", func() error {
			_, err := c.Ack(ctx, connect.NewRequest(&walcastv1.AckRequest{BroadcastId: done.GetBroadcastId(), Vchannel: "wal-0/c1v0",
				Extra: make([]byte, server.MaxExtraBytes+1)}))
			return err
		}(), connect.CodeInvalidArgument, "limit 1024"},
		{"wait without id", func() error {
			_, err := c.WaitVChannelsAcked(ctx, connect.NewRequest(&walcastv1.WaitVChannelsAckedRequest{Vchannels: []string{"wal-0/c1v0"}}))
			return err
		}(), connect.CodeInvalidArgument, "id"},
		{"wait without vchannels", func() error {
			_, err := c.WaitVChannelsAcked(ctx, connect.NewRequest(&walcastv1.WaitVChannelsAckedRequest{Id: done.GetBroadcastId()}))
			return err
		}(), connect.CodeInvalidArgument, "vchannels"},
		{"wait malformed vchannel", func() error {
			_, err := c.WaitVChannelsAcked(ctx, connect.NewRequest(&walcastv1.WaitVChannelsAckedRequest{Id: done.GetBroadcastId(), Vchannels: []string{"nope"}}))
			return err
		}(), connect.CodeInvalidArgument, "vchannels[0]"},
		{"wait non-target", func() error {
			_, err := c.WaitVChannelsAcked(ctx, connect.NewRequest(&walcastv1.WaitVChannelsAckedRequest{Id: done.GetBroadcastId(), Vchannels: []string{"wal-1/other"}}))
			return err
		}(), connect.CodeInvalidArgument, ""},
		{"wait unknown task", func() error {
			_, err := c.WaitVChannelsAcked(ctx, connect.NewRequest(&walcastv1.WaitVChannelsAckedRequest{Id: 9999, Vchannels: []string{"wal-0/c1v0"}}))
			return err
		}(), connect.CodeNotFound, ""},
	} {
		if connect.CodeOf(tc.err) != tc.code || tc.err == nil || !strings.Contains(tc.err.Error(), tc.word) {
			t.Errorf("%s: %v, want %v saying %q", tc.name, tc.err, tc.code, tc.word)
		}
	}
	if keys := env.TaskKeys(); len(keys) != 1 {
		t.Fatalf("bad input created tasks: %v", keys)
	}
}
