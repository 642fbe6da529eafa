package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// Scenarios run exactly on the decision core, each named after the
// requirement of docs/spec.md it checks.

// rewriteRecord rewrites task id's record in the catalog with change
// applied to its message, as corrupt metadata would hold it.
func (s *script) rewriteRecord(id uint64, change func(m *message.Message)) {
	s.t.Helper()
	ctx := context.Background()
	key := engine.TaskKey(prefix, id)
	raw, err := s.c.cat.Get(ctx, key)
	if err != nil {
		s.t.Fatal(err)
	}
	rec, err := engine.DecodeRecord(raw)
	if err != nil {
		s.t.Fatal(err)
	}
	change(rec.Msg)
	out, _, err := engine.EncodeRecord(&engine.RecordSpec{ID: id, Key: key, State: rec.State, Msg: rec.Msg, Created: rec.Created,
		Completed: rec.Completed, Acked: rec.Acked, Checkpoints: rec.Checkpoints, HoldsKeys: rec.HoldsKeys})
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.c.cat.Commit(ctx, catalog.Put(key, out)); err != nil {
		s.t.Fatal(err)
	}
}

// TestR13_1_RecoveryRefusesMemberOffItsGroup: recovery meets a pending
// member of an open transaction whose keys, or targets, are not its
// Begin's: the catalog is corrupt (ErrCorruptCatalog), and nothing starts
// on it.
func TestR13_1_RecoveryRefusesMemberOffItsGroup(t *testing.T) {
	for _, variant := range []string{"keys", "targets"} {
		s := newScript(t, false, 64)
		gid := s.begin("b")
		m := s.member(gid, message.GroupBody, "m1")
		s.settle(holdCallbacks)
		var id uint64
		s.c.core.View().EachLive(func(tid uint64, _ engine.State, _ engine.Stage, _ *message.Message, _ int) { id = tid })
		if id == 0 || m.submit == nil {
			t.Fatalf("%s: no pending member", variant)
		}
		s.rewriteRecord(id, func(m *message.Message) {
			if variant == "keys" {
				m.Broadcast.ResourceKeys, _ = resource.WithClusterKey([]resource.Key{resource.ExclusiveCollection("db", "other")})
			} else {
				m.Broadcast.VChannels = append([]message.VChannel{vc(3, "z")}, m.Broadcast.VChannels...)
			}
		})
		s.c.crash()
		if err := s.c.start(); !errors.Is(err, engine.ErrCorruptCatalog) {
			t.Fatalf("%s: recovery with a member off its group: %v, want ErrCorruptCatalog", variant, err)
		}
	}
}

// TestR13_1_SecondaryRefusesMalformedMembers: a live secondary validates
// every replicated group message against its group before it creates
// anything (R13.1, R13.2): a member whose keys or targets are not its
// Begin's, a body of an owner, a member without its group's id or with seq
// 0, a member naming another owner key — each ack is refused with
// ErrInvalidArgument and no task is created, so the secondary's catalog
// never holds what its recovery would call corrupt: it restarts, and the
// group's well-formed members run.
func TestR13_1_SecondaryRefusesMalformedMembers(t *testing.T) {
	s := newScript(t, true, 64)
	x := vc(1, "x")
	begin := replicatedMsg(10, typCreate, []message.VChannel{x}, collC)
	begin.Group = &message.GroupHeader{Kind: message.GroupBegin}
	s.replicate(begin, begin.Broadcast.VChannels...)
	s.drain()
	if _, ok := s.c.core.View().Group(10); !ok {
		t.Fatal("the replicated Begin opened no group")
	}
	member := func(id uint64, h message.GroupHeader, keys []resource.Key, targets ...message.VChannel) *message.Message {
		m := replicatedMsg(id, typCreate, targets, keys...)
		m.Group = &h
		return m
	}
	other := resource.ExclusiveCollection("db", "other")
	bad := map[string]*message.Message{
		"other keys":      member(11, message.GroupHeader{ID: 10, Seq: 1, Kind: message.GroupBody}, []resource.Key{other}, x),
		"other targets":   member(12, message.GroupHeader{ID: 10, Seq: 1, Kind: message.GroupBody}, []resource.Key{collC}, vc(2, "y")),
		"no group id":     member(13, message.GroupHeader{Seq: 1, Kind: message.GroupBody}, []resource.Key{collC}, x),
		"seq 0":           member(14, message.GroupHeader{ID: 10, Kind: message.GroupBody}, []resource.Key{collC}, x),
		"owner key":       member(15, message.GroupHeader{ID: 10, Seq: 1, Kind: message.GroupCommit, OwnerKey: "own/9"}, []resource.Key{collC}, x),
		"begin as member": member(16, message.GroupHeader{ID: 10, Seq: 1, Kind: message.GroupBegin}, []resource.Key{collC}, x),
	}
	for name, m := range bad {
		x := s.ack(m, m.Broadcast.VChannels[len(m.Broadcast.VChannels)-1], 500+m.Broadcast.ID)
		if x.reply == nil || !errors.Is(x.reply.Err, engine.ErrInvalidArgument) {
			t.Fatalf("%s: ack answered %+v, want ErrInvalidArgument", name, x.reply)
		}
		if _, _, _, ok := s.c.core.View().TaskByID(m.Broadcast.ID); ok {
			t.Fatalf("%s: a task was created for a malformed member", name)
		}
	}
	s.restart()
	good := member(17, message.GroupHeader{ID: 10, Seq: 1, Kind: message.GroupCommit}, []resource.Key{collC}, x)
	s.replicate(good, good.Broadcast.VChannels...)
	s.finish()
	if s.effect(17) != 1 {
		t.Fatalf("the well-formed commit applied %d times", s.effect(17))
	}
	if _, ok := s.c.core.View().Group(10); ok {
		t.Fatal("the group is still open after its commit")
	}
}

