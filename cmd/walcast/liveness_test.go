package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// Liveness from outside (issue 34): real standalone processes, clients
// that give up, and a key that must stay usable. Behind WALCAST_LIVENESS,
// which .ci/run turns on in a step of its own: they take a minute or two,
// and this package is already the slowest.

func needLiveness(t *testing.T) {
	t.Helper()
	if os.Getenv("WALCAST_LIVENESS") == "" {
		t.Skip("set WALCAST_LIVENESS=1 to run the liveness tests against standalone processes")
	}
}

// storyCall is one request of the story on its way: result waits for its
// answer; giveUp makes its caller give up now.
type storyCall struct {
	result func() (id uint64, dup bool, err error)
	giveUp func()
}

// sender sends the story's request (the same one every time), its caller
// giving up after timeout at the latest.
type sender func(timeout time.Duration) *storyCall

// cliSender sends with the walcast command args (a client command with
// --json, the address given); its caller gives up by Ctrl-C.
func cliSender(t *testing.T, args ...string) sender {
	return func(timeout time.Duration) *storyCall {
		c := startCLI(t, nil, append(args, "--timeout", timeout.String())...)
		return &storyCall{giveUp: c.interrupt, result: func() (uint64, bool, error) {
			out, errOut, code := c.wait()
			if code != 0 {
				return 0, false, fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errOut))
			}
			var r struct {
				BroadcastID uint64 `json:"broadcast_id"`
				Duplicated  bool   `json:"duplicated"`
				Result      *struct {
					BroadcastID uint64 `json:"broadcast_id"`
					Duplicated  bool   `json:"duplicated"`
				} `json:"result"`
			}
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				return 0, false, fmt.Errorf("output %q: %w", out, err)
			}
			if r.Result != nil { // a DDL's (import start)
				return r.Result.BroadcastID, r.Result.Duplicated, nil
			}
			return r.BroadcastID, r.Duplicated, nil
		}}
	}
}

// connectHTTP calls the Connect API with plain HTTP and JSON, as curl would.
type connectHTTP struct {
	api string
	hc  *http.Client
}

func newConnectHTTP(t *testing.T, api string) *connectHTTP {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &connectHTTP{api: api, hc: &http.Client{Transport: tr}}
}

// call posts req to procedure and decodes the answer into resp.
func (h *connectHTTP) call(ctx context.Context, procedure string, req, resp proto.Message) error {
	body, err := protojson.Marshal(req)
	if err != nil {
		return err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+h.api+procedure, bytes.NewReader(body))
	if err != nil {
		return err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Connect-Protocol-Version", "1")
	r, err := h.hc.Do(hr)
	if err != nil {
		return err
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	if r.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %s", r.StatusCode, b)
	}
	return protojson.Unmarshal(b, resp)
}

// httpSender sends req to procedure over HTTP; the DDL result or broadcast
// result is read from resp by result. Its caller gives up by cancelling
// the request.
func (h *connectHTTP) sender(procedure string, req proto.Message, newResp func() proto.Message, result func(proto.Message) (uint64, bool)) sender {
	return func(timeout time.Duration) *storyCall {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		done := make(chan error, 1)
		resp := newResp()
		go func() { done <- h.call(ctx, procedure, req, resp) }()
		return &storyCall{giveUp: cancel, result: func() (uint64, bool, error) {
			defer cancel()
			if err := <-done; err != nil {
				return 0, false, err
			}
			id, dup := result(resp)
			return id, dup, nil
		}}
	}
}

// lockOf returns the holders and waiters of k's name in c's lock table.
func lockOf(ctx context.Context, t *testing.T, c *client.Client, k resource.Key) (holders, waiters int) {
	t.Helper()
	ls, err := c.ListLocks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if l.GetDomain() == k.Domain.String() && l.GetName() == k.Name {
			holders, waiters = len(l.GetHolders()), len(l.GetWaiters())
		}
	}
	return holders, waiters
}

// stuckKeyStory runs the story of issue 34 with send, and returns the
// broadcast the request finally got:
//
//  1. something (a transaction) holds hold;
//  2. the request is sent twice, the second once the first waits for
//     hold; the second's caller gives up at its deadline, then the
//     first's;
//  3. the holder ends: hold is free;
//  4. the same request again is answered, as new work, and its retry by
//     it.
func stuckKeyStory(t *testing.T, c *client.Client, hold resource.Key, send sender) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	txn, err := c.BeginTxn(ctx, &client.BeginTxnRequest{Type: app.GenericType, Payload: []byte("holder"),
		VChannels: []message.VChannel{"wal-0/holder"}, ResourceKeys: []resource.Key{hold}})
	if err != nil {
		t.Fatal(err)
	}
	first := send(time.Minute)
	waitUntil(t, "the first request to wait for "+hold.String(), func() bool { _, w := lockOf(ctx, t, c, hold); return w == 1 })
	second := send(2 * time.Second)
	if id, _, err := second.result(); err == nil {
		t.Fatalf("the second request was answered (broadcast %d) while %s was held", id, hold)
	}
	first.giveUp()
	if id, _, err := first.result(); err == nil {
		t.Fatalf("the first request was answered (broadcast %d) while %s was held", id, hold)
	}
	waitUntil(t, "the first request's lock wait to go", func() bool { _, w := lockOf(ctx, t, c, hold); return w == 0 })
	if _, err := c.CommitTxn(ctx, txn.ID, &client.TxnMemberRequest{Type: app.GenericType, Payload: []byte("end")}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, hold.String()+" to be free", func() bool { h, w := lockOf(ctx, t, c, hold); return h+w == 0 })
	id, dup, err := send(time.Minute).result()
	if err != nil || dup || id == 0 {
		t.Fatalf("the same request again: broadcast %d (duplicate %v), %v; want it answered as new work", id, dup, err)
	}
	again, dup, err := send(time.Minute).result()
	if err != nil || !dup || again != id {
		t.Fatalf("its retry: broadcast %d (duplicate %v), %v; want broadcast %d as a duplicate", again, dup, err, id)
	}
	return id
}

