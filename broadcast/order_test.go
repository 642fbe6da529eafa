package broadcast_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// replicated builds the message of a broadcast replicated from a primary.
func replicated(id uint64, typ message.Type, targets []message.VChannel, keys ...resource.Key) *message.Message {
	keys, _ = resource.WithClusterKey(keys)
	return &message.Message{Type: typ, Payload: []byte(fmt.Sprint("r", id)),
		Broadcast: message.BroadcastHeader{ID: id, VChannels: append(targets, cchan), ResourceKeys: keys},
		Replicate: &message.ReplicateHeader{SourceCluster: "primary", SourcePChannel: "wal-0"}}
}

func ackOf(m *message.Message, v message.VChannel, tick uint64) broadcast.Ack {
	return broadcast.Ack{BroadcastID: m.Broadcast.ID, VChannel: v, Message: m,
		Checkpoint: wal.Checkpoint{MessageID: tick, TimeTick: tick, LastConfirmed: tick}}
}

// TestR5_4_ReplicatedCallbacksInControlChannelOrder: on a secondary,
// conflicting replicated tasks run their callbacks in control-channel order
// even when the later one is fully acked first; a non-conflicting task is not
// held up by the blocked one (R5.4, R8.2).
func TestR5_4_ReplicatedCallbacksInControlChannelOrder(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	e.secondary(b)
	ctx := ctxT(t, 10*time.Second)
	a := replicated(10, typCreate, []message.VChannel{vch(1, "x"), vch(2, "y")}, resource.ExclusiveCollection("db", "c"))
	bb := replicated(11, typDrop, []message.VChannel{vch(1, "x")}, resource.ExclusiveCollection("db", "c"))
	c := replicated(12, typCreate, []message.VChannel{vch(3, "z")}, resource.ExclusiveCollection("db", "other"))
	must := func(ack broadcast.Ack) {
		t.Helper()
		if err := b.Ack(ctx, ack); err != nil {
			t.Fatal(err)
		}
	}
	must(ackOf(a, cchan, 100)) // A enrols first: control channel order
	must(ackOf(a, vch(1, "x"), 101))
	must(ackOf(bb, cchan, 102)) // B enrols second and is fully acked first
	must(ackOf(bb, vch(1, "x"), 103))
	must(ackOf(c, cchan, 104))
	must(ackOf(c, vch(3, "z"), 105))
	waitFor(t, "C's callback", func() bool {
		ti, err := b.Task(12)
		return err == nil && ti.State == broadcast.Tombstone
	})
	if ti, _ := b.Task(11); ti.State == broadcast.Tombstone {
		t.Fatal("B's callback ran before conflicting A's")
	}
	must(ackOf(a, vch(2, "y"), 106)) // A's last copy
	waitFor(t, "all callbacks", func() bool { return b.Stats().Live == 0 })
	calls := e.callsCopy()
	order := map[uint64]int{}
	for i, c := range calls {
		order[c.id] = i
	}
	if order[10] > order[11] {
		t.Fatalf("callback order %v: A must precede B", calls)
	}
	conflictOrder(t, calls)
	if len(b.Locks()) != 0 {
		t.Fatal("replicated tasks took issuance locks")
	}
}

