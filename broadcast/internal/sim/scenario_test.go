package sim

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// Scenarios that need an exact interleaving (replicated order, keys held
// until a tombstone is durable, promotion over failing callbacks, ...),
// each named for the requirement of docs/spec.md it checks, and engine rules
// that once were checked only with sleeps, run exactly on the decision
// core. The checker of the seeded runs watches each.

func mustOK(t *testing.T, x *sent) {
	t.Helper()
	if x.reply == nil {
		t.Fatalf("%s: no answer", x.r.name())
	}
	if x.reply.Err != nil {
		t.Fatalf("%s: %v", x.r.name(), x.reply.Err)
	}
}

var holdCallbacks = func(a engine.Action) bool { return a.Kind == engine.ActCallback }

// TestR4_5_StaleReplicatedReackAfterGC: on a secondary, replicated
// broadcast 20 completes and its tombstone is collected; a node restarting
// from an older snapshot acks every copy again, with the message. No task is
// recreated and the effect stays applied once.
func TestR4_5_StaleReplicatedReackAfterGC(t *testing.T) {
	s := newScript(t, true, 3)
	m := replicatedMsg(20, typCreate, []message.VChannel{vc(1, "x")}, resource.ExclusiveCollection("db", "c"))
	mustOK(t, s.ack(m, m.Broadcast.VChannels[1], 100))
	mustOK(t, s.ack(m, vc(1, "x"), 101))
	s.settle(nil)
	if s.effect(20) != 1 {
		t.Fatalf("effect %d", s.effect(20))
	}
	// Count pressure collects 20: three more replicated broadcasts.
	for id := uint64(21); id <= 24; id++ {
		x := replicatedMsg(id, typPlain, []message.VChannel{vc(2, "y")})
		mustOK(t, s.ack(x, x.Broadcast.VChannels[1], 100+10*id))
		mustOK(t, s.ack(x, vc(2, "y"), 101+10*id))
		s.settle(nil)
	}
	s.w.now = s.w.now.Add(s.c.cfg.CheckInterval)
	s.settle(nil)
	s.c.step(engine.Tick{})
	s.settle(nil)
	if live, _, _, ok := s.c.core.View().TaskByID(20); ok || live != nil {
		t.Fatal("broadcast 20 still remembered: the scenario needs it collected")
	}
	for _, v := range m.Broadcast.VChannels {
		mustOK(t, s.ack(m, v, 100))
	}
	s.settle(nil)
	if _, _, _, ok := s.c.core.View().TaskByID(20); ok || s.effect(20) != 1 {
		t.Fatalf("after the stale re-acks: task recreated %v, effect %d", ok, s.effect(20))
	}
	if n := s.c.core.View().Stats().StaleAcks; n == 0 {
		t.Fatal("no stale ack counted")
	}
}

// TestR5_4_ReplicatedOrderByControlTickAfterRestart: two conflicting
// replicated tasks, every copy acked, 11 ahead of 10 on the control channel;
// a restart before either callback runs 11 first. The live variant: control
// acks in tick order enrol 11 first.
func TestR5_4_ReplicatedOrderByControlTickAfterRestart(t *testing.T) {
	for _, restart := range []bool{true, false} {
		s := newScript(t, true, 64)
		a := replicatedMsg(10, typCreate, []message.VChannel{vc(1, "x")}, resource.ExclusiveCollection("db", "c"))
		b := replicatedMsg(11, typImport, []message.VChannel{vc(2, "y")}, resource.ExclusiveCollection("db", "c"))
		ctl := a.Broadcast.VChannels[1]
		if restart {
			// Acked in an order a restart forgets: 10's control copy first,
			// though it is behind 11's in the WAL.
			mustOK(t, s.ack(a, ctl, 200))
			mustOK(t, s.ack(b, ctl, 100))
		} else {
			mustOK(t, s.ack(b, ctl, 100))
			mustOK(t, s.ack(a, ctl, 200))
		}
		mustOK(t, s.ack(a, vc(1, "x"), 201))
		mustOK(t, s.ack(b, vc(2, "y"), 101))
		s.settle(holdCallbacks)
		if restart {
			s.c.crash()
			if err := s.c.start(); err != nil {
				t.Fatal(err)
			}
		}
		s.settle(nil)
		if got := s.applied(); !slices.Equal(got, []uint64{11, 10}) && restart || !restart && !slices.Equal(got, []uint64{11, 10}) {
			t.Fatalf("restart %v: callbacks took effect in order %v, want 11 then 10", restart, got)
		}
	}
}

