package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/server"
	"github.com/walcast/walcast/server/apitest"
)

// protocol is one way of calling the API: every behaviour is checked over
// the Connect protocol with JSON (the "JSON over HTTP" access of R9.4) and
// over gRPC (HTTP/2, here h2c).
type protocol struct {
	name string
	h2   bool
	opts []connect.ClientOption
}

var protocols = []protocol{
	{name: "connect-json", opts: []connect.ClientOption{connect.WithProtoJSON()}},
	{name: "grpc", h2: true, opts: []connect.ClientOption{connect.WithGRPC()}},
}

func forProtocols(t *testing.T, fn func(t *testing.T, p protocol)) {
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) { fn(t, p) })
	}
}

func dial(t *testing.T, srv *httptest.Server, p protocol) walcastv1connect.BroadcastServiceClient {
	return walcastv1connect.NewBroadcastServiceClient(apitest.HTTPClient(t, p.h2), srv.URL, p.opts...)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, err error, code connect.Code) *connect.Error {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("error %v (%T) is not a connect error", err, err)
	}
	if ce.Code() != code {
		t.Fatalf("code %v, want %v: %v", ce.Code(), code, err)
	}
	return ce
}

// reasonOf returns the ErrorInfo reason and metadata of an error, if any.
func reasonOf(ce *connect.Error) (string, map[string]string) {
	for _, d := range ce.Details() {
		v, err := d.Value()
		if info, ok := v.(*errdetails.ErrorInfo); ok && err == nil {
			return info.GetReason(), info.GetMetadata()
		}
	}
	return "", nil
}

// newReq is a valid CreateCollection broadcast to two vchannels.
func newReq() *walcastv1.BroadcastRequest {
	return &walcastv1.BroadcastRequest{
		Type:         apitest.Create.String(),
		Payload:      []byte("create db1.c1"),
		Vchannels:    []string{"wal-0/c1v0", "wal-1/c1v1"},
		ResourceKeys: []string{"Database:db1@R", "Collection:db1:c1@X"},
	}
}

// broadcastInBackground sends r and returns the channel its answer comes
// on: nil if it failed, which fails t.
func broadcastInBackground(ctx context.Context, t *testing.T, c walcastv1connect.BroadcastServiceClient, r *walcastv1.BroadcastRequest) <-chan *walcastv1.BroadcastResponse {
	done := make(chan *walcastv1.BroadcastResponse, 1)
	go func() {
		resp, err := c.Broadcast(ctx, connect.NewRequest(r))
		if err != nil {
			t.Error(err)
			done <- nil
			return
		}
		done <- resp.Msg
	}()
	return done
}

// appendedTask waits until the one PENDING task has every copy appended,
// and returns it.
func appendedTask(ctx context.Context, t *testing.T, c walcastv1connect.BroadcastServiceClient, what string) *walcastv1.Task {
	t.Helper()
	var task *walcastv1.Task
	waitFor(t, what, func() bool {
		list, err := c.ListTasks(ctx, connect.NewRequest(&walcastv1.ListTasksRequest{States: []string{"PENDING"}}))
		if err != nil || len(list.Msg.GetTasks()) != 1 {
			return false
		}
		task = list.Msg.GetTasks()[0]
		return !slices.ContainsFunc(task.GetVchannels(), func(v *walcastv1.VChannelState) bool { return !v.GetAppended() })
	})
	return task
}

func broadcastOK(t *testing.T, ctx context.Context, c walcastv1connect.BroadcastServiceClient, r *walcastv1.BroadcastRequest) *walcastv1.BroadcastResponse {
	t.Helper()
	resp, err := c.Broadcast(ctx, connect.NewRequest(r))
	if err != nil {
		t.Fatalf("Broadcast: %v", err)
	}
	return resp.Msg
}

// waitFor waits for an event: see wait.For.
var waitFor = wait.For

