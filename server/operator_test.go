package server_test

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/auth"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/server"
	"github.com/walcast/walcast/server/apitest"
)

// TestR9_5_ListTasksPagesThroughEveryTask: a page is capped by the server,
// never silently: more says that tasks remain, and a cursor (the last id)
// gets the next page, newest first by default and oldest first on request,
// until every task was listed once.
func TestR9_5_ListTasksPagesThroughEveryTask(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		c := dial(t, apitest.Serve(t, app.StaticLeader(env.Open()), nil, server.WithMaxListTasks(2)), p)
		ctx := ctxT(t)
		var ids []uint64
		for i := range 5 {
			r := newReq()
			r.ResourceKeys = []string{fmt.Sprintf("Collection:db1:c%d@X", i)}
			ids = append(ids, broadcastOK(t, ctx, c, r).GetBroadcastId())
		}
		walk := func(oldest bool, limit int32) (got []uint64, pages int) {
			var cursor uint64
			for {
				req := &walcastv1.ListTasksRequest{OldestFirst: oldest, Limit: limit}
				if oldest {
					req.AfterId = cursor
				} else {
					req.BeforeId = cursor
				}
				resp, err := c.ListTasks(ctx, connect.NewRequest(req))
				if err != nil {
					t.Fatal(err)
				}
				pages++
				for _, task := range resp.Msg.GetTasks() {
					got = append(got, task.GetId())
					cursor = task.GetId()
				}
				if len(resp.Msg.GetTasks()) > 2 {
					t.Fatalf("page of %d tasks, cap 2", len(resp.Msg.GetTasks()))
				}
				if !resp.Msg.GetMore() {
					return got, pages
				}
			}
		}
		newest, pages := walk(false, 0)
		want := fmt.Sprint(ids[4], ids[3], ids[2], ids[1], ids[0])
		if fmt.Sprint(newest) != "["+want+"]" || pages != 3 {
			t.Fatalf("newest first: %v in %d pages, want [%s] in 3", newest, pages, want)
		}
		oldest, _ := walk(true, 100) // a larger limit is capped, not refused
		if fmt.Sprint(oldest) != fmt.Sprint(ids) {
			t.Fatalf("oldest first: %v, want %v", oldest, ids)
		}
		one, err := c.ListTasks(ctx, connect.NewRequest(&walcastv1.ListTasksRequest{Limit: 5}))
		if err != nil || len(one.Msg.GetTasks()) != 2 || !one.Msg.GetMore() {
			t.Fatalf("limit above the cap: %v, %v", one.Msg, err)
		}
		all, err := c.ListTasks(ctx, connect.NewRequest(&walcastv1.ListTasksRequest{Limit: 1, BeforeId: ids[1]}))
		if err != nil || len(all.Msg.GetTasks()) != 1 || all.Msg.GetTasks()[0].GetId() != ids[0] || all.Msg.GetMore() {
			t.Fatalf("last page: %v, %v", all.Msg, err)
		}
		_, err = c.ListTasks(ctx, connect.NewRequest(&walcastv1.ListTasksRequest{BeforeId: 3, AfterId: 2}))
		wantCode(t, err, connect.CodeInvalidArgument)
	})
}