// TestR5_4_SharedBehindExclusiveWaits: replicated 10 holds db:c shared and
// its callback is blocked; 11 takes it exclusive, 12 shared, all acked. 12 is
// compatible with 10 but not with 11: the order is 10, 11, 12.
func TestR5_4_SharedBehindExclusiveWaits(t *testing.T) {
	s := newScript(t, true, 64)
	ms := []*message.Message{
		replicatedMsg(10, typCreate, []message.VChannel{vc(1, "x")}, resource.SharedCollection("db", "c")),
		replicatedMsg(11, typCreate, []message.VChannel{vc(1, "x")}, resource.ExclusiveCollection("db", "c")),
		replicatedMsg(12, typCreate, []message.VChannel{vc(1, "x")}, resource.SharedCollection("db", "c")),
	}
	for i, m := range ms {
		mustOK(t, s.ack(m, m.Broadcast.VChannels[1], uint64(100+10*i)))
		mustOK(t, s.ack(m, vc(1, "x"), uint64(101+10*i)))
	}
	s.settle(isCallback(10))
	if got := s.applied(); len(got) != 0 {
		t.Fatalf("with 10 blocked, %v took effect", got)
	}
	if st := s.stage(12); st != engine.Queued {
		t.Fatalf("12 is %s, want queued behind 11", st)
	}
	s.settle(nil)
	if got := s.applied(); !slices.Equal(got, []uint64{10, 11, 12}) {
		t.Fatalf("order %v, want 10 11 12", got)
	}
}

// TestR5_4_FailingCallbackHoldsOnlyConflicting: on a secondary, A's
// callback keeps failing; B conflicts with A and is fully acked; C does not
// conflict. C completes while A retries; B starts only after A's TOMBSTONE.
func TestR5_4_FailingCallbackHoldsOnlyConflicting(t *testing.T) {
	s := newScript(t, true, 64)
	a := replicatedMsg(10, typCreate, []message.VChannel{vc(1, "x")}, resource.ExclusiveCollection("db", "c"))
	b := replicatedMsg(11, typCreate, []message.VChannel{vc(1, "x")}, resource.ExclusiveCollection("db", "c"))
	c := replicatedMsg(12, typCreate, []message.VChannel{vc(2, "y")}, resource.ExclusiveCollection("db", "other"))
	s.w.failing[10] = 5
	for i, m := range []*message.Message{a, b, c} {
		mustOK(t, s.ack(m, m.Broadcast.VChannels[1], uint64(100+10*i)))
		mustOK(t, s.ack(m, m.Broadcast.VChannels[0], uint64(101+10*i)))
	}
	s.settle(nil)
	if got := s.applied(); !slices.Equal(got, []uint64{12, 10, 11}) {
		t.Fatalf("order %v, want 12 (not held), then 10 after its retries, then 11", got)
	}
	if s.c.core.View().Stats().CallbackFailures < 5 {
		t.Fatal("A's failures not counted")
	}
}

// TestR5_4_StrictOrderOnSecondary: a pending Exclusive(db1) task waits
// behind a retrying db1:c1 callback; a later db2 task runs at once, a later
// db1:c2 task waits (walcast keeps control-channel order among conflicting
// tasks, a deliberate divergence from the reference system).
func TestR5_4_StrictOrderOnSecondary(t *testing.T) {
	s := newScript(t, true, 64)
	c1 := replicatedMsg(10, typCreate, []message.VChannel{vc(1, "x")}, resource.SharedDatabase("db1"), resource.ExclusiveCollection("db1", "c1"))
	db1 := replicatedMsg(11, typCreate, []message.VChannel{vc(1, "x")}, resource.ExclusiveDatabase("db1"))
	db2 := replicatedMsg(12, typCreate, []message.VChannel{vc(2, "y")}, resource.ExclusiveDatabase("db2"))
	c2 := replicatedMsg(13, typCreate, []message.VChannel{vc(3, "z")}, resource.SharedDatabase("db1"), resource.ExclusiveCollection("db1", "c2"))
	s.w.failing[10] = 3
	for i, m := range []*message.Message{c1, db1, db2, c2} {
		mustOK(t, s.ack(m, m.Broadcast.VChannels[1], uint64(100+10*i)))
		mustOK(t, s.ack(m, m.Broadcast.VChannels[0], uint64(101+10*i)))
	}
	s.settle(isCallback(10))
	if got := s.applied(); !slices.Equal(got, []uint64{12}) {
		t.Fatalf("with 10 retrying, %v took effect; want only 12", got)
	}
	if st := s.stage(13); st != engine.Queued {
		t.Fatalf("db1:c2 is %s, want queued behind db1", st)
	}
	s.settle(nil)
	if got := s.applied(); !slices.Equal(got, []uint64{12, 10, 11, 13}) {
		t.Fatalf("order %v, want 12 10 11 13", got)
	}
}