func TestR9_4_BroadcastAndInspect(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		b := env.Open()
		c := dial(t, apitest.Serve(t, app.StaticLeader(b), nil), p)
		ctx := ctxT(t)

		r := newReq()
		r.IdempotencyKey = string(message.CollectionKey(7, "k1"))
		r.Properties = map[string]string{"origin": "test"}
		res := broadcastOK(t, ctx, c, r)
		if res.GetBroadcastId() == 0 || res.GetDuplicated() {
			t.Fatalf("response %v", res)
		}
		if got := len(res.GetAppends()); got != 3 { // two targets and the control channel
			t.Fatalf("appends %v", res.GetAppends())
		}
		if _, ok := res.GetAppends()[string(apitest.Control)]; !ok {
			t.Fatalf("no append on the control channel: %v", res.GetAppends())
		}
		if res.GetOutcome().GetStatus() != walcastv1.OutcomeStatus_OUTCOME_STATUS_SUCCEEDED {
			t.Fatalf("outcome %v", res.GetOutcome())
		}
		w := res.GetWindow()
		if w.GetFirstSeen() == nil || w.GetCompletedAt() == nil || w.GetExpiresLatest() == nil || w.GetCountHeadroom() < 0 ||
			w.GetExpiresLatest().AsTime().Sub(w.GetCompletedAt().AsTime()) != 24*time.Hour {
			t.Fatalf("window %v", w)
		}

		got, err := c.GetTask(ctx, connect.NewRequest(&walcastv1.GetTaskRequest{Id: res.GetBroadcastId()}))
		if err != nil {
			t.Fatal(err)
		}
		task := got.Msg
		if task.GetState() != "TOMBSTONE" || task.GetType() != "CreateCollection.v1" || string(task.GetPayload()) != "create db1.c1" ||
			task.GetKeyFingerprint() != message.CollectionKey(7, "k1").Fingerprint() || task.GetCreatedAt() == nil || task.GetCompletedAt() == nil {
			t.Fatalf("task %v", task)
		}
		if !slices.Equal(task.GetResourceKeys(), []string{"Collection:db1:c1@X", "Database:db1@R", "Cluster:@R"}) {
			t.Fatalf("resource keys %v", task.GetResourceKeys())
		}
		if len(task.GetVchannels()) != 3 {
			t.Fatalf("vchannels %v", task.GetVchannels())
		}
		for _, v := range task.GetVchannels() {
			if !v.GetAcked() || !v.GetAppended() || v.GetCheckpoint().GetMessageId() != res.GetAppends()[v.GetVchannel()].GetMessageId() {
				t.Fatalf("vchannel %v, appends %v", v, res.GetAppends())
			}
		}

		list, err := c.ListTasks(ctx, connect.NewRequest(&walcastv1.ListTasksRequest{States: []string{"TOMBSTONE"}, Type: "CreateCollection.v1"}))
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Msg.GetTasks()) != 1 || list.Msg.GetTasks()[0].GetId() != res.GetBroadcastId() {
			t.Fatalf("tombstones %v", list.Msg.GetTasks())
		}
		list, err = c.ListTasks(ctx, connect.NewRequest(&walcastv1.ListTasksRequest{States: []string{"PENDING"}}))
		if err != nil || len(list.Msg.GetTasks()) != 0 {
			t.Fatalf("pending tasks %v, %v", list, err)
		}
		list, err = c.ListTasks(ctx, connect.NewRequest(&walcastv1.ListTasksRequest{OlderThan: durationpb.New(time.Hour)}))
		if err != nil || len(list.Msg.GetTasks()) != 0 {
			t.Fatalf("tasks older than 1h: %v, %v", list, err)
		}

		lk, err := c.LookupKey(ctx, connect.NewRequest(&walcastv1.LookupKeyRequest{Type: r.Type, IdempotencyKey: r.IdempotencyKey}))
		if err != nil {
			t.Fatal(err)
		}
		if lk.Msg.GetBroadcastId() != res.GetBroadcastId() || lk.Msg.GetState() != "TOMBSTONE" ||
			lk.Msg.GetOutcome().GetStatus() != walcastv1.OutcomeStatus_OUTCOME_STATUS_SUCCEEDED || lk.Msg.GetWindow().GetCompletedAt() == nil {
			t.Fatalf("lookup %v", lk.Msg)
		}

		// Locks: none once finished; a running broadcast shows its keys.
		locks, err := c.ListLocks(ctx, connect.NewRequest(&walcastv1.ListLocksRequest{}))
		if err != nil || len(locks.Msg.GetLocks()) != 0 {
			t.Fatalf("locks after completion: %v, %v", locks, err)
		}
		release := make(chan struct{})
		// entered is closed when the callback first runs: by then the task
		// is durable and appended (PENDING), not merely holding its locks
		// while it is persisted.
		entered := make(chan struct{})
		var enter sync.Once
		env.SetCallback(func(ctx context.Context, _ *broadcast.Event) error {
			enter.Do(func() { close(entered) })
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		running := newReq()
		running.ResourceKeys = []string{"Collection:db1:c2@X"}
		running.IdempotencyKey = string(message.CollectionKey(8, "running"))
		done := broadcastInBackground(ctx, t, c, running)
		select {
		case <-entered:
		case <-ctx.Done():
			t.Fatal("the running broadcast's callback never ran")
		}
		var held *walcastv1.LockState
		waitFor(t, "the running broadcast's locks", func() bool {
			locks, err := c.ListLocks(ctx, connect.NewRequest(&walcastv1.ListLocksRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range locks.Msg.GetLocks() {
				if l.GetDomain() == "Collection" && l.GetName() == "db1:c2" && len(l.GetHolders()) == 1 &&
					strings.HasPrefix(l.GetHolders()[0].GetOwner(), "broadcast ") {
					held = l
					return true
				}
			}
			return false
		})
		if h := held.GetHolders()[0]; h.GetMode() != "X" || h.GetSince() == nil {
			t.Fatalf("holder %v", h)
		}
		// While the callback runs, its key resolves to the running task,
		// whose window has not started expiring.
		lk, err = c.LookupKey(ctx, connect.NewRequest(&walcastv1.LookupKeyRequest{Type: r.Type, IdempotencyKey: string(message.CollectionKey(8, "running"))}))
		if err != nil {
			t.Fatal(err)
		}
		if lk.Msg.GetState() != "PENDING" || lk.Msg.GetOutcome() != nil || lk.Msg.GetWindow().GetCompletedAt() != nil ||
			lk.Msg.GetWindow().GetCountHeadroom() != -1 || lk.Msg.GetWindow().GetFirstSeen() == nil {
			t.Fatalf("lookup of a running key %v", lk.Msg)
		}
		_, err = c.LookupKey(ctx, connect.NewRequest(&walcastv1.LookupKeyRequest{Type: r.Type, IdempotencyKey: string(message.CollectionKey(8, "absent"))}))
		wantCode(t, err, connect.CodeNotFound)
		close(release)
		if second := <-done; second == nil || second.GetBroadcastId() <= res.GetBroadcastId() {
			t.Fatalf("second broadcast %v", second)
		}
	})
}

func TestR7_IdempotentRetryThroughTheAPI(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		b := env.Open()
		c := dial(t, apitest.Serve(t, app.StaticLeader(b), nil), p)
		ctx := ctxT(t)

		clientKey := "retry-" + p.name
		r := newReq()
		r.IdempotencyKey = string(message.CollectionKey(7, clientKey))
		first := broadcastOK(t, ctx, c, r)
		again := broadcastOK(t, ctx, c, r)
		if !again.GetDuplicated() || again.GetBroadcastId() != first.GetBroadcastId() || len(again.GetAppends()) != len(first.GetAppends()) ||
			again.GetOutcome().GetStatus() != walcastv1.OutcomeStatus_OUTCOME_STATUS_SUCCEEDED {
			t.Fatalf("retry %v, original %v", again, first)
		}
		if n := b.Stats().Broadcasts; n != 1 || len(env.TaskKeys()) != 1 {
			t.Fatalf("%d broadcasts, task keys %v", n, env.TaskKeys())
		}

		// The same key with another payload is refused, naming the key only
		// by its fingerprint.
		other := newReq()
		other.IdempotencyKey = r.IdempotencyKey
		other.Payload = []byte("something else")
		_, err := c.Broadcast(ctx, connect.NewRequest(other))
		ce := wantCode(t, err, connect.CodeAlreadyExists)
		if reason, _ := reasonOf(ce); reason != server.ReasonKeyReused {
			t.Fatalf("reason %q", reason)
		}
		if strings.Contains(ce.Message(), clientKey) || !strings.Contains(ce.Message(), message.IdempotencyKey(r.IdempotencyKey).Fingerprint()) {
			t.Fatalf("message %q: want the fingerprint, not the key", ce.Message())
		}

		// With a request digest the digest decides, not the payload.
		d := newReq()
		d.IdempotencyKey = string(message.CollectionKey(7, clientKey+"-digest"))
		d.RequestDigest = []byte("digest-1")
		orig := broadcastOK(t, ctx, c, d)
		d.Payload = []byte("payload with a new id allocated per attempt")
		if dup := broadcastOK(t, ctx, c, d); !dup.GetDuplicated() || dup.GetBroadcastId() != orig.GetBroadcastId() {
			t.Fatalf("digest retry %v, original %v", dup, orig)
		}
		d.RequestDigest = []byte("digest-2")
		_, err = c.Broadcast(ctx, connect.NewRequest(d))
		wantCode(t, err, connect.CodeAlreadyExists)
		if n := b.Stats().Broadcasts; n != 2 {
			t.Fatalf("%d broadcasts, want 2", n)
		}
	})
}