// standalone is a standalone process on a data directory and ports of
// its own, as the restart and kill -9 tests run one: start starts it
// again on them (after stop or kill).
type standalone struct {
	t    *testing.T
	dir  string
	args []string
	p    *proc
}

func newStandalone(t *testing.T) *standalone {
	t.Helper()
	s := &standalone{t: t, dir: t.TempDir()}
	s.args = []string{"standalone", "--data-dir", s.dir, "--api-addr", fmt.Sprintf("127.0.0.1:%d", freePortRun(t)), "--metrics-addr", ""}
	s.start()
	return s
}

func (s *standalone) start() *proc {
	s.t.Helper()
	s.p = start(s.t, "standalone", s.args...)
	return s.p
}

// client returns a client of the process, closed when the test ends.
func (s *standalone) client(opts ...client.Option) *client.Client {
	s.t.Helper()
	c, err := client.New([]string{s.p.api}, opts...)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(c.Close)
	return c
}

// TestR7_3_StuckKeyStoryOnAStandalone runs the stuck key of issue 34
// against a standalone process, through the CLI and over HTTP (JSON on the
// Connect API), for a generic broadcast and for an import (walcast import
// start --key), before and after a restart: after both callers gave up
// and the holder ended, the same request is answered, and every story's
// request is answered by its original after the restart.
func TestR7_3_StuckKeyStoryOnAStandalone(t *testing.T) {
	needLiveness(t)
	s := newStandalone(t)
	p, dir := s.p, s.dir
	c := s.client()
	for _, a := range [][]string{{"db", "create", "shop"}, {"collection", "create", "orders_cli", "--db", "shop"},
		{"collection", "create", "orders_http", "--db", "shop"}} {
		if _, err := run(t, append(a, "--addr", p.api)...); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(dir, "imports", "a.jsonl"), `{"id": 1, "vector": [1, 2]}`+"\n")
	h := newConnectHTTP(t, p.api)
	broadcastResult := func(m proto.Message) (uint64, bool) {
		r := m.(*walcastv1.BroadcastResponse)
		return r.GetBroadcastId(), r.GetDuplicated()
	}
	importResult := func(m proto.Message) (uint64, bool) {
		r := m.(*walcastv1.ImportResponse).GetResult()
		return r.GetBroadcastId(), r.GetDuplicated()
	}
	stories := []struct {
		name string
		hold resource.Key
		send func(key string) sender
	}{
		{"cli-broadcast", resource.ExclusiveCollection("zz", "blocker_cli"), func(key string) sender {
			return cliSender(t, "broadcast", "--addr", p.api, "--json", "--type", app.GenericType.String(), "--payload", "p",
				"--vchannel", "wal-1/zz", "--key", "Collection:zz:blocker_cli@X", "--scope", "cluster", "--client-key", key)
		}},
		{"http-broadcast", resource.ExclusiveCollection("zz", "blocker_http"), func(key string) sender {
			return h.sender(walcastv1connect.BroadcastServiceBroadcastProcedure, &walcastv1.BroadcastRequest{
				Type: app.GenericType.String(), Payload: []byte("p"), Vchannels: []string{"wal-1/zz"},
				ResourceKeys: []string{"Collection:zz:blocker_http@X"}, IdempotencyKey: string(message.ClusterKey(key))},
				func() proto.Message { return new(walcastv1.BroadcastResponse) }, broadcastResult)
		}},
		{"cli-import", resource.ExclusiveCollection("shop", "orders_cli"), func(key string) sender {
			return cliSender(t, "import", "start", "orders_cli", "a.jsonl", "--db", "shop", "--key", key, "--addr", p.api, "--json")
		}},
		{"http-import", resource.ExclusiveCollection("shop", "orders_http"), func(key string) sender {
			return h.sender(walcastv1connect.MetaServiceImportProcedure, &walcastv1.ImportRequest{
				Database: "shop", Collection: "orders_http", Files: []string{"a.jsonl"}, IdempotencyKey: key},
				func() proto.Message { return new(walcastv1.ImportResponse) }, importResult)
		}},
	}
	type answered struct {
		send sender
		id   uint64
	}
	var done []answered
	for _, phase := range []string{"before", "after"} {
		if phase == "after" {
			p.stop()
			p = s.start()
			for _, a := range done {
				if id, dup, err := a.send(time.Minute).result(); err != nil || !dup || id != a.id {
					t.Fatalf("after the restart: broadcast %d (duplicate %v), %v; want broadcast %d as a duplicate", id, dup, err, a.id)
				}
			}
		}
		for _, st := range stories {
			t.Logf("%s the restart: %s", phase, st.name)
			send := st.send(st.name + "-" + phase)
			done = append(done, answered{send, stuckKeyStory(t, c, st.hold, send)})
		}
	}
	p.stop()
}