// TestR9_5_ListTasksPagesByToken: a page that stops before the end carries
// a next_page_token; sent back with the same filters and order it gives the
// next page, newest first or oldest first. Tasks created between pages never
// make a task of the walk come twice or go missing. A token of another
// list, a garbage one or one of no task is InvalidArgument.
func TestR9_5_ListTasksPagesByToken(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		c := dial(t, apitest.Serve(t, app.StaticLeader(env.Open()), nil, server.WithMaxListTasks(2)), p)
		ctx := ctxT(t)
		n := 0
		add := func() uint64 {
			r := newReq()
			r.ResourceKeys = []string{fmt.Sprintf("Collection:db1:c%d@X", n)}
			n++
			return broadcastOK(t, ctx, c, r).GetBroadcastId()
		}
		var ids []uint64
		for range 5 {
			ids = append(ids, add())
		}
		for _, oldest := range []bool{false, true} {
			var got []uint64
			token := ""
			for pages := 0; ; pages++ {
				resp, err := c.ListTasks(ctx, connect.NewRequest(&walcastv1.ListTasksRequest{OldestFirst: oldest, PageToken: token}))
				if err != nil {
					t.Fatal(err)
				}
				for _, task := range resp.Msg.GetTasks() {
					got = append(got, task.GetId())
				}
				if (resp.Msg.GetNextPageToken() != "") != resp.Msg.GetMore() {
					t.Fatalf("more %v with next_page_token %q", resp.Msg.GetMore(), resp.Msg.GetNextPageToken())
				}
				if token = resp.Msg.GetNextPageToken(); token == "" {
					break
				}
				if pages < 2 {
					add() // a newer task between pages
				}
			}
			for i, id := range got {
				if i > 0 && (oldest && id <= got[i-1] || !oldest && id >= got[i-1]) {
					t.Fatalf("oldest first %v: %v out of order or twice", oldest, got)
				}
			}
			for _, id := range ids {
				if !slices.Contains(got, id) {
					t.Fatalf("oldest first %v: task %d existed throughout, not listed: %v", oldest, id, got)
				}
			}
		}
		for _, bad := range []string{"not a token!", base64.RawURLEncoding.EncodeToString([]byte("coll:orders")),
			base64.RawURLEncoding.EncodeToString([]byte("task:0")), base64.RawURLEncoding.EncodeToString([]byte("task:x"))} {
			_, err := c.ListTasks(ctx, connect.NewRequest(&walcastv1.ListTasksRequest{PageToken: bad}))
			wantCode(t, err, connect.CodeInvalidArgument)
		}
	})
}

// TestR7_5_ListKeysPagesByToken: ListKeys pages the remembered keys by
// their originals' ids, at most the server's page size a page whatever
// the limit asked, each reported as LookupKey reports it, by scope and
// fingerprint, never raw; the last page has no next_page_token. A
// negative limit and a token of another list or of nothing are
// InvalidArgument.
func TestR7_5_ListKeysPagesByToken(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		c := dial(t, apitest.Serve(t, app.StaticLeader(env.Open()), nil, server.WithMaxListTasks(2)), p)
		ctx := ctxT(t)
		want := map[uint64]message.IdempotencyKey{}
		for i := range 5 {
			r := newReq()
			r.ResourceKeys = []string{fmt.Sprintf("Collection:db1:c%d@X", i)}
			if i != 2 {
				r.IdempotencyKey = string(message.CollectionKey(7, fmt.Sprint("req-", i)))
			}
			id := broadcastOK(t, ctx, c, r).GetBroadcastId()
			if i != 2 {
				want[id] = message.IdempotencyKey(r.IdempotencyKey)
			}
		}
		var got []uint64
		token := ""
		for pages := 0; ; pages++ {
			resp, err := c.ListKeys(ctx, connect.NewRequest(&walcastv1.ListKeysRequest{Limit: 100, PageToken: token}))
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Msg.GetKeys()) > 2 {
				t.Fatalf("page of %d keys, the server's page is 2", len(resp.Msg.GetKeys()))
			}
			for _, k := range resp.Msg.GetKeys() {
				got = append(got, k.GetBroadcastId())
				ik := want[k.GetBroadcastId()]
				lk, err := c.LookupKey(ctx, connect.NewRequest(&walcastv1.LookupKeyRequest{Type: k.GetType(), IdempotencyKey: string(ik)}))
				if err != nil || lk.Msg.GetBroadcastId() != k.GetBroadcastId() || k.GetState() != lk.Msg.GetState() ||
					k.GetKeyFingerprint() != ik.Fingerprint() || k.GetScope() != "collection:7" ||
					!proto.Equal(k.GetWindow(), lk.Msg.GetWindow()) || !proto.Equal(k.GetOutcome(), lk.Msg.GetOutcome()) {
					t.Fatalf("listed %v; lookup of %q: %v, %v", k, ik, lk, err)
				}
				if strings.Contains(k.String(), "req-") {
					t.Fatalf("a raw key listed: %v", k)
				}
			}
			if token = resp.Msg.GetNextPageToken(); token == "" {
				break
			}
			if pages > 5 {
				t.Fatalf("no end after %d pages: %v", pages, got)
			}
		}
		if len(got) != len(want) || !slices.IsSorted(got) {
			t.Fatalf("keys of %v listed, want those of %v by id", got, want)
		}
		_, err := c.ListKeys(ctx, connect.NewRequest(&walcastv1.ListKeysRequest{Limit: -1}))
		wantCode(t, err, connect.CodeInvalidArgument)
		for _, bad := range []string{"not a token!", base64.RawURLEncoding.EncodeToString([]byte("task:3")),
			base64.RawURLEncoding.EncodeToString([]byte("key:0")), base64.RawURLEncoding.EncodeToString([]byte("key:x"))} {
			_, err := c.ListKeys(ctx, connect.NewRequest(&walcastv1.ListKeysRequest{PageToken: bad}))
			wantCode(t, err, connect.CodeInvalidArgument)
		}
	})
}