// snapshot is everything a rejected request must leave unchanged.
type snapshot struct {
	applied, appends, broadcasts, locks int
	taskKeys                            []string
}

func snap(env *apitest.Env, b *broadcast.Broadcaster) snapshot {
	return snapshot{applied: env.Store.Applied(), appends: env.Log.Appends(), broadcasts: b.Stats().Broadcasts,
		locks: len(b.Locks()), taskKeys: env.TaskKeys()}
}

func (s snapshot) equal(o snapshot) bool {
	return s.applied == o.applied && s.appends == o.appends && s.broadcasts == o.broadcasts && s.locks == o.locks &&
		slices.Equal(s.taskKeys, o.taskKeys)
}

// TestR9_4_BadInput sends malformed and impossible requests: each gets its
// typed code and a clear message, and nothing is persisted, appended or
// left locked.
func TestR9_4_BadInput(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		// The cluster's pchannels, as every process configures them: the
		// engine refuses targets elsewhere.
		b := env.Open(func(cfg *broadcast.Config) { cfg.PChannels = apitest.PChannels })
		c := dial(t, apitest.Serve(t, app.StaticLeader(b), nil, server.WithMaxRequestBytes(1<<20)), p)
		ctx := ctxT(t)

		// A first broadcast reserves the term's block of broadcast ids, so
		// that the checks below can ask for no catalog write at all.
		broadcastOK(t, ctx, c, newReq())

		// A live task waiting for consumer acks (AckSyncUp), for the acks
		// below.
		r := newReq()
		r.Type = apitest.Sync.String()
		r.ResourceKeys = []string{"Collection:db1:live@X"}
		live := broadcastInBackground(ctx, t, c, r)
		liveTask := appendedTask(ctx, t, c, "the live task's appends")

		bcast := func(mod func(r *walcastv1.BroadcastRequest)) func() error {
			return func() error {
				r := newReq()
				mod(r)
				_, err := c.Broadcast(ctx, connect.NewRequest(r))
				return err
			}
		}
		longKey := strings.Repeat("k", 300)
		cases := []struct {
			name   string
			call   func() error
			code   connect.Code
			msg    string // part of the message
			secret string // must not appear in the message
		}{
			{"no vchannels", bcast(func(r *walcastv1.BroadcastRequest) { r.Vchannels = nil }),
				connect.CodeInvalidArgument, "no target vchannels", ""},
			{"duplicate vchannels", bcast(func(r *walcastv1.BroadcastRequest) { r.Vchannels = []string{"wal-0/a", "wal-1/b", "wal-0/a"} }),
				connect.CodeInvalidArgument, "duplicate vchannel: wal-0/a", ""},
			{"malformed vchannel", bcast(func(r *walcastv1.BroadcastRequest) { r.Vchannels = []string{"wal-0/a", "no-slash"} }),
				connect.CodeInvalidArgument, `vchannel "no-slash" is not <pchannel>/<name>`, ""},
			{"vchannel on an unknown pchannel", bcast(func(r *walcastv1.BroadcastRequest) { r.Vchannels = []string{"wal-0/a", "wal-9/b"} }),
				connect.CodeInvalidArgument, "wal-9/b is on pchannel wal-9, which this cluster does not have", ""},
			{"request digest too long", bcast(func(r *walcastv1.BroadcastRequest) {
				r.IdempotencyKey = string(message.CollectionKey(7, "long-digest"))
				r.RequestDigest = make([]byte, server.MaxRequestDigestBytes+1)
			}), connect.CodeInvalidArgument, "request_digest is 65 bytes, limit 64", ""},
			{"malformed type", bcast(func(r *walcastv1.BroadcastRequest) { r.Type = "CreateCollection" }),
				connect.CodeInvalidArgument, `"CreateCollection" is not <name>.v<version>`, ""},
			{"unknown type", bcast(func(r *walcastv1.BroadcastRequest) { r.Type = "Nope.v1" }),
				connect.CodeInvalidArgument, "unknown type: Nope.v1", ""},
			{"payload over the broadcaster's limit", bcast(func(r *walcastv1.BroadcastRequest) { r.Payload = make([]byte, 300<<10) }),
				connect.CodeInvalidArgument, "payload is 307200 bytes, limit 262144", ""},
			{"request over the API's limit", bcast(func(r *walcastv1.BroadcastRequest) { r.Payload = make([]byte, 2<<20) }),
				connect.CodeInvalidArgument, "request too large: over", ""},
			{"idempotency key too long", bcast(func(r *walcastv1.BroadcastRequest) { r.IdempotencyKey = string(message.CollectionKey(7, longKey)) }),
				connect.CodeInvalidArgument, "client key length 300 exceeds limit 256", longKey},
			{"malformed idempotency key", bcast(func(r *walcastv1.BroadcastRequest) { r.IdempotencyKey = "3:07:x" }),
				connect.CodeInvalidArgument, "not <domain>:<scope id>:<client key> (fingerprint " +
					message.IdempotencyKey("3:07:x").Fingerprint(), "3:07:x"},
			{"idempotency key without client key", bcast(func(r *walcastv1.BroadcastRequest) { r.IdempotencyKey = "3:7:" }),
				connect.CodeInvalidArgument, "invalid idempotency key", ""},
			{"unknown resource domain", bcast(func(r *walcastv1.BroadcastRequest) { r.ResourceKeys = []string{"Database:db1@R", "Nope:x@R"} }),
				connect.CodeInvalidArgument, `resource_keys[1]: resource: invalid key: unknown domain "Nope"`, ""},
			{"bad resource mode", bcast(func(r *walcastv1.BroadcastRequest) { r.ResourceKeys = []string{"Database:x@Z"} }),
				connect.CodeInvalidArgument, `mode "Z" is neither R nor X`, ""},
			{"GetTask of an unknown task", func() error {
				_, err := c.GetTask(ctx, connect.NewRequest(&walcastv1.GetTaskRequest{Id: 999999}))
				return err
			}, connect.CodeNotFound, "not found: task 999999", ""},
			{"RetryCallback of an unknown task", func() error {
				_, err := c.RetryCallback(ctx, connect.NewRequest(&walcastv1.RetryCallbackRequest{Id: 999999}))
				return err
			}, connect.CodeNotFound, "not found: task 999999", ""},
			{"CompleteCallback of an unknown task", func() error {
				_, err := c.CompleteCallback(ctx, connect.NewRequest(&walcastv1.CompleteCallbackRequest{Id: 999999, Reason: "stuck"}))
				return err
			}, connect.CodeNotFound, "not found: task 999999", ""},
			{"CompleteCallback without a reason", func() error {
				_, err := c.CompleteCallback(ctx, connect.NewRequest(&walcastv1.CompleteCallbackRequest{Id: liveTask.GetId()}))
				return err
			}, connect.CodeInvalidArgument, "reason is required", ""},
			{"CompleteCallback with an oversized reason", func() error {
				_, err := c.CompleteCallback(ctx, connect.NewRequest(&walcastv1.CompleteCallbackRequest{Id: liveTask.GetId(),
					Reason: strings.Repeat("r", server.MaxReasonBytes+1)}))
				return err
			}, connect.CodeInvalidArgument, "reason is 1025 bytes, limit 1024", ""},
			{"CompleteCallback before the callback", func() error {
				_, err := c.CompleteCallback(ctx, connect.NewRequest(&walcastv1.CompleteCallbackRequest{Id: liveTask.GetId(), Reason: "stuck"}))
				return err
			}, connect.CodeFailedPrecondition, "has not reached its callback", ""},
			{"ListTasks with an unknown state", func() error {
				_, err := c.ListTasks(ctx, connect.NewRequest(&walcastv1.ListTasksRequest{States: []string{"DONE"}}))
				return err
			}, connect.CodeInvalidArgument, `unknown task state "DONE"`, ""},
			{"ListTasks with a negative limit", func() error {
				_, err := c.ListTasks(ctx, connect.NewRequest(&walcastv1.ListTasksRequest{Limit: -1}))
				return err
			}, connect.CodeInvalidArgument, "limit -1 is negative", ""},
			{"LookupKey without a key", func() error {
				_, err := c.LookupKey(ctx, connect.NewRequest(&walcastv1.LookupKeyRequest{Type: "CreateCollection.v1"}))
				return err
			}, connect.CodeInvalidArgument, "idempotency_key is required", ""},
			{"LookupKey of a malformed key", func() error {
				_, err := c.LookupKey(ctx, connect.NewRequest(&walcastv1.LookupKeyRequest{Type: "CreateCollection.v1", IdempotencyKey: "3:07:x"}))
				return err
			}, connect.CodeInvalidArgument, "invalid idempotency key", "3:07:x"},
			{"ack for a vchannel outside the task", func() error {
				_, err := c.Ack(ctx, connect.NewRequest(&walcastv1.AckRequest{BroadcastId: liveTask.GetId(), Vchannel: "wal-1/elsewhere"}))
				return err
			}, connect.CodeInvalidArgument, "wal-1/elsewhere is not a target of broadcast", ""},
			{"ack of a malformed vchannel", func() error {
				_, err := c.Ack(ctx, connect.NewRequest(&walcastv1.AckRequest{BroadcastId: liveTask.GetId(), Vchannel: "nope"}))
				return err
			}, connect.CodeInvalidArgument, `vchannel "nope" is not <pchannel>/<name>`, ""},
			{"ack without a broadcast id", func() error {
				_, err := c.Ack(ctx, connect.NewRequest(&walcastv1.AckRequest{Vchannel: "wal-0/c1v0"}))
				return err
			}, connect.CodeInvalidArgument, "broadcast_id is required", ""},
			{"ack with a corrupt message", func() error {
				_, err := c.Ack(ctx, connect.NewRequest(&walcastv1.AckRequest{BroadcastId: liveTask.GetId(), Vchannel: "wal-0/c1v0", Message: []byte{0xff, 0xff}}))
				return err
			}, connect.CodeInvalidArgument, "corrupt encoding", ""},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				before := snap(env, b)
				ce := wantCode(t, tc.call(), tc.code)
				if !strings.Contains(ce.Message(), tc.msg) {
					t.Errorf("message %q does not say %q", ce.Message(), tc.msg)
				}
				if tc.secret != "" && strings.Contains(ce.Message(), tc.secret) {
					t.Errorf("message %q leaks the raw idempotency key", ce.Message())
				}
				if after := snap(env, b); !after.equal(before) {
					t.Errorf("state changed: before %+v, after %+v", before, after)
				}
			})
		}

		// The live task completes on its consumers' acks, legacy style (id
		// and vchannel only).
		for _, v := range liveTask.GetVchannels() {
			if _, err := c.Ack(ctx, connect.NewRequest(&walcastv1.AckRequest{BroadcastId: liveTask.GetId(), Vchannel: v.GetVchannel()})); err != nil {
				t.Fatal(err)
			}
		}
		if res := <-live; res == nil || res.GetBroadcastId() != liveTask.GetId() {
			t.Fatalf("live broadcast %v", res)
		}
	})
}