// replicatedMember is a replicated member of group gid at seq on x.
func replicatedMember(id, gid uint64, seq uint32, kind message.GroupKind) *message.Message {
	m := replicatedMsg(id, typCreate, []message.VChannel{vc(1, "x")}, collC)
	m.Group = &message.GroupHeader{ID: gid, Seq: seq, Kind: kind}
	if kind == message.GroupBegin {
		m.Group.ID, m.Group.Seq = 0, 0
	}
	return m
}

// TestR13_5_PromoteWithAMemberMissing: a secondary holds an open
// replicated transaction whose member 2 arrived and member 1 never did (a
// type replication skips, say). A force promote never applies member 2's
// effect without member 1's: one that finds the gap is refused
// (FailedPrecondition, naming it) and leaves nothing held; a gap that
// appears once the promote started (member 2's ack lands after the
// promote's check) ends member 2 ignored, without its callback.
func TestR13_5_PromoteWithAMemberMissing(t *testing.T) {
	begin, m2 := replicatedMember(10, 10, 0, message.GroupBegin), replicatedMember(12, 10, 2, message.GroupBody)
	s := newScript(t, true, 64)
	s.replicate(begin, begin.Broadcast.VChannels...)
	s.replicate(m2, m2.Broadcast.VChannels...)
	s.drain()
	p := s.promote()
	s.drain()
	if r := p.result(); r == nil || !errors.Is(r.Err, engine.ErrFailedPrecondition) {
		t.Fatalf("promote with member 1 missing: %+v, want refused (FailedPrecondition)", r)
	}
	if s.effect(12) != 0 {
		t.Fatal("member 2 took effect without member 1")
	}
	if ks := s.c.core.View().Locks(); len(ks) != 0 {
		t.Fatalf("the refused promote left keys held: %+v", ks)
	}

	s = newScript(t, true, 64)
	s.replicate(begin, begin.Broadcast.VChannels...)
	s.drain()
	s.replicate(m2, m2.Broadcast.VChannels...) // in the WAL, not acked yet
	p = s.promote()
	s.settle(nil)
	if p.submit == nil || p.submit.reply != nil {
		t.Fatalf("the promote did not start: %+v", p.result())
	}
	s.drain()
	if r := p.result(); r == nil || r.Err != nil {
		t.Fatalf("promote: %+v\n%s", r, s.w.state())
	}
	if s.effect(12) != 0 {
		t.Fatal("member 2 took effect without member 1")
	}
	if _, rec, _, ok := s.c.core.View().TaskByID(12); !ok || rec == "" {
		t.Fatal("member 2 did not complete")
	} else if r, err := engine.DecodeRecord([]byte(rec)); err != nil || r.Outcome.Status != engine.Ignored {
		t.Fatalf("member 2 ended %+v (%v), want ignored", r.Outcome, err)
	}
}

