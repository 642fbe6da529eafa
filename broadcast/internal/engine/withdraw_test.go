package engine

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/retry"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// Event sequences against the core alone, for requests whose callers give
// up (R7.3, R11.5): no driver, no I/O but the writes a test answers by
// hand. Targets are names, so a test reads which request got which reply.

var bedType = message.Type{Name: "CreateCollection", Version: 1}

// bed steps a core and collects its replies and writes.
type bed struct {
	t       *testing.T
	c       *Core
	now     time.Time
	replies map[Target]Reply
	writes  []Write
}

func newBed(t *testing.T) *bed {
	t.Helper()
	types := message.NewRegistry()
	types.MustRegister(message.TypeInfo{Type: bedType})
	p := message.PChannel("wal-0")
	cfg := Config{
		ControlChannel: p.Control(), ControlTargets: []message.VChannel{p.Control()}, ClusterName: "east", Prefix: "walcast/",
		Types: types, MaxEntryBytes: 1 << 20, AppendConcurrency: 1,
		Backoff: retry.Policy{Initial: 10 * time.Millisecond, Multiplier: 2, Max: 200 * time.Millisecond},
		Classes: []Class{{Name: "default", MaxCount: 100, MaxLifetime: time.Hour}}, MaxKeyLength: 64,
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c, err := New(cfg, Snapshot{}, now)
	if err != nil {
		t.Fatal(err)
	}
	b := &bed{t: t, c: c, now: now, replies: map[Target]Reply{}}
	b.collect()
	return b
}

func (b *bed) step(ev Event) {
	b.t.Helper()
	b.now = b.now.Add(time.Millisecond)
	b.c.Step(b.now, ev)
	b.collect()
}

func (b *bed) collect() {
	b.t.Helper()
	for _, a := range b.c.Ready() {
		switch a.Kind {
		case ActReply:
			if _, dup := b.replies[a.Reply.To]; dup {
				b.t.Fatalf("a second reply to %v: %+v", a.Reply.To, a.Reply)
			}
			b.replies[a.Reply.To] = a.Reply
		case ActWrite:
			b.writes = append(b.writes, a.Write)
		}
	}
}

// reply returns the reply to, failing if there is none.
func (b *bed) reply(to Target) Reply {
	b.t.Helper()
	r, ok := b.replies[to]
	if !ok {
		b.t.Fatalf("no reply to %v", to)
	}
	return r
}

// none checks that to got no reply.
func (b *bed) none(to Target) {
	b.t.Helper()
	if r, ok := b.replies[to]; ok {
		b.t.Fatalf("%v was answered: %+v", to, r)
	}
}

// written answers the writes asked for so far, as applied.
func (b *bed) written() {
	b.t.Helper()
	ws := b.writes
	b.writes = nil
	for _, w := range ws {
		var rec, msg []byte
		if w.Record != nil {
			var err error
			if rec, msg, err = EncodeRecord(w.Record); err != nil {
				b.t.Fatal(err)
			}
		}
		b.step(Written{ID: w.ID, Record: rec, Message: msg})
	}
}

func (b *bed) outstanding(what string, want Outstanding) {
	b.t.Helper()
	if got := b.c.View().Outstanding(); got != want {
		b.t.Fatalf("%s: the core holds %+v, want %+v", what, got, want)
	}
}

func (b *bed) keys(ks ...resource.Key) []resource.Key {
	b.t.Helper()
	norm, err := resource.WithClusterKey(ks)
	if err != nil {
		b.t.Fatal(err)
	}
	return norm
}

// TestR7_3_WithdrawnResolveIsNeverAdmitted: the stuck key of issue 34 as
// events. A holds the key's admission slot and waits for its locks; B, the
// same request, waits for A's slot; B's caller gives up, then A's; the
// holder ends. B is never answered (its caller is gone), the slot is free,
// and the same request again is admitted at once. Before the fix, B's
// Resolve stayed among the slot's waiters and was admitted when A's slot
// went back, holding the slot for nobody.
func TestR7_3_WithdrawnResolveIsNeverAdmitted(t *testing.T) {
	b := newBed(t)
	keys := b.keys(resource.ExclusiveCollection("zz", "blocker"))
	k := message.ClusterKey("K")
	sc := ScopeOf(bedType, k)
	resolve := func(to string, h HandleID) Resolve {
		return Resolve{To: to, Handle: h, Scope: sc, Key: k, CheckNew: true}
	}
	b.step(Lock{To: "holder", Handle: 1, Keys: keys, Need: Primary})
	if !b.reply("holder").Granted {
		t.Fatal("the holder got no keys")
	}
	b.step(resolve("A.resolve", 2))
	if !b.reply("A.resolve").Admitted {
		t.Fatalf("A: %+v, want admitted", b.reply("A.resolve"))
	}
	b.step(Lock{To: "A.lock", Handle: 2, Keys: keys, Need: Primary})
	b.none("A.lock")
	b.step(resolve("B.resolve", 3))
	b.none("B.resolve")
	b.outstanding("both waiting", Outstanding{Admissions: 1, Resolving: 1, Handles: 2})

	b.step(Withdraw{To: "B.resolve", Done: "B.withdrawn"})
	if w := b.reply("B.withdrawn").Waited; w != nil {
		t.Fatalf("B waited for a task: %+v", w)
	}
	b.outstanding("B gave up", Outstanding{Admissions: 1, Handles: 2})
	b.step(Withdraw{To: "A.lock", Done: "A.withdrawn"})
	b.reply("A.withdrawn")
	b.outstanding("A gave up", Outstanding{Handles: 1})
	b.step(Close{Handle: 1})
	b.outstanding("the holder ended", Outstanding{})
	b.none("B.resolve")
	b.none("A.lock")

	b.step(resolve("C.resolve", 4))
	if !b.reply("C.resolve").Admitted {
		t.Fatalf("the request again: %+v, want admitted", b.reply("C.resolve"))
	}
	b.step(Lock{To: "C.lock", Handle: 4, Keys: keys, Need: Primary})
	if !b.reply("C.lock").Granted {
		t.Fatalf("the request again: %+v, want its keys", b.reply("C.lock"))
	}
	// Withdrawing what was answered changes nothing.
	b.step(Withdraw{To: "C.lock", Done: "C.withdrawn"})
	b.reply("C.withdrawn")
	b.outstanding("C holds its slot and keys", Outstanding{Admissions: 1, Handles: 1})
}

// TestR11_5_WithdrawnWaitersLeaveTheTask: a Submit whose caller gives up
// while its id is allocated goes on, unanswered; a duplicate and a wait for
// acks whose callers give up leave the task's waiters; each withdrawal says
// what the request waited for.
func TestR11_5_WithdrawnWaitersLeaveTheTask(t *testing.T) {
	b := newBed(t)
	keys := b.keys(resource.ExclusiveCollection("db", "c"))
	k := message.ClusterKey("K")
	sc := ScopeOf(bedType, k)
	b.step(Resolve{To: "A.resolve", Handle: 1, Scope: sc, Key: k, CheckNew: true})
	b.step(Lock{To: "A.lock", Handle: 1, Keys: keys, Need: Primary})
	if !b.reply("A.lock").Granted {
		t.Fatal("A got no keys")
	}
	v := message.VChannel("wal-0/c")
	m, err := message.NewBroadcast(bedType, []byte("p"), []message.VChannel{v}, message.WithIdempotencyKey(k))
	if err != nil {
		t.Fatal(err)
	}
	m, err = m.Stamp(1, message.PChannel("wal-0").Control(), keys)
	if err != nil {
		t.Fatal(err)
	}
	m.Broadcast.ID = 0
	raw, err := message.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	b.step(Submit{To: "A.submit", Handle: 1, Msg: m, Bytes: raw})
	if len(b.writes) != 1 || b.writes[0].Kind != WriteIDs {
		t.Fatalf("writes %+v, want the id block's", b.writes)
	}
	b.step(Withdraw{To: "A.submit", Done: "A.withdrawn"})
	if w := b.reply("A.withdrawn").Waited; w == nil || w.ID != 0 {
		t.Fatalf("A waited for %+v, want its id", w)
	}
	b.written() // the id block: the task is created and persisted, unanswered
	id := m.Broadcast.ID
	if id == 0 || b.c.tasks[id] == nil {
		t.Fatal("the submitted broadcast was not created")
	}
	b.outstanding("A gave up", Outstanding{})

	b.step(Resolve{To: "D.resolve", Handle: 2, Scope: sc, Key: k})
	o := b.reply("D.resolve").Original
	if o == nil || o.ID != id || !o.Live {
		t.Fatalf("the duplicate: %+v, want live original %d", b.reply("D.resolve"), id)
	}
	b.step(Wait{To: "D.wait", ID: id})
	b.step(WaitAcked{To: "W.acked", ID: id, VChannels: []message.VChannel{v}})
	b.outstanding("two waiting", Outstanding{TaskWaiters: 2})
	for _, to := range []string{"D.wait", "W.acked"} {
		b.step(Withdraw{To: to, Done: to + ".withdrawn"})
		if w := b.reply(to + ".withdrawn").Waited; w == nil || w.ID != id || w.Stage != Persisting {
			t.Fatalf("%s waited for %+v, want broadcast %d persisting", to, w, id)
		}
	}
	b.outstanding("both gave up", Outstanding{})
	// The broadcast goes on: its PENDING record is durable, its copies go
	// out.
	b.written()
	if st := b.c.tasks[id].stage; st == Persisting {
		t.Fatalf("broadcast %d still %s", id, st)
	}
	for _, to := range []string{"A.submit", "D.wait", "W.acked"} {
		b.none(to)
	}
}

// TestR11_5_AckWaitOnATaskNeverCreatedIsAnswered: a wait for the acks of a
// broadcast whose PENDING record is refused is answered with the reason,
// as the broadcast's own caller is, instead of waiting for ever (the
// simulator's seed 9332).
func TestR11_5_AckWaitOnATaskNeverCreatedIsAnswered(t *testing.T) {
	b := newBed(t)
	keys := b.keys(resource.ExclusiveCollection("db", "c"))
	b.step(Lock{To: "A.lock", Handle: 1, Keys: keys, Need: Primary})
	v := message.VChannel("wal-0/c")
	m, err := message.NewBroadcast(bedType, []byte("p"), []message.VChannel{v})
	if err != nil {
		t.Fatal(err)
	}
	if m, err = m.Stamp(1, message.PChannel("wal-0").Control(), keys); err != nil {
		t.Fatal(err)
	}
	m.Broadcast.ID = 0
	raw, err := message.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	b.step(Submit{To: "A.submit", Handle: 1, Msg: m, Bytes: raw})
	b.written() // the id block
	id := m.Broadcast.ID
	if id == 0 || len(b.writes) != 1 || b.writes[0].Kind != WritePending {
		t.Fatalf("broadcast %d, writes %+v: want its PENDING record's", id, b.writes)
	}
	b.step(WaitAcked{To: "W.acked", ID: id, VChannels: []message.VChannel{v}})
	b.none("W.acked")
	w := b.writes[0]
	b.writes = nil
	b.step(Written{ID: w.ID, Err: fmt.Errorf("refused: %w", catalog.ErrNotApplied)})
	for _, to := range []string{"A.submit", "W.acked"} {
		if err := b.reply(to).Err; !errors.Is(err, ErrTaskNotCreated) {
			t.Fatalf("%s: %v, want ErrTaskNotCreated", to, err)
		}
	}
	b.outstanding("the task was never created", Outstanding{})
}
