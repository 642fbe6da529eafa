package broadcast_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// Groups, owners, per-channel roles, unreplicable broadcasts and
// try-acquire through the driver (docs/spec.md §13). The rules themselves
// are simulated on the core (broadcast/internal/sim); these check the face: the
// library API, its errors, and that the driver carries everything through
// restarts.

var (
	typImport   = message.Type{Name: "Import", Version: 1}
	typCommitIm = message.Type{Name: "CommitImport", Version: 1}
	typRollIm   = message.Type{Name: "RollbackImport", Version: 1}
	typLocal    = message.Type{Name: "AlterResourceGroup", Version: 1}
)

// withGroupTypes registers the owner types (an Import acquires
// "import/<payload>", CommitImport and RollbackImport end it) and a local
// type, with the recording callback.
func withGroupTypes(t *testing.T, e *env) {
	t.Helper()
	key := func(p []byte) (string, error) {
		if len(p) == 0 {
			return "", errors.New("empty job")
		}
		return "import/" + string(p), nil
	}
	e.types.MustRegister(message.TypeInfo{Type: typImport, Owner: &message.OwnerRole{Key: key}})
	e.types.MustRegister(message.TypeInfo{Type: typCommitIm, Owner: &message.OwnerRole{Key: key, Ends: message.GroupCommit}})
	e.types.MustRegister(message.TypeInfo{Type: typRollIm, Owner: &message.OwnerRole{Key: key, Ends: message.GroupRollback}})
	e.types.MustRegister(message.TypeInfo{Type: typLocal, Unreplicable: true})
	cb := func(ctx context.Context, ev *broadcast.TypedEvent[[]byte]) error { return e.callback(ctx, ev.Event) }
	for _, typ := range []message.Type{typImport, typCommitIm, typRollIm, typLocal} {
		if err := broadcast.OnAck(e.cbs, typ, broadcast.Raw(), cb); err != nil {
			t.Fatal(err)
		}
	}
}

// busyHolder returns who TryWithResourceKeys says holds k, "" if nobody.
func busyHolder(t *testing.T, b *broadcast.Broadcaster, k resource.Key) string {
	t.Helper()
	h, err := b.TryWithResourceKeys(ctxT(t, 5*time.Second), k)
	if err == nil {
		h.Close()
		return ""
	}
	if !errors.Is(err, broadcast.ErrBusy) {
		t.Fatalf("try-acquire of %s: %v", k, err)
	}
	return err.Error()
}

// TestR13_1_TransactionHoldsItsKeysAcrossMembers: a transaction's keys are
// held from its Begin to its end, across members sent as separate calls;
// members carry the Begin's keys and targets; the callbacks take effect in
// order; the end releases the keys.
func TestR13_1_TransactionHoldsItsKeysAcrossMembers(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	targets := []message.VChannel{vch(1, "c"), vch(2, "c")}
	key := resource.ExclusiveCollection("db", "c")
	x, err := b.BeginTxn(ctx, broadcast.TxnRequest{Keys: []resource.Key{key}}, msgOf(t, typCreate, "begin", targets))
	if err != nil {
		t.Fatal(err)
	}
	if h := busyHolder(t, b, key); !strings.Contains(h, "transaction") {
		t.Fatalf("after the Begin, the key is held by %q, want the transaction", h)
	}
	// A conflicting DDL queues behind the transaction.
	drop := make(chan error, 1)
	go func() {
		_, err := do(ctx, b, msgOf(t, typDrop, "drop", targets[:1]), key)
		drop <- err
	}()
	waitFor(t, "the drop to queue", func() bool {
		for _, ks := range b.Locks() {
			if len(ks.Waiters) > 0 {
				return true
			}
		}
		return false
	})
	body := &message.Message{Type: typCreate, Payload: []byte("body")}
	r1, err := x.Body(ctx, body)
	if err != nil {
		t.Fatal(err)
	}
	if got := r1.Appends; len(got) != len(targets)+1 {
		t.Fatalf("body landed on %v, want the Begin's %d targets and the control channel", got, len(targets))
	}
	if _, err := x.Body(ctx, msgOf(t, typCreate, "elsewhere", []message.VChannel{vch(3, "z")})); !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("a body to other targets: %v, want ErrInvalidArgument", err)
	}
	select {
	case err := <-drop:
		t.Fatalf("the drop ran inside the transaction: %v", err)
	default:
	}
	end, err := x.Commit(ctx, &message.Message{Type: typCreate, Payload: []byte("commit")})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-drop; err != nil {
		t.Fatal(err)
	}
	calls := e.callsCopy()
	order := []uint64{x.ID, r1.BroadcastID, end.BroadcastID}
	for i, id := range order {
		if i >= len(calls) || calls[i].id != id {
			t.Fatalf("callbacks ran %v, want the members %v first, in order", calls, order)
		}
		if !slicesEqualKeys(calls[i].keys, calls[0].keys) {
			t.Fatalf("member %d carried keys %v, the Begin %v", id, calls[i].keys, calls[0].keys)
		}
	}
	conflictOrder(t, calls)
	e.checkInvariants(b, nil)
}