// TestR3_6_KeysHeldUntilTombstoneDurable: A's TOMBSTONE commit is held; a
// conflicting B waits for its keys and persists nothing. Then the TOMBSTONE
// lands and GC's commit is held instead: B still completes.
func TestR3_6_KeysHeldUntilTombstoneDurable(t *testing.T) {
	s := newScript(t, false, 3)
	keys := []resource.Key{resource.ExclusiveCollection("db", "c")}
	isTomb := func(a engine.Action) bool { return a.Kind == engine.ActWrite && a.Write.Kind == engine.WriteTombstone }
	isGC := func(a engine.Action) bool { return a.Kind == engine.ActWrite && a.Write.Kind == engine.WriteGC }
	a := s.broadcast(typCreate, "", keys, vc(1, "x"))
	s.settle(isTomb)
	b := s.broadcast(typCreate, "", keys, vc(1, "x"))
	s.settle(isTomb)
	if b.submit != nil || a.result() != nil {
		t.Fatalf("B got its keys (%v) before A's TOMBSTONE was durable", b.submit != nil)
	}
	s.settle(isGC)
	if r := b.result(); r == nil || r.Err != nil || r.Result == nil {
		t.Fatalf("B with GC's commit held: %+v", r)
	}
	s.settle(nil)
}

// TestR6_1_HungGCBlocksNothing: GC's delete commit hangs; 32 broadcasts
// still complete, and the backlog is collected once it is released.
func TestR6_1_HungGCBlocksNothing(t *testing.T) {
	s := newScript(t, false, 3)
	isGC := func(a engine.Action) bool { return a.Kind == engine.ActWrite && a.Write.Kind == engine.WriteGC }
	var calls []*call
	for i := range 32 {
		calls = append(calls, s.broadcast(typCreate, "", []resource.Key{resource.ExclusiveCollection("db", "c"+string(rune('a'+i%8)))}, vc(i%4, "x")))
		s.settle(isGC)
	}
	for i, c := range calls {
		if r := c.result(); r == nil || r.Result == nil {
			t.Fatalf("broadcast %d not finished with GC hung: %+v", i, r)
		}
	}
	s.settle(nil)
	s.w.now = s.w.now.Add(s.c.cfg.CheckInterval)
	s.c.step(engine.Tick{})
	s.settle(nil)
	if _, n := s.c.core.View().Counts(); n > s.w.maxCount {
		t.Fatalf("%d tombstones left after GC was released, MaxCount %d", n, s.w.maxCount)
	}
}

// TestR6_2_FailedGCKeepsIndex: a GC commit that fails keeps the tombstones
// and their index entries; a retry with the key is still a duplicate; the
// next run collects them and only then retires the key.
func TestR6_2_FailedGCKeepsIndex(t *testing.T) {
	s := newScript(t, false, 1)
	key := message.ClusterKey("k")
	first := s.broadcast(typCreate, key, []resource.Key{resource.ExclusiveCollection("db", "c")}, vc(1, "x"))
	s.settle(nil)
	orig := first.result().Result.ID
	// Two more tombstones put the keyed one beyond MaxCount; GC fails.
	for range 2 {
		s.broadcast(typPlain, "", []resource.Key{resource.ExclusiveCollection("db", "d")}, vc(2, "y"))
		for {
			i := slices.IndexFunc(s.c.ops, func(o *op) bool { return o.a.Kind == engine.ActWrite && o.a.Write.Kind == engine.WriteGC })
			if i >= 0 {
				o := s.c.ops[i]
				s.c.ops = append(s.c.ops[:i], s.c.ops[i+1:]...)
				s.c.step(engine.Written{ID: o.a.Write.ID, Err: errDefinite})
				continue
			}
			if len(s.c.ops) == 0 {
				break
			}
			s.c.complete(0)
		}
	}
	if _, _, _, ok := s.c.core.View().TaskByID(orig); !ok {
		t.Fatal("the keyed tombstone is gone though GC failed")
	}
	dup := s.broadcast(typCreate, key, []resource.Key{resource.ExclusiveCollection("db", "c")}, vc(1, "x"))
	if r := dup.result(); r == nil || r.Original == nil || r.Original.ID != orig {
		t.Fatalf("retry after a failed GC: %+v, want the original %d", r, orig)
	}
	s.w.now = s.w.now.Add(s.c.cfg.CheckInterval)
	s.c.step(engine.Tick{})
	s.settle(nil)
	if o := s.c.core.View().Lookup(engine.ScopeOf(typCreate, key)); o != nil {
		t.Fatalf("key still indexed after its tombstone was collected: %+v", o)
	}
}