// TestAckNotCancelledByClient: an ack whose RPC the client abandons is still
// recorded (the reference system's #45145).
func TestAckNotCancelledByClient(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		b := env.Open()
		c := dial(t, apitest.Serve(t, app.StaticLeader(b), nil), p)
		ctx := ctxT(t)

		entered := make(chan struct{}, 1)
		release := make(chan struct{})
		env.SetAckOnce(func(ctx context.Context, _ *broadcast.AckEvent) error {
			select {
			case entered <- struct{}{}:
			default:
			}
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		r := newReq()
		r.Type = apitest.Sync.String()
		done := broadcastInBackground(ctx, t, c, r)
		var id uint64
		waitFor(t, "the task's appends", func() bool {
			list, err := b.Tasks(broadcast.Filter{States: []broadcast.State{broadcast.Pending}})
			if err != nil || len(list) != 1 {
				return false
			}
			id = list[0].ID
			return !slices.ContainsFunc(list[0].VChannels, func(v broadcast.VChannelInfo) bool { return !v.Appended })
		})

		// The consumer gives up on its Ack while the server works on it.
		actx, cancel := context.WithCancel(ctx)
		acked := make(chan error, 1)
		go func() {
			_, err := c.Ack(actx, connect.NewRequest(&walcastv1.AckRequest{BroadcastId: id, Vchannel: "wal-0/c1v0",
				Checkpoint: &walcastv1.Checkpoint{MessageId: 1, TimeTick: 1}}))
			acked <- err
		}()
		select {
		case <-entered:
		case <-ctx.Done():
			t.Fatal("the ack never reached its callback")
		}
		cancel()
		if err := <-acked; connect.CodeOf(err) != connect.CodeCanceled {
			t.Fatalf("abandoned ack: %v", err)
		}
		close(release)
		waitFor(t, "the abandoned ack to be recorded", func() bool {
			ti, err := b.Task(id)
			return err == nil && ti.VChannels[0].Acked
		})
		for _, v := range []string{"wal-1/c1v1", string(apitest.Control)} {
			if _, err := c.Ack(ctx, connect.NewRequest(&walcastv1.AckRequest{BroadcastId: id, Vchannel: v})); err != nil {
				t.Fatal(err)
			}
		}
		if res := <-done; res == nil || res.GetBroadcastId() != id {
			t.Fatalf("broadcast %v", res)
		}
	})
}

