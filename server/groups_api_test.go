package server_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/server"
)

// standaloneWith starts a standalone process (embedded etcd and NATS) with
// mod applied to its configuration; it is closed when the test ends.
func standaloneWith(t *testing.T, ctx context.Context, name string, mod func(*server.Config)) *server.Process {
	t.Helper()
	return standaloneApp(t, ctx, name, app.Generic{}, mod)
}

// standaloneApp is standaloneWith serving app.
func standaloneApp(t *testing.T, ctx context.Context, name string, app app.App, mod func(*server.Config)) *server.Process {
	t.Helper()
	cfg := server.Default()
	cfg.DataDir = t.TempDir()
	cfg.Cluster.Name = name
	cfg.API.Addr = "127.0.0.1:0"
	cfg.Metrics.Addr = ""
	cfg.Log.Level = "error"
	if mod != nil {
		mod(&cfg)
	}
	p, err := server.StartStandalone(ctx, cfg, app)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func newClient(t *testing.T, p *server.Process, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New([]string{p.APIAddr()}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func rawClient(p *server.Process) walcastv1connect.BroadcastServiceClient {
	return walcastv1connect.NewBroadcastServiceClient(http.DefaultClient, "http://"+p.APIAddr())
}

// errorInfo returns the reason and metadata of err's walcast ErrorInfo.
func errorInfo(t *testing.T, err error) (connect.Code, string, map[string]string) {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("%v is not a connect error", err)
	}
	reason, meta := reasonOf(ce)
	return ce.Code(), reason, meta
}

// TestR13_15_NoWaitBusyNamesHolder: a no_wait broadcast on a key another
// holds fails at once with Aborted, reason RESOURCE_BUSY and the holder
// named (the ErrorInfo's metadata, the client's Error.Holder), and creates
// nothing; on a free key it broadcasts as usual. A no_wait BeginTxn is
// refused the same way.
func TestR13_15_NoWaitBusyNamesHolder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := standaloneWith(t, ctx, "east", nil)
	c := newClient(t, p)
	key := resource.ExclusiveCollection("db", "c1")
	x, err := c.BeginTxn(ctx, &client.BeginTxnRequest{Type: app.GenericType, Payload: []byte("begin"),
		VChannels: []message.VChannel{"wal-1/c1v0"}, ResourceKeys: []resource.Key{key}})
	if err != nil {
		t.Fatal(err)
	}
	before, err := c.ListTasks(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	req := &walcastv1.BroadcastRequest{Type: app.GenericType.String(), Payload: []byte("x"), Vchannels: []string{"wal-1/c1v0"},
		ResourceKeys: []string{key.String()}, NoWait: true}
	start := time.Now()
	_, err = rawClient(p).Broadcast(ctx, connect.NewRequest(req))
	code, reason, meta := errorInfo(t, err)
	holder := fmt.Sprintf("transaction %d@X", x.ID)
	if code != connect.CodeAborted || reason != server.ReasonResourceBusy || meta["holder"] != holder || meta["key"] != key.String() ||
		!strings.Contains(err.Error(), holder) {
		t.Fatalf("no_wait broadcast on a held key: %v (code %v, reason %q, metadata %v), want Aborted RESOURCE_BUSY naming %q", err, code, reason, meta, holder)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("no_wait took %v: it queued", d)
	}
	_, err = c.Broadcast(ctx, &client.BroadcastRequest{Type: app.GenericType, Payload: []byte("x"), VChannels: []message.VChannel{"wal-1/c1v0"},
		ResourceKeys: []resource.Key{key}, NoWait: true})
	var ce *client.Error
	if !errors.Is(err, client.ErrBusy) || errors.Is(err, client.ErrFailedPrecondition) || !errors.As(err, &ce) || ce.Holder != holder || ce.Key != key.String() {
		t.Fatalf("client no_wait: %v, want ErrBusy with holder %q", err, holder)
	}
	_, err = c.BeginTxn(ctx, &client.BeginTxnRequest{Type: app.GenericType, VChannels: []message.VChannel{"wal-1/c1v0"},
		ResourceKeys: []resource.Key{resource.SharedCollection("db", "c1")}, NoWait: true})
	if !errors.Is(err, client.ErrBusy) {
		t.Fatalf("no_wait BeginTxn on a held key: %v, want ErrBusy", err)
	}
	after, err := c.ListTasks(ctx, nil)
	if err != nil || len(after) != len(before) {
		t.Fatalf("busy refusals created tasks: %d before, %d after (%v)", len(before), len(after), err)
	}
	// Another key is free: no_wait broadcasts at once.
	r, err := c.Broadcast(ctx, &client.BroadcastRequest{Type: app.GenericType, Payload: []byte("y"), VChannels: []message.VChannel{"wal-1/c2v0"},
		ResourceKeys: []resource.Key{resource.ExclusiveCollection("db", "c2")}, NoWait: true})
	if err != nil || r.Outcome.GetStatus() != walcastv1.OutcomeStatus_OUTCOME_STATUS_SUCCEEDED {
		t.Fatalf("no_wait on a free key: %+v, %v", r, err)
	}
	if _, err := c.RollbackTxn(ctx, x.ID, &client.TxnMemberRequest{Type: app.GenericType}); err != nil {
		t.Fatal(err)
	}
	// Released: the key is free for no_wait now.
	if _, err := c.Broadcast(ctx, &client.BroadcastRequest{Type: app.GenericType, VChannels: []message.VChannel{"wal-1/c1v0"},
		ResourceKeys: []resource.Key{key}, NoWait: true}); err != nil {
		t.Fatalf("no_wait after the transaction's rollback: %v", err)
	}
}

// TestR13_1_TxnThroughTheAPI runs a transaction through the API on a
// standalone: Begin holds the keys (a conflicting broadcast queues behind
// them), a retried Begin with the admission identity returns the open
// transaction at once, bodies keep its targets and keys, GetGroup and
// ListGroups show it, Commit releases the keys (the queued broadcast then
// runs), a retried keyed Commit gets the Commit's result after the end, and
// a Rollback after the Commit is refused.
func TestR13_1_TxnThroughTheAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := standaloneWith(t, ctx, "east", nil)
	c := newClient(t, p)
	key := resource.ExclusiveCollection("db", "c1")
	targets := []message.VChannel{"wal-1/c1v0", "wal-2/c1v1"}
	begin := &client.BeginTxnRequest{Type: app.GenericType, Payload: []byte("begin"), VChannels: targets,
		ResourceKeys: []resource.Key{key}, Scope: client.CollectionScope(1), ClientKey: "import-7"}
	x, err := c.BeginTxn(ctx, begin)
	if err != nil {
		t.Fatal(err)
	}
	if x.ID == 0 || x.Duplicated || x.Begin.BroadcastID != x.ID || x.Begin.Outcome.GetStatus() != walcastv1.OutcomeStatus_OUTCOME_STATUS_SUCCEEDED {
		t.Fatalf("BeginTxn: %+v", x)
	}
	// A broadcast on the key queues behind the transaction.
	queued := make(chan error, 1)
	go func() {
		_, err := c.Broadcast(ctx, &client.BroadcastRequest{Type: app.GenericType, Payload: []byte("ddl"), VChannels: []message.VChannel{"wal-3/c1v2"},
			ResourceKeys: []resource.Key{key}})
		queued <- err
	}()
	waitUntil(t, "the conflicting broadcast to queue behind the transaction", func() bool {
		locks, err := c.ListLocks(ctx)
		if err != nil {
			return false
		}
		for _, l := range locks {
			if l.GetName() == "db:c1" && len(l.GetWaiters()) > 0 && len(l.GetHolders()) == 1 &&
				l.GetHolders()[0].GetOwner() == fmt.Sprintf("transaction %d", x.ID) {
				return true
			}
		}
		return false
	})
	// The retried Begin returns the open transaction, not waiting for the
	// keys it holds itself.
	again, err := c.BeginTxn(ctx, &client.BeginTxnRequest{Type: app.GenericType, Payload: []byte("begin"), VChannels: targets,
		ResourceKeys: []resource.Key{key}, Scope: client.CollectionScope(1), ClientKey: "import-7"})
	if err != nil || !again.Duplicated || again.ID != x.ID {
		t.Fatalf("retried BeginTxn: %+v, %v; want a duplicate of %d", again, err, x.ID)
	}
	bodyReq := &client.TxnMemberRequest{Type: app.GenericType, Payload: []byte("body-1"), Scope: client.CollectionScope(1), ClientKey: "import-7-body-1"}
	body, err := c.TxnBody(ctx, x.ID, bodyReq)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := body.Appends["wal-2/c1v1"]; !ok || len(body.Appends) != 3 {
		t.Fatalf("body appended to %v, want the transaction's targets and the control channel", body.Appends)
	}
	bt, err := c.GetTask(ctx, body.BroadcastID)
	if err != nil {
		t.Fatal(err)
	}
	if g := bt.GetGroup(); g.GetId() != x.ID || g.GetSeq() != 1 || g.GetKind() != walcastv1.GroupKind_GROUP_KIND_BODY || !slices.Contains(bt.GetResourceKeys(), key.String()) {
		t.Fatalf("body task %d: group %+v, keys %v", bt.GetId(), g, bt.GetResourceKeys())
	}
	g, err := c.GetGroup(ctx, x.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !g.GetHolding() || !g.GetHoldsHere() || g.GetOwnerKey() != "" || !slices.Contains(g.GetResourceKeys(), key.String()) ||
		len(g.GetMembers()) != 2 || g.GetMembers()[1].GetId() != body.BroadcastID || g.GetEndingId() != 0 || len(g.GetVchannels()) != 3 {
		t.Fatalf("GetGroup: %+v", g)
	}
	bt0, err := c.GetTask(ctx, x.ID)
	if err != nil || !bt0.GetHoldsKeys() || bt0.GetStage() != "holding" {
		t.Fatalf("the Begin's task: holds keys %v, stage %q (%v)", bt0.GetHoldsKeys(), bt0.GetStage(), err)
	}
	gs, err := c.ListGroups(ctx)
	if err != nil || len(gs) != 1 || gs[0].GetId() != x.ID {
		t.Fatalf("ListGroups: %v, %v", gs, err)
	}
	commit := &client.TxnMemberRequest{Type: app.GenericType, Payload: []byte("commit"), Scope: client.CollectionScope(1), ClientKey: "import-7-commit"}
	cr, err := c.CommitTxn(ctx, x.ID, commit)
	if err != nil || cr.Outcome.GetStatus() != walcastv1.OutcomeStatus_OUTCOME_STATUS_SUCCEEDED {
		t.Fatalf("CommitTxn: %+v, %v", cr, err)
	}
	if err := <-queued; err != nil {
		t.Fatalf("the broadcast queued behind the transaction: %v", err)
	}
	if _, err := c.GetGroup(ctx, x.ID); !errors.Is(err, client.ErrFailedPrecondition) {
		t.Fatalf("GetGroup after the commit: %v, want failed precondition", err)
	}
	bt0, err = c.GetTask(ctx, x.ID)
	if err != nil || bt0.GetHoldsKeys() || bt0.GetReleasedBy() != cr.BroadcastID {
		t.Fatalf("the Begin after the commit: holds %v, released by %d, want %d (%v)", bt0.GetHoldsKeys(), bt0.GetReleasedBy(), cr.BroadcastID, err)
	}
	// A retried Commit (same key) gets the Commit's result; a Rollback
	// after it, or a Commit without the key, is refused.
	cr2, err := c.CommitTxn(ctx, x.ID, commit)
	if err != nil || !cr2.Duplicated || cr2.BroadcastID != cr.BroadcastID {
		t.Fatalf("retried CommitTxn: %+v, %v; want a duplicate of %d", cr2, err, cr.BroadcastID)
	}
	if _, err := c.RollbackTxn(ctx, x.ID, &client.TxnMemberRequest{Type: app.GenericType}); !errors.Is(err, client.ErrFailedPrecondition) {
		t.Fatalf("RollbackTxn after the commit: %v, want failed precondition", err)
	}
	if _, err := c.TxnBody(ctx, x.ID, &client.TxnMemberRequest{Type: app.GenericType}); !errors.Is(err, client.ErrFailedPrecondition) {
		t.Fatalf("TxnBody after the commit: %v, want failed precondition", err)
	}
	if b2, err := c.TxnBody(ctx, x.ID, bodyReq); err != nil || !b2.Duplicated || b2.BroadcastID != body.BroadcastID {
		t.Fatalf("a retried keyed body after the commit: %+v, %v; want a duplicate of %d", b2, err, body.BroadcastID)
	}
	// Another end's key does not answer for this transaction.
	other, err := c.Broadcast(ctx, &client.BroadcastRequest{Type: app.GenericType, VChannels: []message.VChannel{"wal-1/x"},
		Scope: client.CollectionScope(1), ClientKey: "not-an-end"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CommitTxn(ctx, x.ID, &client.TxnMemberRequest{Type: app.GenericType, Scope: client.CollectionScope(1),
		ClientKey: "not-an-end"}); !errors.Is(err, client.ErrKeyReused) {
		t.Fatalf("CommitTxn with the key of broadcast %d: %v, want key reused", other.BroadcastID, err)
	}
	if gs, err := c.ListGroups(ctx); err != nil || len(gs) != 0 {
		t.Fatalf("ListGroups after the commit: %v, %v", gs, err)
	}
}

// TestR13_4_TxnBadInputAndLimits: malformed transaction requests and ones
// beyond the broadcast.txn limits get typed errors and change nothing: a
// member kind that is not body/commit/rollback, no or an unknown
// transaction id, too many targets, a member payload too large, a body
// beyond max_members (TXN_FULL, ErrTxnFull) while the end still fits.
func TestR13_4_TxnBadInputAndLimits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := standaloneWith(t, ctx, "east", func(c *server.Config) {
		c.Broadcast.Txn.MaxMembers = 3
		c.Broadcast.Txn.MaxMemberBytes = 100
		c.Broadcast.Txn.MaxVChannels = 3
	})
	c := newClient(t, p)
	raw := rawClient(p)
	gt := app.GenericType.String()
	x, err := c.BeginTxn(ctx, &client.BeginTxnRequest{Type: app.GenericType, VChannels: []message.VChannel{"wal-1/a"},
		ResourceKeys: []resource.Key{resource.ExclusiveCollection("db", "a")}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		call func() error
		code connect.Code
		word string
	}{
		{"begin kind", func() error {
			_, err := raw.TxnMember(ctx, connect.NewRequest(&walcastv1.TxnMemberRequest{TxnId: x.ID, Kind: walcastv1.GroupKind_GROUP_KIND_BEGIN, Type: gt}))
			return err
		}, connect.CodeInvalidArgument, "BeginTxn opens"},
		{"no kind", func() error {
			_, err := raw.TxnMember(ctx, connect.NewRequest(&walcastv1.TxnMemberRequest{TxnId: x.ID, Type: gt}))
			return err
		}, connect.CodeInvalidArgument, "GROUP_KIND_BODY"},
		{"no txn id", func() error {
			_, err := raw.TxnMember(ctx, connect.NewRequest(&walcastv1.TxnMemberRequest{Kind: walcastv1.GroupKind_GROUP_KIND_BODY, Type: gt}))
			return err
		}, connect.CodeInvalidArgument, "txn_id"},
		{"unknown txn", func() error {
			_, err := raw.TxnMember(ctx, connect.NewRequest(&walcastv1.TxnMemberRequest{TxnId: 9999, Kind: walcastv1.GroupKind_GROUP_KIND_BODY, Type: gt}))
			return err
		}, connect.CodeNotFound, ""},
		{"bad type", func() error {
			_, err := raw.TxnMember(ctx, connect.NewRequest(&walcastv1.TxnMemberRequest{TxnId: x.ID, Kind: walcastv1.GroupKind_GROUP_KIND_BODY, Type: "nope"}))
			return err
		}, connect.CodeInvalidArgument, "type"},
		{"member too large", func() error {
			_, err := raw.TxnMember(ctx, connect.NewRequest(&walcastv1.TxnMemberRequest{TxnId: x.ID, Kind: walcastv1.GroupKind_GROUP_KIND_BODY, Type: gt,
				Payload: make([]byte, 101)}))
			return err
		}, connect.CodeInvalidArgument, "at most 100 bytes"},
		{"too many targets", func() error {
			_, err := raw.BeginTxn(ctx, connect.NewRequest(&walcastv1.BeginTxnRequest{Type: gt, Vchannels: []string{"wal-1/b", "wal-2/b", "wal-3/b"}}))
			return err
		}, connect.CodeInvalidArgument, "at most 3 vchannels"},
		{"begin without targets", func() error {
			_, err := raw.BeginTxn(ctx, connect.NewRequest(&walcastv1.BeginTxnRequest{Type: gt}))
			return err
		}, connect.CodeInvalidArgument, "target"},
		{"bad key", func() error {
			_, err := raw.BeginTxn(ctx, connect.NewRequest(&walcastv1.BeginTxnRequest{Type: gt, Vchannels: []string{"wal-1/b"}, ResourceKeys: []string{"nope"}}))
			return err
		}, connect.CodeInvalidArgument, "resource_keys[0]"},
		{"get group 0", func() error {
			_, err := raw.GetGroup(ctx, connect.NewRequest(&walcastv1.GetGroupRequest{}))
			return err
		}, connect.CodeInvalidArgument, "id"},
		{"get unknown group", func() error {
			_, err := raw.GetGroup(ctx, connect.NewRequest(&walcastv1.GetGroupRequest{Id: 9999}))
			return err
		}, connect.CodeNotFound, ""},
	} {
		err := tc.call()
		if connect.CodeOf(err) != tc.code || !strings.Contains(fmt.Sprint(err), tc.word) {
			t.Errorf("%s: %v, want %v saying %q", tc.name, err, tc.code, tc.word)
		}
	}
	if gs, err := c.ListGroups(ctx); err != nil || len(gs) != 1 {
		t.Fatalf("groups after bad input: %v, %v; want the one transaction", gs, err)
	}
	// max_members 3: Begin, one body, and the end.
	if _, err := c.TxnBody(ctx, x.ID, &client.TxnMemberRequest{Type: app.GenericType}); err != nil {
		t.Fatal(err)
	}
	_, err = c.TxnBody(ctx, x.ID, &client.TxnMemberRequest{Type: app.GenericType})
	code, reason, _ := errorInfo(t, err)
	if !errors.Is(err, client.ErrTxnFull) || errors.Is(err, client.ErrInvalidArgument) || code != connect.CodeResourceExhausted || reason != server.ReasonTxnFull {
		t.Fatalf("a body beyond max_members: %v (%v %q), want ErrTxnFull", err, code, reason)
	}
	if _, err := c.CommitTxn(ctx, x.ID, &client.TxnMemberRequest{Type: app.GenericType}); err != nil {
		t.Fatalf("the end of a full transaction: %v", err)
	}
}

// followEast makes west a secondary of east.
func followEast(t *testing.T, ctx context.Context, east, west *server.Process) {
	t.Helper()
	topo := &walcastv1.Topology{Primary: "east", Secondaries: []*walcastv1.SecondaryCluster{{Name: "west", Source: east.NATSURL()}}}
	if _, err := replClient(west).Follow(ctx, connect.NewRequest(&walcastv1.FollowRequest{Topology: topo})); err != nil {
		t.Fatal(err)
	}
}

// TestR13_14_SkipTypesNotReplicated: a secondary with replication.skip_types
// never receives broadcasts of those types, and receives the others: a
// skipped broadcast followed, on the same pchannels, by one of another type
// that reached the secondary was read by its replicator and dropped.
// Broadcasts the primary marks unreplicable (R13.13, the API's
// unreplicable flag) are dropped the same way.
func TestR13_14_SkipTypesNotReplicated(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	east := standaloneWith(t, ctx, "east", nil)
	west := standaloneWith(t, ctx, "west", func(c *server.Config) { c.Replication.SkipTypes = []string{app.GenericSyncType.String()} })
	followEast(t, ctx, east, west)
	ec, wc := newClient(t, east), newClient(t, west)
	send := func(typ message.Type, key string, local bool) uint64 {
		t.Helper()
		r, err := ec.Broadcast(ctx, &client.BroadcastRequest{Type: typ, Payload: []byte(key), VChannels: []message.VChannel{"wal-1/c1v0"},
			Scope: client.ClusterScope(), ClientKey: key, Unreplicable: local})
		if err != nil {
			t.Fatal(err)
		}
		return r.BroadcastID
	}
	skipped := send(app.GenericSyncType, "skipped", false)
	local := send(app.GenericType, "local", true)
	kept := send(app.GenericType, "kept", false)
	waitUntil(t, "west to apply the broadcast of a type it replicates", func() bool {
		r, err := wc.LookupKey(ctx, app.GenericType, message.ClusterKey("kept"))
		return err == nil && r.GetState() == "TOMBSTONE" && r.GetBroadcastId() == kept
	})
	for name, c := range map[string]struct {
		typ message.Type
		id  uint64
	}{"skipped": {app.GenericSyncType, skipped}, "local": {app.GenericType, local}} {
		if _, err := wc.LookupKey(ctx, c.typ, message.ClusterKey(name)); !errors.Is(err, client.ErrNotFound) {
			t.Errorf("the %s broadcast's key on west: %v, want not found", name, err)
		}
		if _, err := wc.GetTask(ctx, c.id); !errors.Is(err, client.ErrNotFound) {
			t.Errorf("the %s broadcast %d on west: %v, want not found", name, c.id, err)
		}
	}
	// On the secondary a local-only broadcast is accepted, another refused.
	if _, err := wc.Broadcast(ctx, &client.BroadcastRequest{Type: app.GenericType, VChannels: []message.VChannel{"wal-1/w"}}); !errors.Is(err, client.ErrNotPrimary) {
		t.Fatalf("a broadcast on the secondary: %v, want not primary", err)
	}
	r, err := wc.Broadcast(ctx, &client.BroadcastRequest{Type: app.GenericType, VChannels: []message.VChannel{"wal-1/w"}, Unreplicable: true})
	if err != nil || r.Outcome.GetStatus() != walcastv1.OutcomeStatus_OUTCOME_STATUS_SUCCEEDED {
		t.Fatalf("a local-only broadcast on the secondary: %+v, %v", r, err)
	}
}

// TestR13_14_SkipTypesValidated: replication.skip_types must name types,
// each once; a bad one is refused naming the setting.
func TestR13_14_SkipTypesValidated(t *testing.T) {
	for _, bad := range [][]string{{"Generic"}, {"Generic.v1", "Generic.v1"}, {""}} {
		cfg := server.Default()
		cfg.Replication.SkipTypes = bad
		if err := cfg.Validate(); !errors.Is(err, server.ErrConfig) || !strings.Contains(err.Error(), "replication.skip_types") {
			t.Errorf("skip_types %q: %v, want a config error naming replication.skip_types", bad, err)
		}
	}
	cfg := server.Default()
	cfg.Replication.SkipTypes = []string{"Generic.v1", "Import.v2"}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("valid skip_types: %v", err)
	}
}

// TestR13_2_TxnSurvivesRestartThroughTheAPI: a transaction begun through
// the API stays open across a restart of its standalone (the same data
// directory) and is continued by id by a new client: its keys are still
// held (a no_wait broadcast on them is busy), a body and the commit go
// through, and the commit releases them.
func TestR13_2_TxnSurvivesRestartThroughTheAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	p := standaloneWith(t, ctx, "east", func(c *server.Config) { c.DataDir = dir })
	c := newClient(t, p)
	key := resource.ExclusiveCollection("db", "c1")
	x, err := c.BeginTxn(ctx, &client.BeginTxnRequest{Type: app.GenericType, Payload: []byte("begin"),
		VChannels: []message.VChannel{"wal-1/c1v0"}, ResourceKeys: []resource.Key{key}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = standaloneWith(t, ctx, "east", func(c *server.Config) { c.DataDir = dir })
	c = newClient(t, p)
	busy := &client.BroadcastRequest{Type: app.GenericType, VChannels: []message.VChannel{"wal-1/c1v0"}, ResourceKeys: []resource.Key{key}, NoWait: true}
	if _, err := c.Broadcast(ctx, busy); !errors.Is(err, client.ErrBusy) {
		t.Fatalf("no_wait on the transaction's key after the restart: %v, want busy", err)
	}
	g, err := c.GetGroup(ctx, x.ID)
	if err != nil || !g.GetHolding() || !g.GetHoldsHere() {
		t.Fatalf("the transaction after the restart: %+v, %v", g, err)
	}
	if _, err := c.TxnBody(ctx, x.ID, &client.TxnMemberRequest{Type: app.GenericType, Payload: []byte("after the restart")}); err != nil {
		t.Fatalf("body after the restart: %v", err)
	}
	if _, err := c.CommitTxn(ctx, x.ID, &client.TxnMemberRequest{Type: app.GenericType}); err != nil {
		t.Fatalf("commit after the restart: %v", err)
	}
	if _, err := c.Broadcast(ctx, busy); err != nil {
		t.Fatalf("no_wait after the commit: %v", err)
	}
}

// TestR13_5_OpenTxnAfterForcePromoteThroughTheAPI: a transaction open on
// the primary is open on its secondary too (its Begin replicated); after
// the primary is lost and the secondary force-promoted, the promoted
// cluster holds the transaction's keys (a no_wait broadcast on them is
// busy) and ends it by id through the API, which releases them.
func TestR13_5_OpenTxnAfterForcePromoteThroughTheAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	east := standaloneWith(t, ctx, "east", nil)
	west := standaloneWith(t, ctx, "west", nil)
	followEast(t, ctx, east, west)
	ec, wc := newClient(t, east), newClient(t, west, client.WithMaxAttempts(3))
	key := resource.ExclusiveCollection("db", "c1")
	x, err := ec.BeginTxn(ctx, &client.BeginTxnRequest{Type: app.GenericType, Payload: []byte("begin"),
		VChannels: []message.VChannel{"wal-1/c1v0"}, ResourceKeys: []resource.Key{key}})
	if err != nil {
		t.Fatal(err)
	}
	body, err := ec.TxnBody(ctx, x.ID, &client.TxnMemberRequest{Type: app.GenericType, Payload: []byte("step")})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "west to know the open transaction with its body", func() bool {
		g, err := wc.GetGroup(ctx, x.ID)
		return err == nil && g.GetHolding() && len(g.GetMembers()) == 2 && g.GetMembers()[1].GetId() == body.BroadcastID &&
			g.GetMembers()[1].GetStage() == "tombstoned"
	})
	if g, _ := wc.GetGroup(ctx, x.ID); g.GetHoldsHere() {
		t.Fatalf("the secondary holds the transaction's keys before a promote: %+v", g)
	}
	if err := east.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := replClient(west).ForcePromote(ctx, connect.NewRequest(&walcastv1.ForcePromoteRequest{})); err != nil {
		t.Fatal(err)
	}
	busy := &client.BroadcastRequest{Type: app.GenericType, VChannels: []message.VChannel{"wal-1/c1v0"}, ResourceKeys: []resource.Key{key}, NoWait: true}
	waitUntil(t, "the promoted cluster to hold the open transaction's keys", func() bool {
		g, err := wc.GetGroup(ctx, x.ID)
		return err == nil && g.GetHoldsHere()
	})
	if _, err := wc.Broadcast(ctx, busy); !errors.Is(err, client.ErrBusy) {
		t.Fatalf("no_wait on the open transaction's key after the promote: %v, want busy", err)
	}
	if _, err := wc.RollbackTxn(ctx, x.ID, &client.TxnMemberRequest{Type: app.GenericType, Payload: []byte("failover")}); err != nil {
		t.Fatalf("rollback on the promoted cluster: %v", err)
	}
	if _, err := wc.Broadcast(ctx, busy); err != nil {
		t.Fatalf("no_wait after the rollback: %v", err)
	}
}