// TestR7_8_TwoTombstonesOneScope: a catalog holding two tombstones in one
// scope (5 and 9, as a primary's GC can leave on a secondary): on a
// secondary the newest replicated owner wins (R8.4), also after a restart;
// evicting the older keeps the newer's entry, evicting the newer removes
// it, and the key is then new work again.
func TestR7_8_TwoTombstonesOneScope(t *testing.T) {
	s := newScript(t, true, 3)
	key := message.ClusterKey("k")
	for _, id := range []uint64{5, 9} {
		m := replicatedMsg(id, typCreate, []message.VChannel{vc(1, "x")}, resource.ExclusiveCollection("db", "c"))
		m.IdempotencyKey = key
		mustOK(t, s.ack(m, m.Broadcast.VChannels[1], 100*id))
		mustOK(t, s.ack(m, vc(1, "x"), 100*id+1))
		s.settle(nil)
	}
	for _, restart := range []bool{false, true} {
		if restart {
			s.c.crash()
			if err := s.c.start(); err != nil {
				t.Fatal(err)
			}
		}
		if o := s.c.core.View().Lookup(engine.ScopeOf(typCreate, key)); o == nil || o.ID != 9 {
			t.Fatalf("restart %v: key resolves to %+v, want 9", restart, o)
		}
	}
	// MaxCount 3 evicts the oldest first: 5, then 9.
	for i, want := range []uint64{9, 0} {
		for id := uint64(30 + 2*i); id < uint64(32+2*i); id++ {
			x := replicatedMsg(id, typPlain, []message.VChannel{vc(2, "y")})
			mustOK(t, s.ack(x, x.Broadcast.VChannels[1], 100*id))
			mustOK(t, s.ack(x, vc(2, "y"), 100*id+1))
			s.settle(nil)
		}
		evicted := []uint64{5, 9}[i]
		if _, _, _, ok := s.c.core.View().TaskByID(evicted); ok {
			t.Fatalf("tombstone %d not evicted: the scenario needs it gone", evicted)
		}
		o := s.c.core.View().Lookup(engine.ScopeOf(typCreate, key))
		switch {
		case want == 0 && o != nil:
			t.Fatalf("after evicting 9 the key resolves to %+v, want new work", o)
		case want != 0 && (o == nil || o.ID != want):
			t.Fatalf("after evicting 5 the key resolves to %+v, want %d", o, want)
		}
	}
	s.noViolation()
}

// TestR7_4_PlainHandleHittingTombstonedOriginal: a plain handle holding
// Exclusive(db:c) broadcasts a keyed message whose original is tombstoned:
// the answer is the original, and no key stays held.
func TestR7_4_PlainHandleHittingTombstonedOriginal(t *testing.T) {
	s := newScript(t, false, 64)
	key := message.ClusterKey("k")
	first := s.broadcast(typCreate, key, []resource.Key{resource.ExclusiveCollection("db", "c")}, vc(1, "x"))
	s.settle(nil)
	h := s.w.newHandle()
	norm, _ := resource.WithClusterKey([]resource.Key{resource.ExclusiveCollection("db", "c")})
	mustOK(t, s.send(engine.Lock{Handle: h, Keys: norm, Need: engine.Primary}, "lock"))
	m, _ := message.NewBroadcast(typCreate, []byte("p"), []message.VChannel{vc(1, "x")}, message.WithIdempotencyKey(key))
	st, raw, _ := stampForSubmit(s.c, m, norm)
	r := s.send(engine.Submit{Handle: h, Msg: st, Bytes: raw}, "submit")
	if r.reply == nil || r.reply.Original == nil || r.reply.Original.ID != first.result().Result.ID {
		t.Fatalf("plain handle's keyed broadcast: %+v", r.reply)
	}
	if ks := s.c.core.View().Locks(); len(ks) != 0 {
		t.Fatalf("keys held after the duplicate: %+v", ks)
	}
}