func TestStuckCallbackRetryAndComplete(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		b := env.Open()
		c := dial(t, apitest.Serve(t, app.StaticLeader(b), nil), p)
		ctx := ctxT(t)

		env.SetCallback(func(context.Context, *broadcast.Event) error { return errors.New("downstream is down") })
		done := broadcastInBackground(ctx, t, c, newReq())
		var task *walcastv1.Task
		waitFor(t, "a failing callback", func() bool {
			list, err := c.ListTasks(ctx, connect.NewRequest(&walcastv1.ListTasksRequest{States: []string{"PENDING"}}))
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Msg.GetTasks()) != 1 {
				return false
			}
			task = list.Msg.GetTasks()[0]
			return task.GetCallback().GetAttempts() >= 2 && task.GetCallback().GetLastError() != ""
		})
		if !strings.Contains(task.GetCallback().GetLastError(), "downstream is down") || !task.GetCallback().GetRunning() {
			t.Fatalf("callback state %v", task.GetCallback())
		}
		if _, err := c.RetryCallback(ctx, connect.NewRequest(&walcastv1.RetryCallbackRequest{Id: task.GetId()})); err != nil {
			t.Fatal(err)
		}
		if _, err := c.CompleteCallback(ctx, connect.NewRequest(&walcastv1.CompleteCallbackRequest{Id: task.GetId(), Reason: "operator: skip"})); err != nil {
			t.Fatal(err)
		}
		res := <-done
		if res == nil || res.GetOutcome().GetStatus() != walcastv1.OutcomeStatus_OUTCOME_STATUS_FORCE_COMPLETED || res.GetOutcome().GetDetail() != "operator: skip" {
			t.Fatalf("broadcast %v", res)
		}
		_, err := c.CompleteCallback(ctx, connect.NewRequest(&walcastv1.CompleteCallbackRequest{Id: task.GetId(), Reason: "again"}))
		if ce := wantCode(t, err, connect.CodeFailedPrecondition); !strings.Contains(ce.Message(), "already TOMBSTONE") {
			t.Fatalf("message %q", ce.Message())
		}
		_, err = c.RetryCallback(ctx, connect.NewRequest(&walcastv1.RetryCallbackRequest{Id: task.GetId()}))
		wantCode(t, err, connect.CodeFailedPrecondition)
	})
}