// TestR5_6_ForceAckResolvesATaskWaitingForAGoneConsumer: a sync-up task
// waits for its consumers' acks; an admin acks its copies (from their append
// results) and it completes. Bad requests change nothing: a vchannel outside
// the task, no reason, a finished task.
func TestR5_6_ForceAckResolvesATaskWaitingForAGoneConsumer(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		var audit syncBuf
		c := dial(t, apitest.Serve(t, app.StaticLeader(env.Open()), nil,
			server.WithConnectOptions(connect.WithInterceptors(auth.NewAudit(&audit).Interceptor()))), p)
		ctx := ctxT(t)
		req := newReq()
		req.Type = apitest.Sync.String()
		done := broadcastInBackground(ctx, t, c, req)
		task := appendedTask(ctx, t, c, "a task waiting for its consumers' acks")
		if task.GetStage() != "queued" {
			t.Fatalf("stage %q of a sync-up task waiting for acks, want queued", task.GetStage())
		}
		id := task.GetId()
		ack := func(reason string, vs ...string) error {
			_, err := c.ForceAck(ctx, connect.NewRequest(&walcastv1.ForceAckRequest{Id: id, Vchannels: vs, Reason: reason}))
			return err
		}
		wantCode(t, ack("consumer gone", "wal-0/c1v0", "wal-1/other"), connect.CodeInvalidArgument)
		wantCode(t, ack(" ", "wal-0/c1v0"), connect.CodeInvalidArgument)
		wantCode(t, ack("consumer gone"), connect.CodeInvalidArgument)
		_, err := c.ForceAck(ctx, connect.NewRequest(&walcastv1.ForceAckRequest{Id: 999, Vchannels: []string{"wal-0/c1v0"}, Reason: "x"}))
		wantCode(t, err, connect.CodeNotFound)
		after, err := c.GetTask(ctx, connect.NewRequest(&walcastv1.GetTaskRequest{Id: id}))
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range after.Msg.GetVchannels() {
			if v.GetAcked() {
				t.Fatalf("%s acked by a refused request", v.GetVchannel())
			}
		}
		if err := ack("consumer of wal-0 and wal-1 decommissioned", "wal-0/c1v0", "wal-1/c1v1", string(apitest.Control)); err != nil {
			t.Fatal(err)
		}
		res := <-done
		if res == nil || res.GetBroadcastId() != id {
			t.Fatalf("broadcast after the operator's acks: %v", res)
		}
		err = ack("again", "wal-0/c1v0")
		if ce := wantCode(t, err, connect.CodeFailedPrecondition); !strings.Contains(ce.Message(), "finished") {
			t.Fatalf("ack of a finished task: %v", err)
		}
		// The operator's acks are in the audit log, with the reason.
		if log := audit.String(); !strings.Contains(log, `"rpc":"/walcast.api.v1.BroadcastService/ForceAck"`) ||
			!strings.Contains(log, `consumer of wal-0 and wal-1 decommissioned`) || !strings.Contains(log, `"result":"ok"`) {
			t.Fatalf("audit log:\n%s", log)
		}
	})
}

// syncBuf is a bytes.Buffer for one writer and one reader at once.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