// TestR13_5_BeginDuringPromote: transaction Begins that arrive while a
// force promote runs are refused (not primary yet), never admitted half
// way and never left holding keys; once the promote is done a Begin opens
// its group and its end releases it.
func TestR13_5_BeginDuringPromote(t *testing.T) {
	s := newScript(t, true, 64)
	p := s.promote()
	s.settle(nil) // the promote's copies are appended, not acked
	if p.submit == nil || p.submit.reply != nil {
		t.Fatalf("the promote did not start: %+v", p.result())
	}
	during := s.groupSend(groupCall{typ: typCreate, key: "b1", keys: []resource.Key{collC}, group: &message.GroupHeader{Kind: message.GroupBegin},
		targets: []message.VChannel{vc(1, "x")}})
	s.settle(nil)
	if r := during.result(); r == nil || !errors.Is(r.Err, engine.ErrNotPrimary) {
		t.Fatalf("a Begin during the promote: %+v, want ErrNotPrimary", r)
	}
	for _, ks := range s.c.core.View().Locks() {
		if ks.Domain != resource.Cluster || len(ks.Waiters) > 0 {
			t.Fatalf("a refused Begin left %+v in the lock table", ks)
		}
	}
	if len(s.c.core.View().Requests()) != 0 || len(s.c.core.View().Groups()) != 0 {
		t.Fatalf("a refused Begin left %+v, groups %+v", s.c.core.View().Requests(), s.c.core.View().Groups())
	}
	s.drain()
	if r := p.result(); r == nil || r.Err != nil {
		t.Fatalf("promote: %+v", r)
	}
	gid := s.begin("b2")
	end := s.member(gid, message.GroupCommit, "end")
	s.finish()
	answered(t, end)
	if len(s.c.core.View().Groups()) != 0 || len(s.c.core.View().Locks()) != 0 {
		t.Fatalf("after the commit: groups %+v, locks %+v", s.c.core.View().Groups(), s.c.core.View().Locks())
	}
}

// TestR13_12_ReplicatedExtraSurvivesRestartAndPromote: on a secondary, a
// replicated two-phase broadcast's first copy is acked with an extra: the
// extra is persisted with the ack, is there after a restart, and is in the
// task's TOMBSTONE once a force promote finishes it.
func TestR13_12_ReplicatedExtraSurvivesRestartAndPromote(t *testing.T) {
	s := newScript(t, true, 64)
	x, y := vc(1, "x"), vc(2, "y")
	m := replicatedMsg(20, typSync, []message.VChannel{x, y}, collC)
	m.Broadcast.AppendFirst = []message.VChannel{x}
	m.Broadcast.AckSyncUp = true
	s.replicate(m, x, m.Broadcast.VChannels[2])
	ack := func(v message.VChannel, pos uint64, extra []byte) {
		a := engine.Ack{ID: 20, VChannel: v, Msg: m, Extra: extra, Checkpoint: wal.Checkpoint{MessageID: pos, TimeTick: pos, LastConfirmed: pos}}
		x := s.send(a, "ack")
		s.settle(nil)
		if x.reply == nil || x.reply.Err != nil {
			t.Fatalf("ack of %s: %+v", v, x.reply)
		}
	}
	ack(m.Broadcast.VChannels[2], 100, nil)
	ack(x, 101, []byte("rows=5"))
	extraOn := func(when string) {
		live, _, _, ok := s.c.core.View().TaskByID(20)
		if !ok || live == nil {
			t.Fatalf("%s: task 20 is not live", when)
		}
		if got := string(live.Copies[0].Extra); got != "rows=5" {
			t.Fatalf("%s: the first copy's extra is %q", when, got)
		}
	}
	extraOn("before a restart")
	s.restart()
	extraOn("after a restart")
	p := s.promote()
	s.drain()
	if r := p.result(); r == nil || r.Err != nil {
		t.Fatalf("promote: %+v", r)
	}
	_, raw, _, ok := s.c.core.View().TaskByID(20)
	if !ok || raw == "" {
		t.Fatal("task 20 did not complete with the promote")
	}
	rec, err := engine.DecodeRecord([]byte(raw))
	if err != nil || len(rec.Extras) == 0 || string(rec.Extras[0]) != "rows=5" {
		t.Fatalf("the TOMBSTONE's extras: %q (%v)", rec.Extras, err)
	}
}