func TestR9_2_NotLeaderRedirects(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		const leader = "http://127.0.0.1:7001"
		notLeader := app.LeaderFunc(func() (*broadcast.Broadcaster, error) {
			return nil, &server.NotLeaderError{Leader: leader}
		})
		c := dial(t, apitest.Serve(t, notLeader, nil), p)
		ctx := ctxT(t)

		_, err := c.Broadcast(ctx, connect.NewRequest(newReq()))
		ce := wantCode(t, err, connect.CodeUnavailable)
		if got := ce.Meta().Get(server.LeaderHeader); got != leader {
			t.Fatalf("%s header %q, want %q (meta %v)", server.LeaderHeader, got, leader, ce.Meta())
		}
		if !strings.Contains(ce.Message(), "the leader is at "+leader) {
			t.Fatalf("message %q", ce.Message())
		}
		if reason, md := reasonOf(ce); reason != server.ReasonNotLeader || md["leader"] != leader {
			t.Fatalf("reason %q %v", reason, md)
		}
		_, err = c.Ack(ctx, connect.NewRequest(&walcastv1.AckRequest{BroadcastId: 1, Vchannel: "wal-0/a"}))
		if ce := wantCode(t, err, connect.CodeUnavailable); ce.Meta().Get(server.LeaderHeader) != leader {
			t.Fatalf("ack: meta %v", ce.Meta())
		}

		// While an election runs there is no one to redirect to.
		unknown := app.LeaderFunc(func() (*broadcast.Broadcaster, error) { return nil, &server.NotLeaderError{} })
		c = dial(t, apitest.Serve(t, unknown, nil), p)
		_, err = c.GetTask(ctx, connect.NewRequest(&walcastv1.GetTaskRequest{Id: 1}))
		ce = wantCode(t, err, connect.CodeUnavailable)
		if ce.Meta().Get(server.LeaderHeader) != "" || !strings.Contains(ce.Message(), "no leader is known") {
			t.Fatalf("message %q, meta %v", ce.Message(), ce.Meta())
		}
	})
}