// TestR8_2_ReplicatedAcksSurviveRestart: acks of a replicated task are
// durable before Ack returns, so a restarted secondary does not wait for
// acks it already had.
func TestR8_2_ReplicatedAcksSurviveRestart(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	e.secondary(b)
	ctx := ctxT(t, 10*time.Second)
	m := replicated(20, typCreate, []message.VChannel{vch(1, "x"), vch(2, "y")}, resource.ExclusiveCollection("db", "c"))
	for i, v := range []message.VChannel{cchan, vch(1, "x")} {
		if err := b.Ack(ctx, ackOf(m, v, uint64(200+i))); err != nil {
			t.Fatal(err)
		}
	}
	_ = b.Close()
	b = e.open()
	ti, err := b.Task(20)
	if err != nil || ti.State != broadcast.Replicated || !ti.VChannels[0].Acked || !ti.VChannels[2].Acked || ti.VChannels[1].Acked {
		t.Fatalf("recovered replicated task %+v, %v", ti, err)
	}
	// Without the message (legacy ack) the last copy completes it.
	if err := b.Ack(ctx, broadcast.Ack{BroadcastID: 20, VChannel: vch(2, "y"), Checkpoint: wal.Checkpoint{MessageID: 300, TimeTick: 300}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the callback", func() bool { ti, _ := b.Task(20); return ti.State == broadcast.Tombstone })
	if e.effects()[20] != 1 {
		t.Fatal("effect not applied once")
	}
}

// TestR4_5_UnknownAckWithoutReplicateHeaderIgnored.
func TestR4_5_UnknownAckWithoutReplicateHeaderIgnored(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	m := replicated(30, typCreate, []message.VChannel{vch(1, "x")})
	// A primary ignores replicated copies it does not know (the fence).
	if err := b.Ack(ctxT(t, time.Second), ackOf(m, cchan, 1)); err != nil {
		t.Fatal(err)
	}
	if b.Stats().Live != 0 || e.store.Applied() != 0 {
		t.Fatal("a primary created a task from a replicated ack")
	}
	e.secondary(b)
	applied := e.store.Applied()
	m.Replicate = nil
	if err := b.Ack(ctxT(t, time.Second), ackOf(m, cchan, 1)); err != nil {
		t.Fatal(err)
	}
	if b.Stats().Live != 0 || e.store.Applied() != applied {
		t.Fatal("an unknown, non-replicated ack created a task")
	}
}

// TestRandomFaults drives many concurrent broadcasts with random, partly
// conflicting keys while the catalog and the WAL fail at random (definitely
// or ambiguously), then checks the invariants of SPEC §11 and that
// conflicting callbacks ran in control-channel order.
func TestRandomFaults(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { runRandomFaults(t, seed) })
	}
}

func runRandomFaults(t *testing.T, seed uint64) {
	e := newEnv(t)
	rng := rand.New(rand.NewPCG(seed, 7))
	var rmu sync.Mutex
	roll := func(p float64) bool {
		rmu.Lock()
		defer rmu.Unlock()
		return rng.Float64() < p
	}
	e.store.SetHook(func([]catalog.Op) cmem.Fault {
		switch {
		case roll(0.1):
			return cmem.Fail
		case roll(0.1):
			return cmem.LoseAnswer
		}
		return cmem.None
	})
	e.log.SetHook(func(message.PChannel, []byte) wmem.Fault {
		switch {
		case roll(0.15):
			return wmem.Fault{Fail: true}
		case roll(0.1):
			return wmem.Fault{LoseAnswer: true}
		case roll(0.1):
			return wmem.Fault{Delay: time.Millisecond}
		}
		return wmem.Fault{}
	})
	e.mu.Lock()
	for id := uint64(1); id < 200; id++ {
		if roll(0.2) {
			e.failNext[id] = 1 + int(id%3)
		}
	}
	e.mu.Unlock()
	b := e.open()
	ctx := ctxT(t, 60*time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	created := map[uint64][]message.VChannel{}
	for i := range 60 {
		rmu.Lock()
		coll := rng.IntN(6)
		excl := rng.IntN(3) > 0
		p1, p2 := rng.IntN(4), rng.IntN(4)
		rmu.Unlock()
		wg.Go(func() {
			targets := []message.VChannel{vch(p1, fmt.Sprint("v", i))}
			if p2 != p1 {
				targets = append(targets, vch(p2, fmt.Sprint("w", i)))
			}
			key := resource.SharedCollection("db", fmt.Sprint("c", coll))
			if excl {
				key = resource.ExclusiveCollection("db", fmt.Sprint("c", coll))
			}
			res, err := do(ctx, b, msgOf(t, typCreate, fmt.Sprint(i), targets), key)
			if err != nil {
				if broadcast.IsTaskNotCreated(err) {
					return
				}
				t.Errorf("broadcast %d: %v", i, err)
				return
			}
			mu.Lock()
			created[res.BroadcastID] = append(targets, cchan)
			mu.Unlock()
		})
	}
	wg.Wait()
	e.store.SetHook(nil)
	e.log.SetHook(nil)
	if len(created) < 20 {
		t.Fatalf("only %d broadcasts succeeded", len(created))
	}
	e.checkInvariants(b, created)
	conflictOrder(t, e.callsCopy())
	t.Logf("seed %d: %d broadcasts, stats %+v", seed, len(created), b.Stats())
}