// TestR13_1_MemberHandleClosedUnsubmitted: a member's handle that takes its
// shared Cluster key and is closed without a Submit changes nothing: the
// group stays open with its keys, the next member joins it, its end
// releases it, and no handle or admission slot is left.
func TestR13_1_MemberHandleClosedUnsubmitted(t *testing.T) {
	s := newScript(t, false, 64)
	gid := s.begin("txn")
	h := s.w.newHandle()
	key := message.ClusterKey("m1")
	mustOK(t, s.send(engine.Resolve{Handle: h, Scope: engine.ScopeOf(typCreate, key), Key: key, CheckNew: true}, "resolve"))
	mustOK(t, s.send(engine.Lock{Handle: h, Keys: []resource.Key{resource.SharedCluster()}, Need: engine.Primary}, "lock"))
	s.c.step(engine.Close{Handle: h})
	if g, ok := s.c.core.View().Group(gid); !ok || !g.HoldsHere {
		t.Fatalf("after a member's handle closed unused the group is %+v (open %v)", g, ok)
	}
	b := s.member(gid, message.GroupBody, "m1")
	s.settle(nil)
	answered(t, b)
	end := s.member(gid, message.GroupCommit, "end")
	s.finish()
	answered(t, end)
	if rs := s.c.core.View().Requests(); len(rs) != 0 {
		t.Fatalf("left in the core: %+v", rs)
	}
}

// TestR13_3_CompetingEndsWithAckSyncUp: two commits of an AckSyncUp type
// race to end a transaction: the first wins, the second joins it and gets
// its answer once the consumers acked the end and its TOMBSTONE is
// durable; one end's effect, and the keys go back.
func TestR13_3_CompetingEndsWithAckSyncUp(t *testing.T) {
	s := newScript(t, false, 64)
	gid := s.begin("txn")
	g, _ := s.c.core.View().Group(gid)
	end := func(key message.IdempotencyKey) *call {
		return s.groupSend(groupCall{typ: typSync, key: key, gid: gid, stamp: g.Keys, targets: g.Targets[:len(g.Targets)-1],
			group: &message.GroupHeader{Kind: message.GroupCommit}})
	}
	c1, c2 := end("c1"), end("c2")
	s.settle(nil)
	if c1.result() != nil || c2.result() != nil {
		t.Fatal("an AckSyncUp end was answered before its consumers acked it")
	}
	s.finish()
	first, second := answered(t, c1), answered(t, c2)
	if first != second {
		t.Fatalf("the commits were answered by %d and %d: two ends of one group", first, second)
	}
	if s.effect(first) != 1 {
		t.Fatalf("the end applied %d times", s.effect(first))
	}
	if len(s.c.core.View().Locks()) != 0 {
		t.Fatalf("keys held after the end: %+v", s.c.core.View().Locks())
	}
}

// TestR13_3_OneGCWriteForAGroup: once a finished transaction's window
// passed, one catalog transaction deletes all its records (its Begin, its
// bodies and its end) together.
func TestR13_3_OneGCWriteForAGroup(t *testing.T) {
	s := newScript(t, false, 64)
	gid := s.begin("txn")
	var ids []uint64
	for _, k := range []message.IdempotencyKey{"b1", "b2"} {
		b := s.member(gid, message.GroupBody, k)
		s.settle(nil)
		ids = append(ids, answered(t, b))
	}
	end := s.member(gid, message.GroupCommit, "end")
	s.finish()
	ids = append(ids, gid, answered(t, end))
	s.w.now = s.w.now.Add(48 * s.c.cfg.CheckInterval)
	var writes [][]string
	for range 50 {
		s.c.step(engine.Tick{})
		for _, o := range s.c.ops {
			if w := o.a.Write; o.a.Kind == engine.ActWrite && w.Kind == engine.WriteGC {
				var keys []string
				for _, op := range w.Ops {
					keys = append(keys, op.Key)
				}
				writes = append(writes, keys)
			}
		}
		s.settle(nil)
	}
	together := false
	for _, w := range writes {
		n := 0
		for _, id := range ids {
			for _, k := range w {
				if k == engine.TaskKey(prefix, id) {
					n++
				}
			}
		}
		if n != 0 && n != len(ids) {
			t.Fatalf("a GC write deleted %d of the group's %d records: %v", n, len(ids), w)
		}
		together = together || n == len(ids)
	}
	if !together {
		t.Fatalf("no GC write deleted the group's records: %v", writes)
	}
	for _, id := range ids {
		if _, _, _, ok := s.c.core.View().TaskByID(id); ok {
			t.Fatalf("broadcast %d of the group still remembered", id)
		}
	}
}