func TestR8_1_NotPrimary(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		b := env.Open(func(cfg *broadcast.Config) {
			cfg.CheckRole = func(context.Context) error { return server.ErrNotPrimary }
		})
		c := dial(t, apitest.Serve(t, app.StaticLeader(b), nil), p)
		before := snap(env, b)
		_, err := c.Broadcast(ctxT(t), connect.NewRequest(newReq()))
		ce := wantCode(t, err, connect.CodeFailedPrecondition)
		if reason, _ := reasonOf(ce); reason != server.ReasonNotPrimary || !strings.Contains(ce.Message(), "cluster is not primary, cannot do any DDL/DCL") {
			t.Fatalf("reason %q, message %q", reason, ce.Message())
		}
		if after := snap(env, b); !after.equal(before) {
			t.Fatalf("state changed: %+v -> %+v", before, after)
		}
	})
}

// TestR4_7_ClosedBroadcasterSaysTaskNotCreated: a request refused because
// the broadcaster stopped is Unavailable and says retrying is safe.
func TestR4_7_ClosedBroadcasterSaysTaskNotCreated(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		b := env.Open()
		_ = b.Close()
		c := dial(t, apitest.Serve(t, app.StaticLeader(b), nil), p)
		_, err := c.Broadcast(ctxT(t), connect.NewRequest(newReq()))
		ce := wantCode(t, err, connect.CodeUnavailable)
		if reason, _ := reasonOf(ce); reason != server.ReasonTaskNotCreated || !strings.Contains(ce.Message(), "retrying is safe") {
			t.Fatalf("reason %q, message %q", reason, ce.Message())
		}
		if keys := env.TaskKeys(); len(keys) != 0 {
			t.Fatalf("task keys %v", keys)
		}
	})
}