func slicesEqualKeys(a, b []resource.Key) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestR13_2_RetriedBeginAndRestarts: a retried Begin with the transaction's
// key returns the open transaction without waiting for its keys; the open
// transaction survives a restart, holding its keys, and is resumed by id;
// resumed after its end it answers a retried end only.
func TestR13_2_RetriedBeginAndRestarts(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	targets := []message.VChannel{vch(1, "c")}
	key := resource.ExclusiveCollection("db", "c")
	k := message.ClusterKey("import-42")
	req := broadcast.TxnRequest{Keys: []resource.Key{key}, Idempotent: &broadcast.Idempotent{Type: typCreate, Key: k}}
	x, err := b.BeginTxn(ctx, req, msgOf(t, typCreate, "begin", targets, message.WithIdempotencyKey(k)))
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.BeginTxn(ctx, req, msgOf(t, typCreate, "begin", targets, message.WithIdempotencyKey(k)))
	if err != nil || again.ID != x.ID || !again.Duplicate {
		t.Fatalf("retried Begin: %+v, %v; want transaction %d as a duplicate", again, err, x.ID)
	}
	if _, err := x.Body(ctx, &message.Message{Type: typCreate, Payload: []byte("b1")}); err != nil {
		t.Fatal(err)
	}
	_ = b.Close()

	b = e.open()
	if h := busyHolder(t, b, key); !strings.Contains(h, "transaction") {
		t.Fatalf("after a restart the key is held by %q, want the transaction", h)
	}
	y, err := b.ResumeTxn(x.ID)
	if err != nil {
		t.Fatal(err)
	}
	g, err := b.Group(x.ID)
	if err != nil || len(g.Members) != 2 || !g.HoldsHere {
		t.Fatalf("recovered group %+v, %v: want the Begin and one body, holding", g, err)
	}
	rb, err := y.Rollback(ctx, &message.Message{Type: typCreate, Payload: []byte("rollback")})
	if err != nil {
		t.Fatal(err)
	}
	// Resumed after its end, also after a restart, the transaction answers
	// a retried rollback (unkeyed) with the first and refuses the rest.
	for round := range 2 {
		z, err := b.ResumeTxn(x.ID)
		if err != nil || !z.Ended {
			t.Fatalf("round %d: resume after the end: %+v %v, want the ended transaction", round, z, err)
		}
		again, err := z.Rollback(ctx, &message.Message{Type: typCreate, Payload: []byte("rollback")})
		if err != nil || again.BroadcastID != rb.BroadcastID || again.Duplicated == nil {
			t.Fatalf("round %d: a retried rollback: %+v %v, want rollback %d as a duplicate", round, again, err, rb.BroadcastID)
		}
		if _, err := z.Commit(ctx, &message.Message{Type: typCreate, Payload: []byte("commit")}); !errors.Is(err, broadcast.ErrFailedPrecondition) {
			t.Fatalf("round %d: a commit after the rollback: %v", round, err)
		}
		if _, err := z.Body(ctx, &message.Message{Type: typCreate, Payload: []byte("b2")}); !errors.Is(err, broadcast.ErrFailedPrecondition) {
			t.Fatalf("round %d: a body after the rollback: %v", round, err)
		}
		_ = b.Close()
		b = e.open()
	}
	if _, err := b.ResumeTxn(plainBroadcast(t, b)); !errors.Is(err, broadcast.ErrFailedPrecondition) {
		t.Fatalf("resume of a plain broadcast: %v, want ErrFailedPrecondition", err)
	}
	if _, err := b.ResumeTxn(1 << 40); !errors.Is(err, broadcast.ErrNotFound) {
		t.Fatalf("resume of an unknown id: %v, want ErrNotFound", err)
	}
	e.checkInvariants(b, nil)
}