// TestR13_2_RecoveryInAnyRecordOrder: a catalog that lists an open
// transaction's records in another order than their keys' (as a catalog
// other than the in-memory one may) recovers the same group, and its
// members go on in sequence order.
func TestR13_2_RecoveryInAnyRecordOrder(t *testing.T) {
	s := newScript(t, false, 64)
	gid := s.begin("txn")
	for _, k := range []message.IdempotencyKey{"b1", "b2"} {
		s.member(gid, message.GroupBody, k)
		s.settle(nil)
	}
	before, _ := s.c.core.View().Group(gid)
	s.c.crash()
	s.c.reverseSnapshot = true
	if err := s.c.start(); err != nil {
		t.Fatal(err)
	}
	s.c.reverseSnapshot = false
	after, ok := s.c.core.View().Group(gid)
	if !ok || fmt.Sprint(after.Members) != fmt.Sprint(before.Members) || !after.HoldsHere {
		t.Fatalf("recovered in reverse order: %+v, before %+v", after, before)
	}
	end := s.member(gid, message.GroupCommit, "end")
	s.finish()
	answered(t, end)
}

// promoteTask returns the id of the live force promote (0 if none).
func (s *script) promoteTask() uint64 { return s.c.core.View().PromoteTask() }

// TestR8_3_PromoteCrashBeforeItsTombstone: the promoting coordinator
// crashes once every supplement finished and the promote's own callback
// ran, before its TOMBSTONE is durable. Recovery finishes the promote once:
// the cluster becomes primary, no supplement is appended again, the
// supplemented task's effect is applied once (#123).
func TestR8_3_PromoteCrashBeforeItsTombstone(t *testing.T) {
	s := newScript(t, true, 64)
	m := replicatedMsg(10, typCreate, []message.VChannel{vc(1, "x")}, collC)
	s.replicate(m, m.Broadcast.VChannels[1])
	s.consume(nil) // the control copy acked; x never arrived
	s.promote()
	holdPromoteTomb := func(a engine.Action) bool {
		w := a.Write
		return a.Kind == engine.ActWrite && w.Kind == engine.WriteTombstone && w.Task != 0 && w.Task == s.promoteTask()
	}
	for range 20 {
		s.settle(holdPromoteTomb)
		s.consume(holdPromoteTomb)
	}
	id := s.promoteTask()
	if id == 0 || s.stage(id) != engine.Tombstoning {
		t.Fatalf("the promote is %s, want its TOMBSTONE held", s.stage(id))
	}
	if r, _ := s.c.core.View().Role(); r != engine.Secondary {
		t.Fatalf("role %s before the promote's TOMBSTONE", r)
	}
	s.c.crash()
	if err := s.c.start(); err != nil {
		t.Fatal(err)
	}
	s.drain()
	if r, _ := s.c.core.View().Role(); r != engine.Primary {
		t.Fatalf("role %s after the resumed promote", r)
	}
	if got := s.copies(10); got[vc(1, "x")] != 1 {
		t.Fatalf("supplements of 10: %v, want x once", got)
	}
	if s.effect(10) != 1 {
		t.Fatalf("effect of 10 applied %d times", s.effect(10))
	}
	s.finish()
}

// TestR13_11_PromoteOfATwoPhaseTask: a secondary holds a replicated
// two-phase broadcast whose first phase landed there (its first copy acked)
// and whose second did not. The promote appends only the second phase,
// once — also when it crashes in the middle and resumes (#103, #104) — and
// the broadcast completes.
func TestR13_11_PromoteOfATwoPhaseTask(t *testing.T) {
	for _, crash := range []bool{false, true} {
		s := newScript(t, true, 64)
		x, y := vc(1, "x"), vc(2, "y")
		m := replicatedMsg(20, typCreate, []message.VChannel{x, y}, collC)
		m.Broadcast.AppendFirst = []message.VChannel{x}
		s.replicate(m, x, m.Broadcast.VChannels[2])
		s.drain()
		s.promote()
		isAppend := func(a engine.Action) bool {
			if a.Kind != engine.ActAppend {
				return false
			}
			for _, it := range a.Append.Items {
				if slices.Contains(it.VChannels, y) {
					return true
				}
			}
			return false
		}
		if crash {
			for range 10 {
				s.settle(isAppend)
				s.consume(isAppend)
			}
			// The supplement of y is in flight: it lands, and the core
			// crashes before it hears.
			for _, o := range s.c.ops {
				if isAppend(o.a) {
					s.c.append(o.a.Append)
				}
			}
			s.c.crash()
			if err := s.c.start(); err != nil {
				t.Fatal(err)
			}
		}
		s.finish()
		if r, _ := s.c.core.View().Role(); r != engine.Primary {
			t.Fatalf("crash %v: role %s after the promote", crash, r)
		}
		if got := s.copies(20); got[x] != 0 || got[y] != 1 {
			t.Fatalf("crash %v: supplements of 20: %v, want y once and x not again", crash, got)
		}
		if s.effect(20) != 1 {
			t.Fatalf("crash %v: effect of 20 applied %d times", crash, s.effect(20))
		}
	}
}