// TestSmallResponsesAreNotCompressed: a client that accepts gzip (as every
// Connect client does) gets a broadcast's few hundred bytes uncompressed,
// and a large answer compressed: gzip costs more than it saves below
// CompressMinBytes.
func TestSmallResponsesAreNotCompressed(t *testing.T) {
	env := apitest.New(t)
	b := env.Open()
	srv := apitest.Serve(t, app.StaticLeader(b), nil)
	post := func(procedure string, msg proto.Message) (*http.Response, []byte) {
		t.Helper()
		body, err := protojson.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, srv.URL+procedure, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := srv.Client().Transport.RoundTrip(req) // no transparent decompression
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", procedure, resp.StatusCode, raw)
		}
		return resp, raw
	}
	resp, raw := post(walcastv1connect.BroadcastServiceBroadcastProcedure, newReq())
	if enc := resp.Header.Get("Content-Encoding"); enc != "" || len(raw) >= server.CompressMinBytes {
		t.Fatalf("a %d-byte broadcast response came with Content-Encoding %q", len(raw), enc)
	}
	// Enough tasks that their listing passes the threshold.
	for i := range 40 {
		r := newReq()
		r.ResourceKeys = []string{fmt.Sprintf("Collection:db1:c%d@X", i)}
		post(walcastv1connect.BroadcastServiceBroadcastProcedure, r)
	}
	resp, raw = post(walcastv1connect.BroadcastServiceListTasksProcedure, &walcastv1.ListTasksRequest{States: []string{"TOMBSTONE"}})
	if enc := resp.Header.Get("Content-Encoding"); enc != "gzip" {
		t.Fatalf("a %d-byte compressed task listing came with Content-Encoding %q, want gzip", len(raw), enc)
	}
}
