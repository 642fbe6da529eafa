// Scenarios that need the driver (contexts, Close, real goroutines), each
// named after the requirement of docs/spec.md it checks; those the core
// decides alone run in broadcast/internal/sim/reqgaps_scenario_test.go.

package broadcast_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// TestR13_11_WaitVChannelsAckedEndsWithItsContextAndClose: a wait for a
// copy nobody acks returns its context's error once the context ends
// (#95); a wait in flight when the broadcaster closes, and one after it,
// returns ErrClosed (#97).
func TestR13_11_WaitVChannelsAckedEndsWithItsContextAndClose(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	src, dst := vch(1, "c_0"), vch(2, "c_1")
	m := msgOf(t, typCreate, "split", []message.VChannel{src, dst}, message.WithAppendFirst(src))
	id := firstPhase(t, e, b, ctx, m, src)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := b.WaitVChannelsAcked(short, id, src); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a wait whose context ended: %v, want its context's error", err)
	}
	inFlight := make(chan error, 1)
	go func() { inFlight <- b.WaitVChannelsAcked(ctx, id, src) }()
	_ = b.Close()
	select {
	case err := <-inFlight:
		if !errors.Is(err, broadcast.ErrClosed) {
			t.Fatalf("a wait in flight at Close: %v, want ErrClosed", err)
		}
	case <-ctx.Done():
		t.Fatal("a wait in flight at Close never returned")
	}
	if err := b.WaitVChannelsAcked(ctx, id, src); !errors.Is(err, broadcast.ErrClosed) {
		t.Fatalf("a wait after Close: %v, want ErrClosed", err)
	}
}

// TestR13_11_WaitVChannelsAckedOnARecoveredTask: a two-phase task whose
// coordinator restarted between its phases is waited for on the new one:
// the wait returns once its consumer acks the first copy, and the task
// then completes (#98).
func TestR13_11_WaitVChannelsAckedOnARecoveredTask(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	src, dst := vch(1, "c_0"), vch(2, "c_1")
	m := msgOf(t, typCreate, "split", []message.VChannel{src, dst}, message.WithAppendFirst(src))
	id := firstPhase(t, e, b, ctx, m, src)
	_ = b.Close()
	b = e.open()
	waited := make(chan error, 1)
	go func() { waited <- b.WaitVChannelsAcked(ctx, id, src) }()
	select {
	case err := <-waited:
		t.Fatalf("the wait returned before the ack: %v", err)
	default:
	}
	ti, err := b.Task(id)
	if err != nil || ti.VChannels[0].Acked {
		t.Fatalf("the recovered task: %+v, %v", ti, err)
	}
	if err := b.Ack(ctx, broadcast.Ack{BroadcastID: id, VChannel: src, Checkpoint: ti.VChannels[0].Checkpoint}); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("the wait after the ack: %v", err)
	}
	waitFor(t, "the recovered task to complete", func() bool {
		ti, err := b.Task(id)
		return err == nil && ti.State == broadcast.Tombstone
	})
}