// TestR5_5_RepeatedAcksRunAckOnceOnce: an AckSyncUp-free ack-once type's
// copy acked three times runs its ack-once callback once per copy.
func TestR5_5_RepeatedAcksRunAckOnceOnce(t *testing.T) {
	s := newScript(t, false, 64)
	holdAckOnce := func(a engine.Action) bool { return a.Kind == engine.ActAckOnce }
	c := s.broadcast(typOnce, "", []resource.Key{resource.ExclusiveCollection("db", "c")}, vc(1, "x"), vc(2, "y"))
	s.settle(holdAckOnce)
	runs := 0
	for _, o := range s.c.ops {
		if o.a.Kind == engine.ActAckOnce {
			runs++
		}
	}
	id := uint64(0)
	s.c.core.View().EachLive(func(tid uint64, _ engine.State, _ engine.Stage, _ *message.Message, _ int) { id = tid })
	m := &message.Message{Broadcast: message.BroadcastHeader{ID: id}}
	for range 3 {
		s.send(engine.Ack{ID: id, VChannel: vc(1, "x"), Msg: m}, "ack")
	}
	for _, o := range s.c.ops {
		if o.a.Kind == engine.ActAckOnce {
			runs--
		}
	}
	if runs != 0 {
		t.Fatalf("repeated acks started %d more ack-once runs", -runs)
	}
	s.settle(nil)
	if r := c.result(); r == nil || r.Result == nil {
		t.Fatalf("broadcast: %+v", r)
	}
}

// TestR4_7_StopAtEveryStage: a stop at each stage of a task answers its
// caller "not created" exactly while its PENDING record was never written or
// tried ambiguously, and "created, completes after recovery" after; the
// recovered core then completes every created task once.
func TestR4_7_StopAtEveryStage(t *testing.T) {
	for stage := range 8 {
		s := newScript(t, false, 64)
		c := s.broadcast(typSync, "", []resource.Key{resource.ExclusiveCollection("db", "c")}, vc(1, "x"))
		for range stage {
			if len(s.c.ops) == 0 {
				break
			}
			s.c.complete(0)
		}
		var stageName engine.Stage
		s.c.core.View().EachLive(func(_ uint64, _ engine.State, st engine.Stage, _ *message.Message, _ int) { stageName = st })
		s.c.step(engine.Stop{})
		r := c.result()
		if r == nil || r.Err == nil {
			t.Fatalf("stage %s: stop left the caller %+v", stageName, r)
		}
		created := len(s.w.check.facts(s.c).recs) > 0
		if notCreated := errors.Is(r.Err, engine.ErrTaskNotCreated); notCreated == created {
			t.Fatalf("stage %s: record written %v, answer %v", stageName, created, r.Err)
		}
		if err := s.c.start(); err != nil {
			t.Fatal(err)
		}
		// The AckSyncUp copies need their consumer.
		for range 20 {
			s.settle(nil)
			for _, n := range s.c.nodes {
				for n.ready() {
					n.next()
					s.settle(nil)
				}
			}
		}
		s.w.check.final()
		s.noViolation()
	}
}