// plainBroadcast runs a broadcast of no group and returns its id.
func plainBroadcast(t *testing.T, b *broadcast.Broadcaster) uint64 {
	t.Helper()
	r, err := do(ctxT(t, 10*time.Second), b, msgOf(t, typCreate, "plain", []message.VChannel{vch(2, "d")}), resource.ExclusiveCollection("db", "d"))
	if err != nil {
		t.Fatal(err)
	}
	return r.BroadcastID
}

// TestR13_3_FirstEndWins: concurrent Commits join the first; a Rollback
// after it is refused; a Commit once it ended gets its result.
func TestR13_3_FirstEndWins(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	targets := []message.VChannel{vch(1, "c")}
	x, err := b.BeginTxn(ctx, broadcast.TxnRequest{Keys: []resource.Key{resource.ExclusiveCollection("db", "c")}}, msgOf(t, typCreate, "begin", targets))
	if err != nil {
		t.Fatal(err)
	}
	// Hold the first Commit's callback so that the second comes while it runs.
	blk := make(chan struct{})
	e.mu.Lock()
	e.block[x.ID+1] = blk
	e.mu.Unlock()
	var wg sync.WaitGroup
	res := make([]*broadcast.Result, 2)
	errs := make([]error, 2)
	wg.Add(1)
	go func() {
		defer wg.Done()
		res[0], errs[0] = x.Commit(ctx, &message.Message{Type: typCreate, Payload: []byte("commit")})
	}()
	waitFor(t, "the first commit to run", func() bool {
		g, err := b.Group(x.ID)
		return err == nil && g.Ending != 0
	})
	if _, err := x.Rollback(ctx, &message.Message{Type: typCreate, Payload: []byte("rollback")}); !errors.Is(err, broadcast.ErrFailedPrecondition) {
		t.Fatalf("rollback while committing: %v, want ErrFailedPrecondition", err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		res[1], errs[1] = x.Commit(ctx, &message.Message{Type: typCreate, Payload: []byte("commit")})
	}()
	close(blk)
	wg.Wait()
	if errs[0] != nil || errs[1] != nil || res[0].BroadcastID != res[1].BroadcastID {
		t.Fatalf("concurrent commits: %v %v, ids %v", errs, res, res)
	}
	late, err := x.Commit(ctx, &message.Message{Type: typCreate, Payload: []byte("commit")})
	if err != nil || late.BroadcastID != res[0].BroadcastID {
		t.Fatalf("commit after the end: %+v, %v; want broadcast %d's result", late, err, res[0].BroadcastID)
	}
	if _, err := x.Body(ctx, &message.Message{Type: typCreate, Payload: []byte("late")}); !errors.Is(err, broadcast.ErrFailedPrecondition) {
		t.Fatalf("body after the end: %v, want ErrFailedPrecondition", err)
	}
	e.checkInvariants(b, nil)
}

// TestR13_4_TransactionLimits: too many members, too large a member or
// too many targets are refused with typed errors, changing nothing.
func TestR13_4_TransactionLimits(t *testing.T) {
	e := newEnv(t)
	b := e.open(func(c *broadcast.Config) {
		c.Txn = broadcast.TxnLimits{MaxMembers: 3, MaxMemberBytes: 8, MaxVChannels: 3}
	})
	ctx := ctxT(t, 10*time.Second)
	if _, err := b.BeginTxn(ctx, broadcast.TxnRequest{}, msgOf(t, typCreate, "b", []message.VChannel{vch(1, "a"), vch(2, "a"), vch(3, "a")})); !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("too many targets: %v", err)
	}
	x, err := b.BeginTxn(ctx, broadcast.TxnRequest{Keys: []resource.Key{resource.ExclusiveCollection("db", "c")}}, msgOf(t, typCreate, "b", []message.VChannel{vch(1, "a")}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.Body(ctx, &message.Message{Type: typCreate, Payload: []byte("far too large")}); !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("member too large: %v", err)
	}
	if _, err := x.Body(ctx, &message.Message{Type: typCreate, Payload: []byte("b1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Body(ctx, &message.Message{Type: typCreate, Payload: []byte("b2")}); !errors.Is(err, broadcast.ErrTxnFull) {
		t.Fatalf("a member past the limit: %v, want ErrTxnFull", err)
	}
	if _, err := x.Commit(ctx, &message.Message{Type: typCreate, Payload: []byte("c")}); err != nil {
		t.Fatalf("the slot kept for the end: %v", err)
	}
	e.checkInvariants(b, nil)
}

// TestR13_7_OwnerKeepsItsKeysUntilItsEnd: an Import keeps its keys past its
// callback and across a restart; a DropCollection waits for them; the
// CommitImport is stamped with them without locking (the Drop is already
// queued) and releases them; then the Drop runs. A retried commit, also
// after a restart, is answered by the first; a rollback then is refused.
func TestR13_7_OwnerKeepsItsKeysUntilItsEnd(t *testing.T) {
	e := newEnv(t)
	withGroupTypes(t, e)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	targets := []message.VChannel{vch(1, "c")}
	coll := resource.SharedCollection("db", "c")
	imp, err := do(ctx, b, msgOf(t, typImport, "7", targets), coll)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := do(ctx, b, msgOf(t, typImport, "7", targets), coll); !errors.Is(err, broadcast.ErrFailedPrecondition) {
		t.Fatalf("a second owner of import/7: %v, want ErrFailedPrecondition", err)
	}
	_ = b.Close()
	b = e.open()
	if h := busyHolder(t, b, resource.ExclusiveCollection("db", "c")); !strings.Contains(h, "import/7") {
		t.Fatalf("after a restart the collection is held by %q, want the import's ownership", h)
	}
	drop := make(chan error, 1)
	go func() {
		_, err := do(ctx, b, msgOf(t, typDrop, "drop", targets), resource.ExclusiveCollection("db", "c"))
		drop <- err
	}()
	waitFor(t, "the drop to queue", func() bool {
		for _, ks := range b.Locks() {
			if len(ks.Waiters) > 0 {
				return true
			}
		}
		return false
	})
	if _, err := b.EndOwnership(ctx, msgOf(t, typCommitIm, "8", targets)); !errors.Is(err, broadcast.ErrNotFound) {
		t.Fatalf("ending an ownership nobody has: %v, want ErrNotFound", err)
	}
	end, err := b.EndOwnership(ctx, msgOf(t, typCommitIm, "7", targets))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-drop; err != nil {
		t.Fatal(err)
	}
	calls := e.callsCopy()
	if len(calls) != 3 || calls[0].id != imp.BroadcastID || calls[1].id != end.BroadcastID {
		t.Fatalf("callbacks %v: want the import, its commit, then the drop", calls)
	}
	if !slicesEqualKeys(calls[1].keys, calls[0].keys) {
		t.Fatalf("the commit carried %v, the import %v", calls[1].keys, calls[0].keys)
	}
	// The ownership has ended: a retried commit, also after a restart, is
	// answered by the first; a rollback is refused; nothing runs again.
	for round := range 2 {
		again, err := b.EndOwnership(ctx, msgOf(t, typCommitIm, "7", targets))
		if err != nil || again.BroadcastID != end.BroadcastID || again.Duplicated == nil {
			t.Fatalf("round %d: a retried commit: %+v %v, want the first commit %d as a duplicate", round, again, err, end.BroadcastID)
		}
		if _, err := b.EndOwnership(ctx, msgOf(t, typRollIm, "7", targets)); !errors.Is(err, broadcast.ErrFailedPrecondition) {
			t.Fatalf("round %d: a rollback after the commit: %v, want ErrFailedPrecondition", round, err)
		}
		_ = b.Close()
		b = e.open()
	}
	if n := len(e.callsCopy()); n != 3 {
		t.Fatalf("%d callbacks after the retried ends, want still 3", n)
	}
	e.checkInvariants(b, nil)
}

// TestR13_11_TwoPhaseAppend: the first-phase copy is appended alone; the
// rest wait until its consumer acked it (WaitVChannelsAcked returns then);
// the consumer's extra reaches the caller and stays in the tombstone across
// a restart (R13.12); per-target roles and payloads travel with the
// message (R13.10). A crash between the phases is simulated on the core
// (broadcast/internal/sim).
func TestR13_11_TwoPhaseAppend(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	src, dst := vch(1, "c_0"), vch(2, "c_1")
	m := msgOf(t, typCreate, "split", []message.VChannel{src, dst},
		message.WithCopy(src, "fence", nil), message.WithCopy(dst, "genesis", []byte("shard-1")), message.WithAppendFirst(src))
	done := make(chan *broadcast.Result, 1)
	go func() {
		r, err := do(ctx, b, m, resource.ExclusiveCollection("db", "c"))
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	var id uint64
	waitFor(t, "the first phase", func() bool {
		for bid, vs := range e.copies() {
			if vs[src] > 0 {
				id = bid
				return true
			}
		}
		return false
	})
	waited := make(chan error, 1)
	go func() { waited <- b.WaitVChannelsAcked(ctx, id, src) }()
	if err := b.WaitVChannelsAcked(ctx, id, vch(3, "x")); !errors.Is(err, broadcast.ErrVChannelNotInTask) {
		t.Fatalf("waiting for a vchannel not targeted: %v", err)
	}
	if got := e.copies()[id]; got[dst] != 0 || got[cchan] != 0 {
		t.Fatalf("second-phase copies appended before the first was acked: %v", got)
	}
	select {
	case err := <-waited:
		t.Fatalf("WaitVChannelsAcked returned before the ack: %v", err)
	default:
	}
	cp := wal.Checkpoint{MessageID: 1, TimeTick: 1, LastConfirmed: 1}
	// An extra beyond the bound is refused and changes nothing: the copy
	// stays unacked and the first phase goes on waiting.
	big := make([]byte, broadcast.MaxAckExtraBytes+1)
	if err := b.Ack(ctx, broadcast.Ack{BroadcastID: id, VChannel: src, Checkpoint: cp, Extra: big}); !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("ack with a %d-byte extra: %v, want invalid argument", len(big), err)
	}
	if ti, _ := b.Task(id); ti.VChannels[0].Acked {
		t.Fatal("a refused ack acked the copy")
	}
	if err := b.Ack(ctx, broadcast.Ack{BroadcastID: id, VChannel: src, Checkpoint: cp, Extra: []byte("fenced at 99")}); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r == nil || string(r.Extras[src]) != "fenced at 99" {
		t.Fatalf("result %+v: want the consumer's extra", r)
	}
	if got := e.copies()[id]; got[src] != 1 || got[dst] != 1 || got[cchan] != 1 {
		t.Fatalf("copies %v, want one each", got)
	}
	_ = b.Close()
	b = e.open()
	ti, err := b.Task(id)
	if err != nil {
		t.Fatal(err)
	}
	if string(ti.Extras[src]) != "fenced at 99" {
		t.Fatalf("the tombstone keeps extras %q, want the consumer's", ti.Extras)
	}
	msg := ti.Message
	if msg.RoleFor(src) != "fence" || string(msg.PayloadFor(dst)) != "shard-1" || string(msg.PayloadFor(src)) != "split" {
		t.Fatalf("per-target copies lost: %+v", msg.Broadcast.Copies)
	}
	if err := b.WaitVChannelsAcked(ctx, id, src, dst); err != nil {
		t.Fatalf("waiting on a finished broadcast: %v", err)
	}
}

// TestR13_13_LocalOnlyBroadcastOnASecondary: a secondary refuses DDL but
// accepts an unreplicable broadcast through WithUnreplicableResourceKeys;
// its message is marked so the replicator skips it.
func TestR13_13_LocalOnlyBroadcastOnASecondary(t *testing.T) {
	e := newEnv(t)
	withGroupTypes(t, e)
	b := e.open()
	e.secondary(b)
	ctx := ctxT(t, 10*time.Second)
	if _, err := b.WithResourceKeys(ctx, resource.ExclusiveCollection("db", "c")); !errors.Is(err, broadcast.ErrNotPrimary) {
		t.Fatalf("DDL on a secondary: %v", err)
	}
	h, err := b.WithUnreplicableResourceKeys(ctx, resource.ExclusivePrivilege())
	if err != nil {
		t.Fatal(err)
	}
	r, err := h.Broadcast(ctx, msgOf(t, typCreate, "rg", []message.VChannel{vch(1, "rg")}))
	if err != nil {
		t.Fatal(err)
	}
	ti, err := b.Task(r.BroadcastID)
	if err != nil {
		t.Fatal(err)
	}
	if !broadcast.Unreplicable(e.types, ti.Message) {
		t.Fatal("a local-only broadcast is not marked unreplicable")
	}
	e.checkInvariants(b, nil)
}