// TestR13_1_BeginWhoseContextEndsWhileItWaitsForKeys: a keyed Begin that
// waits for keys another handle holds gives up when its context ends and
// leaves nothing: once the holder closes, the same Begin with the same key
// opens its transaction at once (#106).
func TestR13_1_BeginWhoseContextEndsWhileItWaitsForKeys(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	key := resource.ExclusiveCollection("db", "c")
	holder, err := b.WithResourceKeys(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	k := message.ClusterKey("txn-106")
	req := broadcast.TxnRequest{Keys: []resource.Key{key}, Idempotent: &broadcast.Idempotent{Type: typCreate, Key: k}}
	begin := func() *message.Message {
		return msgOf(t, typCreate, "begin", []message.VChannel{vch(1, "c")}, message.WithIdempotencyKey(k))
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := b.BeginTxn(short, req, begin()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a Begin whose context ended while it waited: %v, want its context's error", err)
	}
	holder.Close()
	x, err := b.BeginTxn(ctx, req, begin())
	if err != nil || x.Duplicate {
		t.Fatalf("the same Begin again: %+v, %v; want a new transaction", x, err)
	}
	if _, err := x.Rollback(ctx, &message.Message{Type: typCreate, Payload: []byte("rb")}); err != nil {
		t.Fatal(err)
	}
}

// TestR13_1_CloseWithAPendingMember: the broadcaster closes while a
// transaction's member waits behind another whose callback runs: both
// callers return (the waiting member as not created), Close returns, and
// after a restart the transaction is open and resumable (#112).
func TestR13_1_CloseWithAPendingMember(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	x, err := b.BeginTxn(ctx, broadcast.TxnRequest{Keys: []resource.Key{resource.ExclusiveCollection("db", "c")}},
		msgOf(t, typCreate, "begin", []message.VChannel{vch(1, "c")}))
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	e.mu.Lock()
	e.block[x.ID+1] = release // the first body's callback waits
	e.mu.Unlock()
	first, second := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := x.Body(ctx, &message.Message{Type: typCreate, Payload: []byte("b1")})
		first <- err
	}()
	waitFor(t, "the first body's callback", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.attempts[x.ID+1] > 0
	})
	go func() {
		_, err := x.Body(ctx, &message.Message{Type: typCreate, Payload: []byte("b2")})
		second <- err
	}()
	waitFor(t, "the second body to queue", func() bool {
		g, err := b.Group(x.ID)
		return err == nil && g.Queued == 1
	})
	_ = b.Close()
	if err := <-second; !broadcast.IsTaskNotCreated(err) {
		t.Fatalf("the queued member after Close: %v, want not created", err)
	}
	if err := <-first; err == nil {
		t.Fatal("the member whose callback Close cut short reported success")
	}
	close(release)
	b = e.open()
	if _, err := b.ResumeTxn(x.ID); err != nil {
		t.Fatalf("the transaction after a restart: %v", err)
	}
}

// firstPhase starts two-phase broadcast m (first copy on src) and returns
// its id once the first copy is appended.
func firstPhase(t *testing.T, e *env, b *broadcast.Broadcaster, ctx context.Context, m *message.Message, src message.VChannel) uint64 {
	t.Helper()
	go func() { _, _ = do(ctx, b, m, resource.ExclusiveCollection("db", "c")) }()
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
	return id
}

// TestR13_13_RefusedLocalOnlyBroadcastLeavesNoKeys: on a secondary, a
// local-only broadcast the broadcaster refuses (a message that does not
// validate, a target on a pchannel the cluster lacks) creates nothing and
// leaves no key held: the next handle on the same keys gets them at once,
// and closing the refused handle does nothing (#90: walcast marks a
// local-only broadcast instead of rejecting it, and gives its keys back on
// any refusal).
func TestR13_13_RefusedLocalOnlyBroadcastLeavesNoKeys(t *testing.T) {
	e := newEnv(t)
	withGroupTypes(t, e)
	b := e.open(func(c *broadcast.Config) { c.PChannels = pchans })
	e.secondary(b)
	ctx := ctxT(t, 10*time.Second)
	key := resource.ExclusivePrivilege()
	bad := []*message.Message{
		{Type: message.Type{Name: "Unregistered", Version: 1}, Payload: []byte("x"), Broadcast: message.BroadcastHeader{VChannels: []message.VChannel{vch(1, "rg")}}},
		msgOf(t, typCreate, "rg", []message.VChannel{"nowhere-9/rg"}),
	}
	for i, m := range bad {
		h, err := b.WithUnreplicableResourceKeys(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.Broadcast(ctx, m); !errors.Is(err, broadcast.ErrInvalidArgument) {
			t.Fatalf("refusal %d: %v, want invalid argument", i, err)
		}
		h.Close()
		again, err := b.WithUnreplicableResourceKeys(ctx, key)
		if err != nil {
			t.Fatalf("refusal %d: the keys after it: %v", i, err)
		}
		again.Close()
	}
	if ts, err := b.Tasks(broadcast.Filter{}); err != nil || len(ts) != 0 {
		t.Fatalf("refused broadcasts created %+v (%v)", ts, err)
	}
	e.checkInvariants(b, nil)
}
