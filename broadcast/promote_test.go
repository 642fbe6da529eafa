package broadcast_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/broadcast/internal/crash"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/node"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// liveAcker acks to whichever broadcaster is current, as nodes ack to the
// leading coordinator.
type liveAcker struct {
	mu   sync.Mutex
	b    *broadcast.Broadcaster
	drop func(broadcast.Ack) bool // acks a lagging node has not sent yet
	// fail makes acks fail (the node retries them): a node that cannot
	// reach the coordinator yet.
	fail func(broadcast.Ack) bool
}

func (a *liveAcker) set(b *broadcast.Broadcaster) {
	a.mu.Lock()
	a.b = b
	a.mu.Unlock()
}

func (a *liveAcker) Ack(ctx context.Context, ack broadcast.Ack) error {
	a.mu.Lock()
	b, drop, fail := a.b, a.drop, a.fail
	a.mu.Unlock()
	if drop != nil && drop(ack) {
		return nil
	}
	if fail != nil && fail(ack) {
		return errors.New("test: node cannot reach the coordinator yet")
	}
	return b.Ack(ctx, ack)
}

// nopApplier applies nothing; the node still acks every copy.
type nopApplier struct{}

func (nopApplier) Apply(context.Context, wal.Copy) error     { return nil }
func (nopApplier) Snapshot(message.PChannel) ([]byte, error) { return nil, nil }
func (nopApplier) Restore(message.PChannel, []byte) error    { return nil }
func startNode(t *testing.T, e *env, acker node.Acker) *node.Node {
	t.Helper()
	n, err := node.New(node.Config{Name: "n", WAL: wal.New(e.log), PChannels: pchans, Applier: nopApplier{}, Acker: acker,
		StateDir: t.TempDir(), Backoff: broadcast.Backoff{Initial: time.Millisecond, Multiplier: 2, Max: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// promoteEnv is a secondary with nodes consuming its WAL, and replicated
// tasks in various states of completion.
type promoteEnv struct {
	*env
	acker *liveAcker
	b     *broadcast.Broadcaster
}

func newPromoteEnv(t *testing.T, mod ...func(*broadcast.Config)) *promoteEnv {
	e := newEnv(t)
	b := e.open(append(mod, func(c *broadcast.Config) { c.PChannels = pchans })...)
	e.secondary(b)
	acker := &liveAcker{b: b}
	startNode(t, e, acker)
	return &promoteEnv{env: e, acker: acker, b: b}
}

// replicate creates a replicated task whose copies on the given vchannels
// were acked (the rest never arrived before the primary was lost).
func (p *promoteEnv) replicate(t *testing.T, m *message.Message, acked ...message.VChannel) {
	t.Helper()
	for i, v := range acked {
		if err := p.b.Ack(ctxT(t, 5*time.Second), ackOf(m, v, uint64(1000*m.Broadcast.ID)+uint64(i))); err != nil {
			t.Fatal(err)
		}
	}
}

// copiesOf counts, per vchannel, the copies of broadcast id in the WAL
// that carry no replicate header (appended by this cluster).
func (p *promoteEnv) copiesOf(id uint64) map[message.VChannel]int {
	out := map[message.VChannel]int{}
	for _, pc := range pchans {
		for off, data := range p.log.Entries(pc) {
			cs, _ := wal.Decode(uint64(off), data)
			for _, c := range cs {
				if c.Message.Broadcast.ID == id && c.Message.Replicate == nil {
					out[c.VChannel]++
				}
			}
		}
	}
	return out
}

// TestR8_3_ForcePromoteNoIncompleteTasks: promote on a quiet secondary; the
// cluster becomes primary, DDL is accepted and replicated acks are fenced.
func TestR8_3_ForcePromoteNoIncompleteTasks(t *testing.T) {
	p := newPromoteEnv(t)
	ctx := ctxT(t, 20*time.Second)
	if _, err := do(ctx, p.b, msgOf(t, typCreate, "x", []message.VChannel{vch(1, "a")})); !errors.Is(err, broadcast.ErrNotPrimary) {
		t.Fatalf("DDL on the secondary: %v", err)
	}
	res, err := p.b.ForcePromote(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.b.Role() != broadcast.Primary || p.b.ReplicateConfig().Primary != "walcast" {
		t.Fatalf("role %s, config %+v after promote", p.b.Role(), p.b.ReplicateConfig())
	}
	if len(res.Appends) != len(pchans) {
		t.Fatalf("promote acked on %d pchannels", len(res.Appends))
	}
	if _, err := p.b.ForcePromote(ctx); !errors.Is(err, broadcast.ErrNotSecondary) {
		t.Fatalf("second promote: %v, want ErrNotSecondary", err)
	}
	if _, err := do(ctx, p.b, msgOf(t, typCreate, "x", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c")); err != nil {
		t.Fatalf("DDL after promote: %v", err)
	}
	late := replicated(500, typCreate, []message.VChannel{vch(1, "z")})
	if err := p.b.Ack(ctx, ackOf(late, cchan, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.b.Task(500); !errors.Is(err, broadcast.ErrNotFound) {
		t.Fatal("a replicated copy created a task after the promote (fence broken)")
	}
	// The role survives a restart.
	_ = p.b.Close()
	b := p.open()
	if b.Role() != broadcast.Primary {
		t.Fatal("promoted role lost on restart")
	}
}

// TestR8_3_ForcePromoteSupplementsIncompleteTasks covers the reference's
// scenarios: tasks missing copies are supplemented on exactly the missing
// vchannels without the replicate header, in broadcast-id order, each
// completing before the next; a stale replicated AlterReplicateConfig is
// ignored; fully acked tasks are not re-appended.
func TestR8_3_ForcePromoteSupplementsIncompleteTasks(t *testing.T) {
	p := newPromoteEnv(t)
	ctx := ctxT(t, 20*time.Second)
	// Enrolled first (control channel order), complete already.
	full := replicated(5, typCreate, []message.VChannel{vch(2, "w")}, resource.ExclusiveCollection("db", "e"))
	p.replicate(t, full, cchan, vch(2, "w"))
	waitFor(t, "the complete task's callback", func() bool { ti, _ := p.b.Task(5); return ti.State == broadcast.Tombstone })
	drop := replicated(10, typDrop, []message.VChannel{vch(1, "x"), vch(2, "y")}, resource.ExclusiveCollection("db", "c"))
	p.replicate(t, drop, cchan) // control channel acked, v1 and v2 missing
	staleCfg := &message.Message{Type: broadcast.AlterReplicateConfig, Payload: []byte(`{"primary":"upstream"}`),
		Broadcast: message.BroadcastHeader{ID: 20, VChannels: []message.VChannel{"wal-0/_control", "wal-1/_control", "wal-2/_control", "wal-3/_control"},
			ResourceKeys: []resource.Key{resource.ExclusiveCluster()}},
		Replicate: &message.ReplicateHeader{SourceCluster: "upstream"}}
	p.replicate(t, staleCfg, "wal-0/_control") // wal-1..3 missing
	create := replicated(30, typCreate, []message.VChannel{vch(3, "z")}, resource.ExclusiveCollection("db", "d"))
	p.replicate(t, create, vch(3, "z")) // the control channel copy never arrived
	never := replicated(40, typCreate, []message.VChannel{vch(3, "q")})
	_ = never // no copy arrived: the secondary never heard of it

	if _, err := p.b.ForcePromote(ctx); err != nil {
		t.Fatal(err)
	}
	if got := p.copiesOf(10); len(got) != 2 || got[vch(1, "x")] != 1 || got[vch(2, "y")] != 1 {
		t.Fatalf("DropCollection supplemented on %v, want exactly v1 and v2 once", got)
	}
	if got := p.copiesOf(20); len(got) != 3 || got["wal-0/_control"] != 0 {
		t.Fatalf("stale config supplemented on %v, want its 3 missing control channels", got)
	}
	if got := p.copiesOf(30); len(got) != 1 || got[cchan] != 1 {
		t.Fatalf("CreateCollection supplemented on %v, want the control channel only", got)
	}
	if _, err := p.b.Task(40); !errors.Is(err, broadcast.ErrNotFound) {
		t.Fatal("a broadcast none of whose copies arrived exists on the secondary")
	}
	if got := p.copiesOf(5); len(got) != 0 {
		t.Fatalf("a complete task was re-appended: %v", got)
	}
	for _, id := range []uint64{10, 20, 30} {
		ti, err := p.b.Task(id)
		if err != nil || ti.State != broadcast.Tombstone {
			t.Fatalf("task %d: %+v, %v", id, ti, err)
		}
	}
	ti, _ := p.b.Task(20)
	if ti.Outcome.Status != broadcast.Ignored {
		t.Fatalf("stale replicated config outcome %v, want ignored", ti.Outcome.Status)
	}
	if p.b.ReplicateConfig().Primary != "walcast" {
		t.Fatalf("stale config overwrote the promoted one: %+v", p.b.ReplicateConfig())
	}
	for _, id := range []uint64{10, 30, 5} {
		if p.effects()[id] != 1 {
			t.Errorf("task %d effect applied %d times", id, p.effects()[id])
		}
	}
	// Supplemented tasks completed in broadcast-id order.
	var order []uint64
	for _, c := range p.callsCopy() {
		order = append(order, c.id)
	}
	if len(order) < 3 || order[len(order)-2] != 10 || order[len(order)-1] != 30 {
		t.Fatalf("callback order %v: want ... 10, 30", order)
	}
}

// TestR8_3_ForcePromoteRetriesFailedAppends: the WAL fails while
// supplementing; the appends are retried and the promote completes.
func TestR8_3_ForcePromoteRetriesFailedAppends(t *testing.T) {
	p := newPromoteEnv(t)
	ctx := ctxT(t, 20*time.Second)
	drop := replicated(10, typDrop, []message.VChannel{vch(1, "x")}, resource.ExclusiveCollection("db", "c"))
	p.replicate(t, drop, cchan)
	p.log.FailNext("wal-1", 3, wmem.Fault{Fail: true})
	if _, err := p.b.ForcePromote(ctx); err != nil {
		t.Fatal(err)
	}
	if got := p.copiesOf(10); got[vch(1, "x")] != 1 {
		t.Fatalf("supplement copies %v", got)
	}
}

// TestR8_3_ForcePromoteCrashMidwayNeverAppendsTwice crashes the promoting
// coordinator right after a supplement was appended, recovers, and runs the
// promote again: every task completes once and no copy is appended twice.
func TestR8_3_ForcePromoteCrashMidwayNeverAppendsTwice(t *testing.T) {
	sw := crash.NewSwitch()
	p := newPromoteEnv(t, crashAfterFirstAppendOf(sw, 10))
	ctx := ctxT(t, 30*time.Second)
	drop := replicated(10, typDrop, []message.VChannel{vch(1, "x"), vch(2, "y")}, resource.ExclusiveCollection("db", "c"))
	p.replicate(t, drop, cchan)
	create := replicated(30, typCreate, []message.VChannel{vch(3, "z")}, resource.ExclusiveCollection("db", "d"))
	p.replicate(t, create, cchan)
	// The node lags: its acks of the supplemented copies do not arrive, so
	// only the promote's scan of the WAL can tell they were appended.
	p.acker.mu.Lock()
	p.acker.drop = func(a broadcast.Ack) bool { return a.BroadcastID == 10 && a.Message.Replicate == nil }
	p.acker.mu.Unlock()
	go func() { _, _ = p.b.ForcePromote(ctx) }()
	select {
	case <-sw.Crashed():
	case <-ctx.Done():
		t.Fatal("the crash point was not reached")
	}
	_ = p.b.Close()
	// The resumed promote needs no node's ack to complete (its own copies
	// were acked before the crash, the supplements it acks itself), so its
	// appends wait until the role left by the crash has been read.
	hold := make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	b := p.open(func(c *broadcast.Config) {
		c.PChannels = pchans
		c.WAL = wal.New(hookedLog{Log: c.WAL.Log(), append: func(_ message.PChannel, next func() (uint64, error)) (uint64, error) {
			<-hold
			return next()
		}}, wal.WithLanes(p.lanes, pchans))
	})
	t.Cleanup(release) // before the Close that open registered
	p.acker.set(b)
	if b.Role() != broadcast.Secondary {
		t.Fatal("a crashed promote left the cluster primary")
	}
	release()
	// Recovery resumes the promote by itself.
	resumedPromote(ctx, t, b)
	for id, want := range map[uint64]int{10: 2, 30: 1} {
		got := p.copiesOf(id)
		total := 0
		for v, n := range got {
			if n != 1 {
				t.Errorf("broadcast %d: %d copies on %s", id, n, v)
			}
			total++
		}
		if total != want {
			t.Errorf("broadcast %d supplemented on %v, want %d vchannels", id, got, want)
		}
		if p.effects()[id] != 1 {
			t.Errorf("broadcast %d effect applied %d times", id, p.effects()[id])
		}
	}
	waitIdle(t, b)
}

// TestR8_1_FollowAndConfigure: an empty cluster follows a primary and
// refuses DDL; a cluster with history is refused; a topology change
// broadcast on a primary names the roles; a secondary cannot configure.
func TestR8_1_FollowAndConfigure(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	if err := b.Follow(ctx, broadcast.ReplicateConfig{Primary: "walcast"}); !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("following oneself: %v", err)
	}
	res, err := b.Configure(ctx, broadcast.ReplicateConfig{Primary: "walcast", Secondaries: []broadcast.SecondaryConfig{{Name: "west", Source: "nats://x"}}})
	if err != nil {
		t.Fatal(err)
	}
	if b.Role() != broadcast.Primary || len(res.Appends) != 1 {
		t.Fatalf("role %s, appends %v", b.Role(), res.Appends)
	}
	if s, ok := b.ReplicateConfig().Secondary("west"); !ok || s.Source != "nats://x" {
		t.Fatalf("topology %+v", b.ReplicateConfig())
	}
	if err := b.Follow(ctx, broadcast.ReplicateConfig{Primary: "east"}); !errors.Is(err, broadcast.ErrFailedPrecondition) {
		t.Fatalf("a cluster with history followed: %v", err)
	}
	e2 := newEnv(t)
	b2 := e2.open()
	e2.secondary(b2)
	if _, err := b2.Configure(ctx, broadcast.ReplicateConfig{Primary: "walcast"}); !errors.Is(err, broadcast.ErrNotPrimary) {
		t.Fatalf("Configure on a secondary: %v", err)
	}
	if _, err := b.ForcePromote(ctx); !errors.Is(err, broadcast.ErrNotSecondary) {
		t.Fatalf("ForcePromote on a primary: %v", err)
	}
}

// TestR8_1_FollowRefusesClusterWhoseHistoryWasCollected: a primary whose
// tombstones are all collected still has broadcast history (its nodes skip
// the ids they applied), so it cannot join as a secondary, before or after a
// restart; a fresh cluster can.
func TestR8_1_FollowRefusesClusterWhoseHistoryWasCollected(t *testing.T) {
	e := newEnv(t)
	now := newManualClock()
	clock := func(c *broadcast.Config) {
		c.Clock = now
		c.Tombstone.MaxLifetime = time.Hour
		c.Tombstone.CheckInterval = time.Hour
	}
	b := e.open(clock)
	ctx := ctxT(t, 10*time.Second)
	if _, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c")); err != nil {
		t.Fatal(err)
	}
	_ = b.Close()
	now.Add(2 * time.Hour)
	b = e.open(clock)
	waitFor(t, "GC of the expired tombstone", func() bool { return b.Stats().Tombstones == 0 })
	if err := b.Follow(ctx, broadcast.ReplicateConfig{Primary: "east"}); !errors.Is(err, broadcast.ErrFailedPrecondition) {
		t.Fatalf("a cluster whose history was collected followed: %v", err)
	}
	if b.Role() != broadcast.Primary {
		t.Fatalf("role %s after a refused Follow", b.Role())
	}
	fresh := newEnv(t).open()
	if err := fresh.Follow(ctx, broadcast.ReplicateConfig{Primary: "east"}); err != nil || fresh.Role() != broadcast.Secondary {
		t.Fatalf("a fresh cluster could not follow: %v (role %s)", err, fresh.Role())
	}
}

// resumedPromote waits for the promote that recovery resumed on b: a call
// made while it runs joins it, one made after it completed finds the cluster
// primary and is refused with ErrNotSecondary, as ForcePromote documents.
// Either way the promote must have made this cluster primary.
func resumedPromote(ctx context.Context, t *testing.T, b *broadcast.Broadcaster) {
	t.Helper()
	if _, err := b.ForcePromote(ctx); err != nil && !errors.Is(err, broadcast.ErrNotSecondary) {
		t.Fatal(err)
	}
	if cfg := b.ReplicateConfig(); b.Role() != broadcast.Primary || cfg.Primary != "walcast" {
		t.Fatalf("role %s, config %+v after the resumed promote", b.Role(), cfg)
	}
}

// crashAfterFirstAppendOf makes the WAL and catalog crash (through sw) right
// after the first entry holding a copy of broadcast id is written: the copy
// lands, the process dies.
func crashAfterFirstAppendOf(sw *crash.Switch, id uint64) func(*broadcast.Config) {
	var appends atomic.Int32
	return func(c *broadcast.Config) {
		c.WAL = wal.New(&crash.Log{Log: c.WAL.Log(), S: sw, Hook: func(_ message.PChannel, data []byte) crash.Action {
			cs, err := wal.Decode(0, data)
			if err == nil && len(cs) > 0 && cs[0].Message.Broadcast.ID == id && appends.Add(1) == 1 {
				return crash.After
			}
			return crash.Pass
		}})
		c.Catalog = &crash.Catalog{Catalog: c.Catalog, S: sw}
	}
}