// TestR8_3_PromoteCrashResumesWithoutDoubleAppend: the promoting
// coordinator crashes after the promote's PENDING record is durable, (a)
// before its copies are appended, (b) once appended but before the nodes
// acked them, (c) once acked. Recovery resumes the promote; each of its
// copies and each supplement lands once; the cluster stays secondary until
// the promote finished.
func TestR8_3_PromoteCrashResumesWithoutDoubleAppend(t *testing.T) {
	for _, variant := range []string{"before append", "appended, unacked", "acked"} {
		s := newScript(t, true, 64)
		m := replicatedMsg(10, typCreate, []message.VChannel{vc(1, "x"), vc(2, "y")}, resource.ExclusiveCollection("db", "c"))
		s.replicate(m, m.Broadcast.VChannels[2])
		s.consume(nil) // the control copy acked; x and y never arrived
		p := s.promote()
		isAppend := func(a engine.Action) bool { return a.Kind == engine.ActAppend }
		switch variant {
		case "before append":
			s.settle(isAppend)
		case "appended, unacked":
			s.settle(nil)
		case "acked":
			s.settle(nil)
			s.consume(isAppend)
		}
		var promoteID uint64
		s.c.core.View().EachLive(func(id uint64, _ engine.State, _ engine.Stage, m *message.Message, _ int) {
			if m.Type == engine.AlterReplicateConfig {
				promoteID = id
			}
		})
		if promoteID == 0 {
			t.Fatalf("%s: no promote task", variant)
		}
		s.c.crash()
		if r, _ := s.c.core.View().Role(); r != engine.Secondary {
			t.Fatalf("%s: role %s before the promote finished", variant, r)
		}
		if err := s.c.start(); err != nil {
			t.Fatal(err)
		}
		for range 10 {
			s.settle(nil)
			s.consume(nil)
		}
		if r, _ := s.c.core.View().Role(); r != engine.Primary {
			t.Fatalf("%s: role %s after the resumed promote", variant, r)
		}
		for v, n := range s.copies(promoteID) {
			if n != 1 {
				t.Errorf("%s: the promote's copy on %s landed %d times", variant, v, n)
			}
		}
		if got := s.copies(10); got[vc(1, "x")] != 1 || got[vc(2, "y")] != 1 {
			t.Errorf("%s: supplements of 10: %v, want x and y once each", variant, got)
		}
		if s.effect(10) != 1 {
			t.Errorf("%s: effect of 10 applied %d times", variant, s.effect(10))
		}
		_ = p
		s.w.check.final()
		s.noViolation()
	}
}

// TestR8_3_PromoteWaitsForFailingCallback: a replicated task, fully acked,
// whose callback fails several times when the promote starts: the promote
// waits for it; both complete and the Cluster key is free.
func TestR8_3_PromoteWaitsForFailingCallback(t *testing.T) {
	s := newScript(t, true, 64)
	m := replicatedMsg(10, typCreate, []message.VChannel{vc(1, "x")}, resource.ExclusiveCollection("db", "c"))
	s.w.failing[10] = 4
	mustOK(t, s.ack(m, m.Broadcast.VChannels[1], 100))
	mustOK(t, s.ack(m, vc(1, "x"), 101))
	p := s.promote()
	for range 10 {
		s.settle(nil)
		s.consume(nil)
	}
	if r := p.result(); r == nil || r.Result == nil {
		t.Fatalf("promote: %+v", r)
	}
	if s.effect(10) != 1 {
		t.Fatalf("effect %d", s.effect(10))
	}
	if ks := s.c.core.View().Locks(); len(ks) != 0 {
		t.Fatalf("keys held: %+v", ks)
	}
}

// TestR8_3_PromoteIgnoresStaleTopologyOnly: two replicated topology
// changes, one fully acked (it completes as a topology change), one stale
// (its copies never all arrived: supplemented and ignored); the cluster ends
// primary with the promoted topology.
func TestR8_3_PromoteIgnoresStaleTopologyOnly(t *testing.T) {
	s := newScript(t, true, 64)
	cfg, _ := json.Marshal(engine.ReplicateConfig{Primary: "east", Secondaries: []engine.SecondaryConfig{{Name: "west"}, {Name: "north"}}})
	arc := func(id uint64) *message.Message {
		keys, _ := resource.WithClusterKey([]resource.Key{resource.ExclusiveCluster()})
		return &message.Message{Type: engine.AlterReplicateConfig, Payload: cfg,
			Broadcast: message.BroadcastHeader{ID: id, VChannels: s.c.cfg.ControlTargets, ResourceKeys: keys},
			Replicate: &message.ReplicateHeader{SourceCluster: "east", SourcePChannel: "wal-0"}}
	}
	done, stale := arc(10), arc(11)
	s.replicate(done, done.Broadcast.VChannels...)
	s.replicate(stale, stale.Broadcast.VChannels[0])
	s.consume(nil)
	p := s.promote()
	for range 10 {
		s.settle(nil)
		s.consume(nil)
	}
	if r := p.result(); r == nil || r.Result == nil {
		t.Fatalf("promote: %+v", r)
	}
	if r, topo := s.c.core.View().Role(); r != engine.Primary || topo.Primary != "west" {
		t.Fatalf("after the promote: %s, %+v", r, topo)
	}
	outcome := func(id uint64) engine.OutcomeStatus {
		return s.w.check.facts(s.c).recs[id].outcome.Status
	}
	if outcome(10) != engine.Succeeded || outcome(11) != engine.Ignored {
		t.Fatalf("outcomes: 10 %s, 11 %s; want succeeded, ignored", outcome(10), outcome(11))
	}
	if got := s.copies(10); len(got) != 0 {
		t.Fatalf("the complete topology change was supplemented: %v", got)
	}
}

