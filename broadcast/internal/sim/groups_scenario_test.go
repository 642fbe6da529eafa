package sim

import (
	"errors"
	"fmt"
	"testing"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// Scripted scenarios of groups, owners, two-phase appends and local-only
// broadcasts (R13), each an exact interleaving on the decision core, with
// the checker of the seeded runs watching every write and lock.

// groupCall describes one broadcast of a scenario beyond a plain one.
type groupCall struct {
	typ     message.Type
	key     message.IdempotencyKey
	payload string
	// keys are the broadcast's own keys; a member (gid != 0) locks only
	// the shared Cluster key and is stamped with stamp, its group's keys.
	keys, stamp []resource.Key
	gid         uint64
	group       *message.GroupHeader
	opts        []message.Option
	targets     []message.VChannel
	need        engine.Role
	local       bool
}

// send runs gc's Lock and Submit (Resolve first when keyed), as the face
// does.
func (s *script) groupSend(gc groupCall) *call {
	s.t.Helper()
	c := &call{h: s.w.newHandle()}
	if gc.key != "" {
		gc.key = message.ClusterKey(string(gc.key))
		r := s.send(engine.Resolve{Handle: c.h, Scope: engine.ScopeOf(gc.typ, gc.key), Key: gc.key, CheckNew: true}, "resolve")
		if r.reply == nil || r.reply.Err != nil || !r.reply.Admitted {
			c.submit = r
			return c
		}
	}
	lockKeys := gc.keys
	if gc.gid != 0 {
		lockKeys = nil
	}
	norm, err := resource.WithClusterKey(lockKeys)
	if err != nil {
		s.t.Fatal(err)
	}
	stamp := norm
	if gc.gid != 0 {
		stamp = gc.stamp
	}
	payload := gc.payload
	if payload == "" {
		payload = "p"
	}
	submit := func() *sent {
		opts := gc.opts
		if gc.key != "" {
			opts = append(opts, message.WithIdempotencyKey(gc.key))
		}
		if gc.local {
			opts = append(opts, message.WithProperty(engine.UnreplicableProperty, engine.LocalMark))
		}
		m, err := message.NewBroadcast(gc.typ, []byte(payload), gc.targets, opts...)
		if err != nil {
			s.t.Fatal(err)
		}
		if gc.group != nil {
			g := *gc.group
			g.ID = gc.gid
			m.Group = &g
		}
		st, raw, err := stampForSubmit(s.c, m, stamp)
		if err != nil {
			s.t.Fatal(err)
		}
		return s.send(engine.Submit{Handle: c.h, Msg: st, Bytes: raw, Group: gc.gid}, "submit")
	}
	need := gc.need
	if need == 0 && !gc.local {
		need = engine.Primary
	}
	c.lock = s.send(engine.Lock{Handle: c.h, Keys: norm, Need: need}, "lock")
	switch {
	case c.lock.reply == nil:
		c.lock.then = func(a engine.Reply) {
			if a.Err == nil {
				c.submit = submit()
			}
		}
	case c.lock.reply.Err == nil:
		c.submit = submit()
	}
	return c
}

// answered returns the id that answered c: its result, or its original.
func answered(t *testing.T, c *call) uint64 {
	t.Helper()
	r := c.result()
	switch {
	case r == nil:
		t.Fatal("no answer")
	case r.Err != nil:
		t.Fatalf("answered with %v", r.Err)
	case r.Original != nil:
		return r.Original.ID
	case r.Result == nil:
		t.Fatal("answer without a result")
	}
	return r.Result.ID
}

var collC = resource.ExclusiveCollection("db", "c")

// begin opens a transaction on collection c and returns its id.
func (s *script) begin(key message.IdempotencyKey) uint64 {
	s.t.Helper()
	c := s.groupSend(groupCall{typ: typCreate, key: key, keys: []resource.Key{collC}, group: &message.GroupHeader{Kind: message.GroupBegin},
		targets: []message.VChannel{vc(1, "x")}})
	s.settle(nil)
	return answered(s.t, c)
}

// member sends a member of open group gid.
func (s *script) member(gid uint64, kind message.GroupKind, key message.IdempotencyKey) *call {
	s.t.Helper()
	g, ok := s.c.core.View().Group(gid)
	if !ok {
		s.t.Fatalf("group %d not open: %v", gid, s.c.core.View().GroupError(gid))
	}
	return s.groupSend(groupCall{typ: typCreate, key: key, gid: gid, stamp: g.Keys, targets: g.Targets[:len(g.Targets)-1],
		group: &message.GroupHeader{Kind: kind}, payload: fmt.Sprint("member ", key)})
}

// plainOnC sends a plain broadcast conflicting with the group's keys.
func (s *script) plainOnC() *call {
	return s.groupSend(groupCall{typ: typPlain, keys: []resource.Key{collC}, targets: []message.VChannel{vc(2, "y")}})
}

// restart crashes the cluster and recovers it from its catalog and WAL.
func (s *script) restart() {
	s.t.Helper()
	s.c.crash()
	if err := s.c.start(); err != nil {
		s.t.Fatal(err)
	}
	s.settle(nil)
}

// drain lets everything settle and the nodes consume what they can.
func (s *script) drain() {
	s.t.Helper()
	for range 10 {
		s.settle(nil)
		s.consume(nil)
	}
	s.noViolation()
}

// finish drains and runs the end-of-run checks.
func (s *script) finish() {
	s.t.Helper()
	s.drain()
	s.w.check.final()
	s.noViolation()
}

// TestR13_2_TxnCrashBetweenMembers: a transaction's first body is done, the
// coordinator crashes; after recovery the group is still open and holds its
// keys (a conflicting broadcast waits), the next members join it in order,
// and the commit releases the keys to the waiter.
func TestR13_2_TxnCrashBetweenMembers(t *testing.T) {
	s := newScript(t, false, 64)
	gid := s.begin("txn")
	b1 := s.member(gid, message.GroupBody, "b1")
	s.settle(nil)
	id1 := answered(t, b1)
	before := s.plainOnC()
	s.settle(nil)
	if before.submit != nil {
		t.Fatal("a conflicting broadcast got the keys of an open transaction")
	}
	s.restart() // the waiting caller is lost with the crash
	g, ok := s.c.core.View().Group(gid)
	if !ok || !g.Holding || !g.HoldsHere {
		t.Fatalf("after the restart: group %+v open %v", g, ok)
	}
	waiter := s.plainOnC()
	s.settle(nil)
	if waiter.submit != nil {
		t.Fatal("a conflicting broadcast got the keys of an open transaction")
	}
	// A retried Begin is answered by the open group.
	if again := s.begin("txn"); again != gid {
		t.Fatalf("retried Begin answered %d, want %d", again, gid)
	}
	b2 := s.member(gid, message.GroupBody, "b2")
	s.settle(nil)
	id2 := answered(t, b2)
	commit := s.member(gid, message.GroupCommit, "commit")
	s.finish()
	idc := answered(t, commit)
	if r := waiter.result(); r == nil || r.Err != nil {
		t.Fatalf("the waiter after the commit: %+v", r)
	}
	var order []uint64
	for _, id := range s.applied() {
		if id == gid || id == id1 || id == id2 || id == idc {
			order = append(order, id)
		}
	}
	if fmt.Sprint(order) != fmt.Sprint([]uint64{gid, id1, id2, idc}) {
		t.Fatalf("members took effect in order %v, want %v", order, []uint64{gid, id1, id2, idc})
	}
}

// TestR13_3_ConcurrentCommitsFirstWins: two commits of one transaction sent
// at once: the first ends it, the second joins it and gets its answer; a
// rollback after that is refused; the keys are free.
func TestR13_3_ConcurrentCommitsFirstWins(t *testing.T) {
	s := newScript(t, false, 64)
	gid := s.begin("txn")
	c1 := s.member(gid, message.GroupCommit, "c1")
	c2 := s.member(gid, message.GroupCommit, "c2")
	s.settle(nil)
	first, second := answered(t, c1), answered(t, c2)
	if first != second {
		t.Fatalf("the commits were answered by %d and %d: two ends of one group", first, second)
	}
	rb := s.groupSend(groupCall{typ: typCreate, key: "rb", gid: gid, stamp: []resource.Key{collC, resource.SharedCluster()},
		targets: []message.VChannel{vc(1, "x")}, group: &message.GroupHeader{Kind: message.GroupRollback}})
	s.settle(nil)
	if r := rb.result(); r == nil || !errors.Is(r.Err, engine.ErrFailedPrecondition) {
		t.Fatalf("a rollback after the commit: %+v, want failed precondition", r)
	}
	after := s.plainOnC()
	s.finish()
	if r := after.result(); r == nil || r.Err != nil {
		t.Fatalf("collection c after the commit: %+v", r)
	}
}

// TestR13_3_RollbackReleasesAndCollectsTogether: a rolled-back transaction
// releases its keys, and GC removes its members together once its window
// passed.
func TestR13_3_RollbackReleasesAndCollectsTogether(t *testing.T) {
	s := newScript(t, false, 64)
	gid := s.begin("txn")
	s.member(gid, message.GroupBody, "b1")
	s.settle(nil)
	rb := s.member(gid, message.GroupRollback, "rb")
	s.settle(nil)
	idr := answered(t, rb)
	if _, open := s.c.core.View().Group(gid); open {
		t.Fatal("group still open after its rollback")
	}
	after := s.plainOnC()
	s.finish()
	if r := after.result(); r == nil || r.Err != nil {
		t.Fatalf("collection c after the rollback: %+v", r)
	}
	// Every window passes: the whole group goes at once, nothing is left.
	s.w.now = s.w.now.Add(48 * s.c.cfg.CheckInterval)
	for range 50 {
		s.c.step(engine.Tick{})
		s.settle(nil)
	}
	for _, id := range []uint64{gid, idr} {
		if _, _, _, ok := s.c.core.View().TaskByID(id); ok {
			t.Errorf("broadcast %d of the rolled-back group still remembered", id)
		}
	}
	s.noViolation()
}

// TestR13_5_PromoteHandsOpenGroupKeysOver: a secondary holds a replicated
// transaction's Begin (its Commit never arrived) when it is force-promoted:
// the promoted cluster gives the open group its keys, so a conflicting
// broadcast waits until the application rolls the group back.
func TestR13_5_PromoteHandsOpenGroupKeysOver(t *testing.T) {
	s := newScript(t, true, 64)
	m := replicatedMsg(10, typCreate, []message.VChannel{vc(1, "x")}, collC)
	m.Group = &message.GroupHeader{Kind: message.GroupBegin}
	s.replicate(m, m.Broadcast.VChannels...)
	s.consume(nil)
	if _, ok := s.c.core.View().Group(10); !ok {
		t.Fatalf("the replicated Begin opened no group: %v", s.c.core.View().GroupError(10))
	}
	s.promote()
	s.drain()
	if r, _ := s.c.core.View().Role(); r != engine.Primary {
		t.Fatalf("role %s after the promote", r)
	}
	g, ok := s.c.core.View().Group(10)
	if !ok || !g.HoldsHere {
		t.Fatalf("after the promote the open group holds no keys: %+v %v", g, ok)
	}
	waiter := s.plainOnC()
	s.settle(nil)
	if waiter.submit != nil {
		t.Fatal("a conflicting broadcast got the keys of the handed-over group")
	}
	rb := s.member(10, message.GroupRollback, "reconcile")
	s.finish()
	answered(t, rb)
	if r := waiter.result(); r == nil || r.Err != nil {
		t.Fatalf("the waiter after the rollback: %+v", r)
	}
}

// ownerOn sends an owner broadcast (an import job) owning collection c
// under key.
func (s *script) ownerOn(key string) uint64 {
	s.t.Helper()
	c := s.groupSend(groupCall{typ: typOwner, key: message.IdempotencyKey("own-" + key), payload: key, keys: []resource.Key{collC},
		group: &message.GroupHeader{Kind: message.GroupBegin, OwnerKey: key}, targets: []message.VChannel{vc(1, "x")}})
	s.settle(nil)
	return answered(s.t, c)
}

// endOwner sends the broadcast that ends owner key's ownership.
func (s *script) endOwner(key string, gid uint64, typ message.Type, kind message.GroupKind) *call {
	g, ok := s.c.core.View().Group(gid)
	if !ok {
		s.t.Fatalf("owner %d not open", gid)
	}
	return s.groupSend(groupCall{typ: typ, key: message.IdempotencyKey("end-" + key), payload: key, gid: gid, stamp: g.Keys,
		targets: g.Targets[:len(g.Targets)-1], group: &message.GroupHeader{Kind: kind, OwnerKey: key}})
}

// TestR13_9_OwnerSurvivesRestart: an import job owns collection c; the
// coordinator crashes twice while it is owned: the ownership and its keys
// survive both, a drop waits, and the commit releases the collection.
func TestR13_9_OwnerSurvivesRestart(t *testing.T) {
	s := newScript(t, false, 64)
	gid := s.ownerOn("import/7")
	for range 2 {
		s.restart()
		if got := s.c.core.View().OwnerGroup("import/7"); got != gid {
			t.Fatalf("after a restart import/7 is owned by %d, want %d", got, gid)
		}
	}
	drop := s.plainOnC()
	s.settle(nil)
	if drop.submit != nil {
		t.Fatal("a drop got the collection under a running import")
	}
	end := s.endOwner("import/7", gid, typEnd, message.GroupCommit)
	s.finish()
	answered(t, end)
	if s.c.core.View().OwnerGroup("import/7") != 0 {
		t.Fatal("import/7 still owned after its commit")
	}
	if r := drop.result(); r == nil || r.Err != nil {
		t.Fatalf("the drop after the commit: %+v", r)
	}
	// The ended ownership is remembered (a retried end is answered by the
	// first), across a restart, until GC collects the owner's tombstones.
	if got := s.c.core.View().EndedOwner("import/7"); got != gid {
		t.Fatalf("ended owner of import/7: %d, want %d", got, gid)
	}
	s.restart()
	if got := s.c.core.View().EndedOwner("import/7"); got != gid {
		t.Fatalf("after a restart the ended owner of import/7 is %d, want %d", got, gid)
	}
	s.w.now = s.w.now.Add(48 * s.c.cfg.CheckInterval)
	for range 50 {
		s.c.step(engine.Tick{})
		s.settle(nil)
	}
	if _, _, _, ok := s.c.core.View().TaskByID(gid); ok {
		t.Fatal("the owner's tombstone was not collected: the scenario needs it gone")
	}
	if got := s.c.core.View().EndedOwner("import/7"); got != 0 {
		t.Fatalf("after GC the ended owner of import/7 is still remembered as %d", got)
	}
	s.noViolation()
}

// TestR13_8_EndRunsBehindQueuedExclusiveDDL: while an import owns
// collection c an exclusive DDL on c queues for it; the import's end,
// stamped with the owner's keys without locking them again, completes
// ahead of the queued DDL, which then runs.
func TestR13_8_EndRunsBehindQueuedExclusiveDDL(t *testing.T) {
	s := newScript(t, false, 64)
	gid := s.ownerOn("import/8")
	ddl := s.groupSend(groupCall{typ: typCreate, keys: []resource.Key{collC}, targets: []message.VChannel{vc(2, "y")}})
	s.settle(nil)
	if ddl.submit != nil {
		t.Fatal("the exclusive DDL did not wait for the owner")
	}
	end := s.endOwner("import/8", gid, typRoll, message.GroupRollback)
	s.settle(nil)
	answered(t, end)
	s.finish()
	if r := ddl.result(); r == nil || r.Err != nil {
		t.Fatalf("the DDL after the import's end: %+v", r)
	}
	ids := s.applied()
	endID := answered(t, end)
	ddlID := answered(t, ddl)
	pos := map[uint64]int{}
	for i, id := range ids {
		pos[id] = i + 1
	}
	if pos[endID] == 0 || pos[ddlID] == 0 || pos[endID] > pos[ddlID] {
		t.Fatalf("the DDL took effect before the import's end: %v", ids)
	}
}

// TestR13_11_TwoPhaseCrashBetweenPhases: a broadcast appends its fence copy
// on x first; the coordinator crashes (a) before the fence is acked, (b)
// after its ack is durable but before the rest is appended. Recovery goes on
// from there: every copy lands once, the rest only after the fence's ack.
func TestR13_11_TwoPhaseCrashBetweenPhases(t *testing.T) {
	for _, variant := range []string{"fence unacked", "fence acked"} {
		s := newScript(t, false, 64)
		x, y := vc(1, "x"), vc(2, "y")
		c := s.groupSend(groupCall{typ: typSync, keys: []resource.Key{collC}, targets: []message.VChannel{x, y},
			opts: []message.Option{message.WithAppendFirst(x), message.WithCopy(x, "fence", nil)}})
		isAck := func(a engine.Action) bool { return a.Kind == engine.ActWrite && a.Write.Kind == engine.WriteFirstAcks }
		s.settle(isAck)
		var id uint64
		s.c.core.View().EachLive(func(tid uint64, _ engine.State, _ engine.Stage, _ *message.Message, _ int) { id = tid })
		if got := s.copies(id); got[x] != 1 || got[y] != 0 {
			t.Fatalf("%s: first phase appended %v", variant, got)
		}
		if variant == "fence acked" {
			isAppend := func(a engine.Action) bool { return a.Kind == engine.ActAppend }
			s.consume(isAck)
			s.settle(isAppend) // the first acks become durable; the rest is not appended
			if s.stage(id) == engine.FirstPhase {
				t.Fatalf("%s: still in its first phase after the fence's ack", variant)
			}
			// Crash before the rest is appended.
		}
		s.c.crash()
		if err := s.c.start(); err != nil {
			t.Fatal(err)
		}
		s.finish()
		_ = c // its caller was lost with the crash
		// An unacked fence is appended again after the crash (R4.3: every
		// copy not checkpointed; nodes deduplicate by broadcast id); an
		// acked one is not. The rest lands (twice if its append was in
		// flight at the crash) and only after the fence's ack: the checker
		// fails a copy appended before the first acks are durable.
		got := s.copies(id)
		if got[y] == 0 || got[x] == 0 || variant == "fence acked" && got[x] != 1 {
			t.Fatalf("%s: after recovery copies %v\n%s", variant, got, s.traceTail())
		}
		if s.effect(id) != 1 {
			t.Fatalf("%s: effect applied %d times", variant, s.effect(id))
		}
	}
}

// TestR13_13_LocalOnlyOnSecondary: a secondary accepts a local-only
// broadcast (its own topology) and applies it, while it refuses a plain one.
func TestR13_13_LocalOnlyOnSecondary(t *testing.T) {
	s := newScript(t, true, 64)
	local := s.groupSend(groupCall{typ: typCreate, local: true, keys: []resource.Key{collC}, targets: []message.VChannel{vc(1, "x")}})
	plain := s.groupSend(groupCall{typ: typCreate, keys: []resource.Key{resource.ExclusiveCollection("db", "d")}, targets: []message.VChannel{vc(1, "x")}})
	s.finish()
	id := answered(t, local)
	if s.effect(id) != 1 {
		t.Fatalf("local-only broadcast applied %d times", s.effect(id))
	}
	if r := plain.result(); r == nil || !errors.Is(r.Err, engine.ErrNotPrimary) {
		t.Fatalf("a plain broadcast on a secondary: %+v, want not primary", r)
	}
}

// TestR13_2_SecondaryRunsMembersInSeqOrder: on a secondary, a replicated
// transaction's member 2 is fully acked before member 1 (whose copy on x
// comes late): the callbacks still take effect in sequence order.
func TestR13_2_SecondaryRunsMembersInSeqOrder(t *testing.T) {
	s := newScript(t, true, 64)
	member := func(id, seq uint64, kind message.GroupKind) *message.Message {
		m := replicatedMsg(id, typCreate, []message.VChannel{vc(1, "x")}, collC)
		m.Group = &message.GroupHeader{ID: 10, Seq: uint32(seq), Kind: kind}
		if kind == message.GroupBegin {
			m.Group.ID = 0
		}
		return m
	}
	begin, m1, m2, end := member(10, 0, message.GroupBegin), member(11, 1, message.GroupBody), member(12, 2, message.GroupBody),
		member(13, 3, message.GroupCommit)
	x, ctl := vc(1, "x"), begin.Broadcast.VChannels[1]
	// The control channel carries the members in sequence order, as the
	// primary appended them (one member at a time); member 1's copy on x
	// arrives last, after member 2 is fully acked.
	s.replicate(begin, x, ctl)
	s.drain()
	s.replicate(m1, ctl)
	s.drain()
	s.replicate(m2, x, ctl)
	s.drain()
	if s.effect(12) != 0 {
		t.Fatal("member 2 took effect before member 1")
	}
	s.replicate(m1, x)
	s.replicate(end, x, ctl)
	s.finish()
	var order []uint64
	for _, id := range s.applied() {
		if id >= 10 && id <= 13 {
			order = append(order, id)
		}
	}
	if fmt.Sprint(order) != "[10 11 12 13]" {
		t.Fatalf("members took effect in order %v, want [10 11 12 13]", order)
	}
}