// TestR13_8_RenameBehindAnOwnerWhoseEndRetries: while an import owns
// collection c, a rename of c queues for its keys; the import's end is
// created but its callback keeps failing and is retried. The rename never
// overtakes it: it gets the keys only once the end's TOMBSTONE released
// the ownership, and takes effect after the end (#78).
func TestR13_8_RenameBehindAnOwnerWhoseEndRetries(t *testing.T) {
	s := newScript(t, false, 64)
	gid := s.ownerOn("import/78")
	rename := s.groupSend(groupCall{typ: typCreate, keys: []resource.Key{collC}, targets: []message.VChannel{vc(2, "y")}})
	s.settle(nil)
	if rename.submit != nil {
		t.Fatal("the rename did not wait for the owner")
	}
	end := s.endOwner("import/78", gid, typEnd, message.GroupCommit)
	s.settle(holdCallbacks)
	g, ok := s.c.core.View().Group(gid)
	if !ok || g.Ending == 0 {
		t.Fatalf("the import's end was not created: %+v", g)
	}
	s.w.failing[g.Ending] = 5
	for range 3 {
		s.settle(func(a engine.Action) bool { return a.Kind == engine.ActCallback && s.w.failing[g.Ending] <= 2 })
		if rename.submit != nil {
			t.Fatal("the rename got the keys while the import's end was retried")
		}
	}
	s.finish()
	if n := s.w.failing[g.Ending]; n != 0 {
		t.Fatalf("the end's callback failed %d times, want 5", 5-n)
	}
	endID, renameID := answered(t, end), answered(t, rename)
	order := s.applied()
	if i, j := slices.Index(order, endID), slices.Index(order, renameID); i < 0 || j < 0 || j < i {
		t.Fatalf("effects in order %v: the rename (%d) before the import's end (%d)", order, renameID, endID)
	}
}

// TestR7_3_WaiterResolvesToTheOriginalBeingCreated: a retry with a key
// whose first request holds the admission slot waits for it; when the
// first request's task is created, the retry is answered with it as its
// original, never admitted as the key's first. (It was admitted: the slot
// was freed before the task was indexed. A retried transaction Begin then
// waited for the keys of the transaction it should have joined, for ever:
// seed 383 of the driven runs.)
func TestR7_3_WaiterResolvesToTheOriginalBeingCreated(t *testing.T) {
	s := newScript(t, false, 64)
	key := message.ClusterKey("k")
	sc := engine.ScopeOf(typCreate, key)
	first := s.w.newHandle()
	mustOK(t, s.send(engine.Resolve{Handle: first, Scope: sc, Key: key, CheckNew: true}, "first/resolve"))
	norm, _ := resource.WithClusterKey([]resource.Key{collC})
	mustOK(t, s.send(engine.Lock{Handle: first, Keys: norm, Need: engine.Primary}, "first/lock"))
	retry := s.send(engine.Resolve{Handle: s.w.newHandle(), Scope: sc, Key: key, CheckNew: true}, "retry/resolve")
	if retry.reply != nil {
		t.Fatalf("the retry did not wait for the first request's slot: %+v", retry.reply)
	}
	m, _ := message.NewBroadcast(typCreate, []byte("p"), []message.VChannel{vc(1, "x")}, message.WithIdempotencyKey(key))
	st, raw, _ := stampForSubmit(s.c, m, norm)
	s.send(engine.Submit{Handle: first, Msg: st, Bytes: raw}, "first/submit")
	s.settle(holdCallbacks) // its id is allocated, its task created
	if retry.reply == nil || retry.reply.Original == nil || retry.reply.Admitted {
		t.Fatalf("the retry once the first request's task was created: %+v, want its original", retry.reply)
	}
	s.finish()
}