// TestR9_2_DeposedLeaderRefusesAcksOfNewerBroadcasts: a coordinator that
// lost its leadership without noticing yet (a zombie resumed) gets a node's
// ack for a broadcast the new leader issued, above every id this one
// reserved. It must refuse it as fenced, so that the node acks it at the
// new leader; answered as done, the ack was lost and the new leader's task
// waited for it forever (seen in the cluster fault test's zombie phase).
// Acks of its own broadcasts, done or collected, are still answered.
func TestR9_2_DeposedLeaderRefusesAcksOfNewerBroadcasts(t *testing.T) {
	s := newScript(t, false, 3)
	b := s.broadcast(typPlain, "", []resource.Key{resource.ExclusiveCollection("db", "a")}, vc(1, "a"))
	s.settle(nil)
	r := b.result()
	if r == nil || r.Err != nil || r.Result == nil {
		t.Fatalf("broadcast: %+v", r)
	}
	own := r.Result.ID
	newer := own + 100_000 // above this coordinator's block: another leader's
	m := &message.Message{Type: typPlain, Payload: []byte("x"), Broadcast: message.BroadcastHeader{ID: newer, VChannels: []message.VChannel{vc(1, "b")}}}
	x := s.ack(m, vc(1, "b"), 7)
	if x.reply == nil || !errors.Is(x.reply.Err, catalog.ErrFenced) {
		t.Fatalf("ack of broadcast %d, issued by a newer leader: %+v; want an error wrapping catalog.ErrFenced", newer, x.reply)
	}
	// Its own broadcast, done: a repeated ack is answered (R4.5).
	mine := &message.Message{Type: typPlain, Broadcast: message.BroadcastHeader{ID: own, VChannels: []message.VChannel{vc(1, "a")}}}
	if x := s.ack(mine, vc(1, "a"), 5); x.reply == nil || x.reply.Err != nil {
		t.Fatalf("repeated ack of its own broadcast %d: %+v", own, x.reply)
	}
}

// TestR4_4_AckSyncUpAckAnsweredOnceDurable: a consumer's ack of an
// AckSyncUp copy is answered only once a write of the task's record holding
// it is done (so that a deposed leader, whose write is fenced, cannot
// answer it and lose it for the new leader), and the record holds it.
func TestR4_4_AckSyncUpAckAnsweredOnceDurable(t *testing.T) {
	s := newScript(t, false, 64)
	s.broadcast(typSync, "", []resource.Key{resource.ExclusiveCollection("db", "c")}, vc(1, "x"))
	s.settle(nil)
	var m *message.Message
	s.c.core.View().EachLive(func(_ uint64, _ engine.State, _ engine.Stage, msg *message.Message, _ int) { m = msg })
	if m == nil {
		t.Fatal("no live task")
	}
	x := s.send(engine.Ack{ID: m.Broadcast.ID, VChannel: vc(1, "x"), Checkpoint: wal.Checkpoint{MessageID: 9, TimeTick: 9, LastConfirmed: 9}}, "ack")
	if x.reply != nil {
		t.Fatalf("ack answered before any write: %+v", x.reply)
	}
	i := slices.IndexFunc(s.c.ops, func(o *op) bool { return o.a.Kind == engine.ActWrite && o.a.Write.Kind == engine.WriteAcks })
	if i < 0 {
		t.Fatal("no write of the ack")
	}
	w := s.c.ops[i].a.Write
	if w.Record == nil || len(w.Record.Acked) == 0 || !w.Record.Acked[m.Index(vc(1, "x"))] {
		t.Fatalf("the ack's write does not hold it: %+v", w.Record)
	}
	for x.reply == nil {
		i := slices.IndexFunc(s.c.ops, func(o *op) bool { return o.a.Kind == engine.ActWrite && o.a.Write.Kind == engine.WriteAcks })
		if i < 0 {
			t.Fatal("the ack's write finished and the ack is not answered")
		}
		s.c.complete(i)
	}
	mustOK(t, x)
}
