package broadcast_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/broadcast/internal/crash"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/durablepb"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/tracing"
	"github.com/walcast/walcast/wal"
)

// hooked is a catalog whose Commit and Get go through hooks; next calls the
// wrapped catalog. A nil hook passes.
type hooked struct {
	catalog.Catalog
	commit func(ctx context.Context, ops []catalog.Op, next func() error) error
	get    func(ctx context.Context, key string, next func() ([]byte, error)) ([]byte, error)
}

func (h hooked) Commit(ctx context.Context, ops ...catalog.Op) error {
	next := func() error { return h.Catalog.Commit(ctx, ops...) }
	if h.commit == nil {
		return next()
	}
	return h.commit(ctx, ops, next)
}

func (h hooked) Get(ctx context.Context, key string) ([]byte, error) {
	next := func() ([]byte, error) { return h.Catalog.Get(ctx, key) }
	if h.get == nil {
		return next()
	}
	return h.get(ctx, key, next)
}

// hookedLog is a WAL log whose Append and End go through hooks.
type hookedLog struct {
	wal.Log
	append func(p message.PChannel, next func() (uint64, error)) (uint64, error)
	end    func(p message.PChannel, next func() (uint64, error)) (uint64, error)
}

func (l hookedLog) Append(ctx context.Context, p message.PChannel, id string, data []byte) (uint64, error) {
	next := func() (uint64, error) { return l.Log.Append(ctx, p, id, data) }
	if l.append == nil {
		return next()
	}
	return l.append(p, next)
}

func (l hookedLog) End(ctx context.Context, p message.PChannel) (uint64, error) {
	next := func() (uint64, error) { return l.Log.End(ctx, p) }
	if l.end == nil {
		return next()
	}
	return l.end(p, next)
}

// recordKey is the catalog key of broadcast id's record.
func recordKey(id uint64) string { return fmt.Sprintf("walcast/tasks/%020d", id) }

// taskRecord finds the record of broadcast id among ops.
func taskRecord(ops []catalog.Op, id uint64) (*durablepb.Task, bool) {
	for _, o := range ops {
		if o.Key == recordKey(id) && !o.Delete {
			var pb durablepb.Task
			if proto.Unmarshal(o.Value, &pb) != nil {
				return nil, false
			}
			return &pb, true
		}
	}
	return nil, false
}

func allAcked(pb *durablepb.Task) bool {
	for _, c := range pb.Checkpoints {
		if !c.Acked {
			return false
		}
	}
	return len(pb.Checkpoints) > 0
}

// clusterKey returns the lock state of the Cluster key.
func clusterKey(b *broadcast.Broadcaster) (resource.KeyState, bool) {
	for _, ks := range b.Locks() {
		if ks.Domain == resource.Cluster {
			return ks, true
		}
	}
	return resource.KeyState{}, false
}

// roleWitness is a log handler that counts the broadcaster's role changes.
// (That the new role is in force before the demotion releases the Cluster
// key is checked on the decision core: TestR8_1_RoleAppliedBeforeKeysReleased
// in broadcast/internal/engine.)
type roleWitness struct {
	changes *atomic.Int32
}

func (w roleWitness) Enabled(context.Context, slog.Level) bool { return true }
func (w roleWitness) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w roleWitness) WithGroup(string) slog.Handler            { return w }
func (w roleWitness) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "cluster role changed" {
		w.changes.Add(1)
	}
	return nil
}

// TestR8_1_DDLQueuedBehindDemotionRefused: a DDL waiting for the Cluster key
// held by a topology change that demotes the cluster is refused with
// ErrNotPrimary once it gets the key, and creates nothing; the new role is
// in force before the demotion releases the key.
func TestR8_1_DDLQueuedBehindDemotionRefused(t *testing.T) {
	e := newEnv(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var changes atomic.Int32
	b := e.open(func(c *broadcast.Config) {
		c.Catalog = hooked{Catalog: c.Catalog, commit: func(_ context.Context, ops []catalog.Op, next func() error) error {
			for _, o := range ops {
				if o.Key == "walcast/replicate" {
					// The demotion's TOMBSTONE: hold it until a DDL queued.
					once.Do(func() { close(entered) })
					<-release
				}
			}
			return next()
		}}
		c.Logger = slog.New(roleWitness{changes: &changes})
	})
	ctx := ctxT(t, 10*time.Second)
	demoted := make(chan error, 1)
	go func() {
		_, err := b.Configure(ctx, broadcast.ReplicateConfig{Primary: "east", Secondaries: []broadcast.SecondaryConfig{{Name: "walcast"}}})
		demoted <- err
	}()
	<-entered
	ddl := make(chan error, 1)
	go func() {
		_, err := do(ctx, b, msgOf(t, typCreate, "x", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c"))
		ddl <- err
	}()
	waitFor(t, "the DDL to queue for the Cluster key", func() bool {
		ks, _ := clusterKey(b)
		return len(ks.Waiters) > 0
	})
	close(release)
	if err := <-demoted; err != nil {
		t.Fatal(err)
	}
	if err := <-ddl; !errors.Is(err, broadcast.ErrNotPrimary) {
		t.Fatalf("DDL queued behind the demotion: %v, want ErrNotPrimary", err)
	}
	if b.Role() != broadcast.Secondary {
		t.Fatalf("role %s after the demotion", b.Role())
	}
	if n := changes.Load(); n != 1 {
		t.Fatalf("role changed %d times, want once", n)
	}
	if st := b.Stats(); st.Broadcasts != 1 {
		t.Fatalf("%d broadcasts created, want the demotion only", st.Broadcasts)
	}
	waitFor(t, "every key released", func() bool { return len(b.Locks()) == 0 })
}

// TestR8_3_SecondForcePromoteQueuedBehindFirstRefused: two force promotes
// wait for the Cluster key; the first promotes the cluster, the second is
// refused with ErrNotSecondary and broadcasts nothing.
func TestR8_3_SecondForcePromoteQueuedBehindFirstRefused(t *testing.T) {
	p := newPromoteEnv(t)
	ctx := ctxT(t, 20*time.Second)
	g, err := p.b.Locker().Lock(ctx, resource.ExclusiveCluster())
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	for n := 1; n <= 2; n++ {
		go func() {
			_, err := p.b.ForcePromote(ctx)
			errs <- err
		}()
		waitFor(t, "the promote to queue", func() bool {
			ks, _ := clusterKey(p.b)
			return len(ks.Waiters) == n
		})
	}
	g.Unlock()
	var ok, refused int
	for range 2 {
		switch err := <-errs; {
		case err == nil:
			ok++
		case errors.Is(err, broadcast.ErrNotSecondary):
			refused++
		default:
			t.Fatal(err)
		}
	}
	if ok != 1 || refused != 1 {
		t.Fatalf("%d promotes succeeded, %d refused; want 1 and 1", ok, refused)
	}
	ts, err := p.b.Tasks(broadcast.Filter{Type: broadcast.AlterReplicateConfig})
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 1 {
		t.Fatalf("%d force promotes broadcast, want 1", len(ts))
	}
	if p.b.Role() != broadcast.Primary {
		t.Fatalf("role %s", p.b.Role())
	}
}

// spanStart calls fn when a span starts.
type spanStart func(sdktrace.ReadWriteSpan)

func (f spanStart) OnStart(_ context.Context, s sdktrace.ReadWriteSpan) { f(s) }
func (spanStart) OnEnd(sdktrace.ReadOnlySpan)                           {}
func (spanStart) Shutdown(context.Context) error                        { return nil }
func (spanStart) ForceFlush(context.Context) error                      { return nil }

// TestR5_3_ReplicatedAckPersistNeverOverwritesTombstone: the commit
// persisting a replicated task's last ack loses its answer while the
// task's callback, which that ack released, runs and its TOMBSTONE is
// written; no REPLICATED record lands after the TOMBSTONE, so after a
// restart the task stays complete and its effect applied once (SPEC §11.2).
// (The engine writes one record of a task at a time, so the TOMBSTONE
// never overlaps an ack's commit: the retry of the lost one is dropped or
// lands first. The decision core's simulator checks the rule on every
// interleaving; here it is checked on the real driver.)
func TestR5_3_ReplicatedAckPersistNeverOverwritesTombstone(t *testing.T) {
	const id = 70
	e := newEnv(t)
	m := replicated(id, typCreate, []message.VChannel{vch(1, "a")}, resource.ExclusiveCollection("db", "c"))
	// A trace context makes the task's spans visible: the TOMBSTONE span
	// says its commit started.
	m.TraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	tombStarted, tombCommitted := make(chan struct{}), make(chan struct{})
	var startOnce, commitOnce sync.Once
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spanStart(func(s sdktrace.ReadWriteSpan) {
		if s.Name() == tracing.SpanTombstone {
			startOnce.Do(func() { close(tombStarted) })
		}
	})))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	var lastAckAttempts, afterTombstone atomic.Int32
	var tombstoned atomic.Bool
	b := e.open(func(c *broadcast.Config) {
		c.TracerProvider = tp
		c.Catalog = hooked{Catalog: c.Catalog, commit: func(ctx context.Context, ops []catalog.Op, next func() error) error {
			pb, ok := taskRecord(ops, id)
			if !ok {
				return next()
			}
			if pb.State == durablepb.TaskState_TASK_STATE_TOMBSTONE {
				err := next()
				if err == nil {
					tombstoned.Store(true)
					commitOnce.Do(func() { close(tombCommitted) })
				}
				return err
			}
			if allAcked(pb) {
				if lastAckAttempts.Add(1) == 1 {
					// Lost answer, nothing written.
					return errors.New("injected: answer lost")
				}
			}
			err := next()
			if err == nil && tombstoned.Load() {
				afterTombstone.Add(1)
			}
			return err
		}}
	})
	e.secondary(b)
	ctx := ctxT(t, 10*time.Second)
	for i, v := range []message.VChannel{cchan, vch(1, "a")} {
		if err := b.Ack(ctx, ackOf(m, v, uint64(100+i))); err != nil {
			t.Fatal(err)
		}
	}
	waitIdle(t, b)
	if n := afterTombstone.Load(); n != 0 {
		t.Fatalf("%d REPLICATED records written after the TOMBSTONE", n)
	}
	raw, err := e.cat.Get(ctx, recordKey(id))
	if err != nil {
		t.Fatal(err)
	}
	var pb durablepb.Task
	if err := proto.Unmarshal(raw, &pb); err != nil || pb.State != durablepb.TaskState_TASK_STATE_TOMBSTONE {
		t.Fatalf("record in state %v (%v), want TOMBSTONE", pb.State, err)
	}
	_ = b.Close()
	b = e.open()
	waitIdle(t, b)
	if n := e.effects()[id]; n != 1 {
		t.Fatalf("effect applied %d times", n)
	}
}

// TestR4_5_AckBeforeAppendResultGetsCheckpoint: consumers ack an AckSyncUp
// broadcast's copies without checkpoints while the append that wrote one is
// still returning; the acks count, and every checkpoint in the result and
// the tombstone is the append's, never zero.
func TestR4_5_AckBeforeAppendResultGetsCheckpoint(t *testing.T) {
	e := newEnv(t)
	written, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b := e.open(func(c *broadcast.Config) {
		c.WAL = wal.New(hookedLog{Log: c.WAL.Log(), append: func(p message.PChannel, next func() (uint64, error)) (uint64, error) {
			off, err := next()
			if p == "wal-1" {
				once.Do(func() {
					close(written)
					<-release
				})
			}
			return off, err
		}}, wal.WithLanes(e.lanes, pchans))
	})
	ctx := ctxT(t, 10*time.Second)
	targets := []message.VChannel{vch(1, "a")}
	type out struct {
		res *broadcast.Result
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := do(ctx, b, msgOf(t, typSync, "p", targets), resource.ExclusiveCollection("db", "c"))
		done <- out{res, err}
	}()
	<-written
	ts, err := b.Tasks(broadcast.Filter{States: []broadcast.State{broadcast.Pending}})
	if err != nil || len(ts) != 1 {
		t.Fatalf("pending tasks %+v, %v", ts, err)
	}
	id := ts[0].ID
	for _, v := range append(targets, cchan) {
		if err := b.Ack(ctx, broadcast.Ack{BroadcastID: id, VChannel: v}); err != nil {
			t.Fatal(err)
		}
	}
	close(release)
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	for _, v := range append(targets, cchan) {
		if cp := o.res.Appends.Map()[v]; cp.MessageID == 0 || cp.TimeTick == 0 {
			t.Errorf("result checkpoint of %s is %+v", v, cp)
		}
	}
	ti, err := b.Task(id)
	if err != nil {
		t.Fatal(err)
	}
	for _, vi := range ti.VChannels {
		if !vi.Acked || vi.Checkpoint.MessageID == 0 || vi.Checkpoint != o.res.Appends.Map()[vi.VChannel] {
			t.Errorf("tombstone checkpoint of %s: %+v", vi.VChannel, vi)
		}
	}
}

// TestR4_7_ClosedCatalogMeansNotCreated: a PENDING commit refused because
// the catalog is closed wrote nothing: the caller hears "task not created"
// and the keys are free again.
func TestR4_7_ClosedCatalogMeansNotCreated(t *testing.T) {
	e := newEnv(t)
	b := e.open(func(c *broadcast.Config) {
		c.Catalog = hooked{Catalog: c.Catalog, commit: func(_ context.Context, ops []catalog.Op, next func() error) error {
			if commitKind(ops) == "pending" {
				return catalog.ErrClosed
			}
			return next()
		}}
	})
	ctx := ctxT(t, 5*time.Second)
	_, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}), resource.ExclusiveCollection("db", "c"))
	if !broadcast.IsTaskNotCreated(err) || !errors.Is(err, catalog.ErrClosed) {
		t.Fatalf("broadcast on a closed catalog: %v, want task not created", err)
	}
	if st := b.Stats(); st.Live != 0 || st.Broadcasts != 0 {
		t.Fatalf("stats %+v after a task that was not created", st)
	}
	if locks := b.Locks(); len(locks) != 0 {
		t.Fatalf("keys still held: %+v", locks)
	}
}

// TestR8_3_ForcePromoteRetriesPositionsWrite: recording where a promote's
// copies landed fails a few times, definitely and ambiguously; the promote
// retries and completes instead of holding the Cluster key until a restart.
// (Recovery reads the recorded positions with the rest of the catalog, so
// nothing reads them while a promote runs.)
func TestR8_3_ForcePromoteRetriesPositionsWrite(t *testing.T) {
	var fails atomic.Int32
	fails.Store(3)
	p := newPromoteEnv(t, func(c *broadcast.Config) {
		c.Catalog = hooked{Catalog: c.Catalog, commit: func(_ context.Context, ops []catalog.Op, next func() error) error {
			if commitKind(ops) == "promote" {
				switch fails.Add(-1) {
				case 2:
					return fmt.Errorf("injected: %w", catalog.ErrClosed) // definitely not written
				case 1:
					return errors.New("injected: timeout") // ambiguous, not written
				case 0:
					_ = next()
					return errors.New("injected: answer lost") // written, answer lost
				}
			}
			return next()
		}}
	})
	ctx := ctxT(t, 20*time.Second)
	if _, err := p.b.ForcePromote(ctx); err != nil {
		t.Fatal(err)
	}
	if p.b.Role() != broadcast.Primary || fails.Load() >= 0 {
		t.Fatalf("role %s, %d injected failures left", p.b.Role(), fails.Load())
	}
	if locks := p.b.Locks(); len(locks) != 0 {
		t.Fatalf("keys still held: %+v", locks)
	}
}

// TestR8_3_ForcePromoteRescansUnreadablePChannel: a promote resumed after a
// crash cannot read the pchannels at first; it reads them again instead of
// going on with a partial scan, so the copy appended before the crash is not
// appended a second time.
func TestR8_3_ForcePromoteRescansUnreadablePChannel(t *testing.T) {
	sw := crash.NewSwitch()
	p := newPromoteEnv(t, crashAfterFirstAppendOf(sw, 10))
	ctx := ctxT(t, 30*time.Second)
	drop := replicated(10, typDrop, []message.VChannel{vch(1, "x"), vch(2, "y")}, resource.ExclusiveCollection("db", "c"))
	p.replicate(t, drop, cchan)
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
	var mu sync.Mutex
	failed := map[message.PChannel]bool{}
	b := p.open(func(c *broadcast.Config) {
		c.PChannels = pchans
		c.WAL = wal.New(hookedLog{Log: c.WAL.Log(), end: func(pc message.PChannel, next func() (uint64, error)) (uint64, error) {
			mu.Lock()
			first := !failed[pc]
			failed[pc] = true
			mu.Unlock()
			if first {
				return 0, errors.New("injected: pchannel unreadable")
			}
			return next()
		}})
	})
	p.acker.set(b)
	resumedPromote(ctx, t, b)
	got := p.copiesOf(10)
	if len(got) != 2 || got[vch(1, "x")] != 1 || got[vch(2, "y")] != 1 {
		t.Fatalf("broadcast 10 supplemented %v, want each vchannel once", got)
	}
	if p.effects()[10] != 1 {
		t.Fatalf("effect applied %d times", p.effects()[10])
	}
}

// TestR8_3_ForcePromoteRetriesFailingAckOnce: the ack-once callback of a
// supplemented copy fails twice; the promote retries the ack, as a fast
// ack is retried, and completes.
func TestR8_3_ForcePromoteRetriesFailingAckOnce(t *testing.T) {
	p := newPromoteEnv(t)
	ctx := ctxT(t, 20*time.Second)
	m := replicated(10, typOnce, []message.VChannel{vch(1, "x")}, resource.ExclusiveCollection("db", "c"))
	p.replicate(t, m, cchan)
	// Only the promote acks the supplemented copy.
	p.acker.mu.Lock()
	p.acker.drop = func(a broadcast.Ack) bool { return a.BroadcastID == 10 }
	p.acker.mu.Unlock()
	p.mu.Lock()
	p.onceErr = 2
	p.mu.Unlock()
	if _, err := p.b.ForcePromote(ctx); err != nil {
		t.Fatal(err)
	}
	if got := p.copiesOf(10); got[vch(1, "x")] != 1 {
		t.Fatalf("supplement copies %v", got)
	}
	if p.effects()[10] != 1 {
		t.Fatalf("effect applied %d times", p.effects()[10])
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.onceErr != 0 {
		t.Fatalf("%d injected ack-once failures left", p.onceErr)
	}
}

// consumerAck marks the context of an ack a consumer sent.
type consumerAck struct{}

// TestR4_4_ForcePromoteHonoursAckSyncUp: a supplemented copy of an
// AckSyncUp broadcast counts only when its consumer acks it; the promote
// does not ack it from the append result.
func TestR4_4_ForcePromoteHonoursAckSyncUp(t *testing.T) {
	typSyncOnce := message.Type{Name: "SyncFlush", Version: 1}
	e := newEnv(t)
	e.types.MustRegister(message.TypeInfo{Type: typSyncOnce, AckSyncUp: true})
	var byEngine atomic.Int32
	if err := broadcast.OnAckOnce(e.cbs, typSyncOnce, broadcast.Raw(), func(ctx context.Context, ev *broadcast.TypedAckEvent[[]byte]) error {
		if ctx.Value(consumerAck{}) == nil {
			byEngine.Add(1)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b := e.open(func(c *broadcast.Config) { c.PChannels = pchans })
	e.secondary(b)
	// The node acks the promote's copies; the test is the consumer of
	// broadcast 10.
	startNode(t, e, &liveAcker{b: b, drop: func(a broadcast.Ack) bool { return a.BroadcastID == 10 }})
	ctx := ctxT(t, 20*time.Second)
	cctx := context.WithValue(ctx, consumerAck{}, true)
	m := replicated(10, typSyncOnce, []message.VChannel{vch(1, "x")}, resource.ExclusiveCollection("db", "c"))
	m.Broadcast.AckSyncUp = true
	if err := b.Ack(cctx, ackOf(m, cchan, 1)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := b.ForcePromote(ctx)
		done <- err
	}()
	waitFor(t, "the supplemented copy", func() bool {
		ti, err := b.Task(10)
		return err == nil && ti.VChannels[0].Appended
	})
	if err := b.Ack(cctx, broadcast.Ack{BroadcastID: 10, VChannel: vch(1, "x")}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := byEngine.Load(); n != 0 {
		t.Fatalf("the promote acked %d copies of an AckSyncUp broadcast itself", n)
	}
	if ti, err := b.Task(10); err != nil || ti.State != broadcast.Tombstone {
		t.Fatalf("task 10: %+v, %v", ti, err)
	}
}

// TestR8_2_AckReportsContextEnd: an ack whose persistence keeps failing
// ambiguously until the acker's context ends returns the context's error, so
// the API reports a deadline as one.
func TestR8_2_AckReportsContextEnd(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := e.open(func(c *broadcast.Config) {
		c.Catalog = hooked{Catalog: c.Catalog, commit: func(_ context.Context, ops []catalog.Op, next func() error) error {
			if commitKind(ops) == "ack" {
				cancel() // the acker gives up while the commit is in doubt
				return errors.New("injected: timeout")
			}
			return next()
		}}
	})
	e.secondary(b)
	m := replicated(9, typCreate, []message.VChannel{vch(1, "a")})
	if err := b.Ack(ctx, ackOf(m, cchan, 1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("ack: %v, want the context's error", err)
	}
}

// TestR8_3_PromotedSecondaryIDsAboveReplicated: a secondary replicated
// broadcast 5000, collected its tombstone and restarted; once promoted, the
// ids it hands out are above 5000, which its nodes already applied.
func TestR8_3_PromotedSecondaryIDsAboveReplicated(t *testing.T) {
	e := newEnv(t)
	mod := func(c *broadcast.Config) {
		c.PChannels = pchans
		c.Tombstone.MaxLifetime = time.Nanosecond // every tombstone is collected at once
	}
	b := e.open(mod)
	e.secondary(b)
	acker := &liveAcker{b: b}
	startNode(t, e, acker)
	ctx := ctxT(t, 20*time.Second)
	m := replicated(5000, typCreate, []message.VChannel{vch(1, "a")}, resource.ExclusiveCollection("db", "c"))
	for i, v := range []message.VChannel{cchan, vch(1, "a")} {
		if err := b.Ack(ctx, ackOf(m, v, uint64(1+i))); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the tombstone collected", func() bool { st := b.Stats(); return st.Live == 0 && st.Tombstones == 0 })
	_ = b.Close()
	b = e.open(mod)
	acker.set(b)
	res, err := b.ForcePromote(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.BroadcastID <= 5000 {
		t.Fatalf("promoted secondary handed out broadcast id %d, at or below the replicated 5000", res.BroadcastID)
	}
}

// TestR7_6_RequestDigestSurvivesFailover: a keyed request accepted on the
// primary with a request digest is replicated; on the promoted secondary a
// retry with another digest is refused as a reused key, and one with the
// same digest is a duplicate (R7.6, R8.4).
func TestR7_6_RequestDigestSurvivesFailover(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	k := message.CollectionKey(7, "imp")
	primary := newEnv(t).open()
	h, err := primary.WithIdempotentResourceKeys(ctx, broadcast.Idempotent{Type: typCreate, Key: k, Digest: []byte("request-1")}, resource.ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := h.Broadcast(ctx, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}, message.WithIdempotencyKey(k)))
	h.Close()
	if err != nil {
		t.Fatal(err)
	}
	ti, err := primary.Task(res.BroadcastID)
	if err != nil {
		t.Fatal(err)
	}
	m := ti.Message.Clone()
	m.Replicate = &message.ReplicateHeader{SourceCluster: "upstream", SourcePChannel: "wal-0"}

	p := newPromoteEnv(t)
	for i, v := range m.Broadcast.VChannels {
		if err := p.b.Ack(ctx, ackOf(m, v, uint64(1+i))); err != nil {
			t.Fatal(err)
		}
	}
	waitIdle(t, p.b)
	if _, err := p.b.ForcePromote(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = p.b.WithIdempotentResourceKeys(ctx, broadcast.Idempotent{Type: typCreate, Key: k, Digest: []byte("request-2")}, resource.ExclusiveCollection("db", "c"))
	if !errors.Is(err, broadcast.ErrKeyReusedWithDifferentPayload) {
		t.Fatalf("retry with another request digest: %v, want ErrKeyReusedWithDifferentPayload", err)
	}
	h, err = p.b.WithIdempotentResourceKeys(ctx, broadcast.Idempotent{Type: typCreate, Key: k, Digest: []byte("request-1")}, resource.ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if !h.Duplicate() {
		t.Fatal("retry with the same digest is not a duplicate")
	}
}

// TestR8_2_ReservedPropertiesRefused: a caller cannot set walcast's own
// properties (such as the one keeping a message from replicating); other
// properties pass.
func TestR8_2_ReservedPropertiesRefused(t *testing.T) {
	e := newEnv(t)
	b := e.open()
	ctx := ctxT(t, 10*time.Second)
	for _, k := range []string{"walcast.unreplicable", "walcast.request-digest", broadcast.ReservedPropertyPrefix + "anything"} {
		m := msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}, message.WithProperty(k, "force-promote"))
		if err := b.Check(m); !errors.Is(err, broadcast.ErrInvalidArgument) {
			t.Fatalf("Check with property %s: %v", k, err)
		}
		if _, err := do(ctx, b, m, resource.ExclusiveCollection("db", "c")); !errors.Is(err, broadcast.ErrInvalidArgument) {
			t.Fatalf("Broadcast with property %s: %v", k, err)
		}
	}
	if st := b.Stats(); st.Broadcasts != 0 || len(b.Locks()) != 0 {
		t.Fatalf("stats %+v, locks %+v after refused broadcasts", st, b.Locks())
	}
	if _, err := do(ctx, b, msgOf(t, typCreate, "p", []message.VChannel{vch(1, "a")}, message.WithProperty("app.walcast.x", "1")), resource.ExclusiveCollection("db", "c")); err != nil {
		t.Fatal(err)
	}
}

// TestR7_1_LongNewKeyRefusedBeforeLocks: a new idempotency key over
// MaxKeyLength is refused by WithIdempotentResourceKeys before it waits for
// any lock or runs the admission check.
func TestR7_1_LongNewKeyRefusedBeforeLocks(t *testing.T) {
	e := newEnv(t)
	var admits atomic.Int32
	b := e.open(func(c *broadcast.Config) {
		c.MaxKeyLength = 8
		c.Admit = func(context.Context) error { admits.Add(1); return nil }
	})
	ctx := ctxT(t, 5*time.Second)
	g, err := b.Locker().Lock(ctx, resource.ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Unlock()
	_, err = b.WithIdempotentResourceKeys(ctx, broadcast.Idempotent{Type: typCreate, Key: message.ClusterKey("longer-than-8")}, resource.ExclusiveCollection("db", "c"))
	if !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("long new key: %v, want ErrInvalidArgument", err)
	}
	if n := admits.Load(); n != 0 {
		t.Fatalf("admission check ran %d times for a refused key", n)
	}
}

// TestR2_3_OversizeMessageRefusedBeforeID: a message whose payload is within
// MaxMessageBytes but whose encoding is not is refused without taking a
// broadcast id.
func TestR2_3_OversizeMessageRefusedBeforeID(t *testing.T) {
	e := newEnv(t)
	b := e.open(func(c *broadcast.Config) { c.MaxMessageBytes = 1024 })
	ctx := ctxT(t, 10*time.Second)
	big := msgOf(t, typCreate, strings.Repeat("x", 1020), []message.VChannel{vch(1, "a")})
	if _, err := do(ctx, b, big, resource.ExclusiveCollection("db", "c")); !errors.Is(err, broadcast.ErrInvalidArgument) {
		t.Fatalf("oversize message: %v", err)
	}
	// Just under the limit once encoded with its id: accepted.
	near := msgOf(t, typCreate, strings.Repeat("x", 900), []message.VChannel{vch(1, "a")})
	res, err := do(ctx, b, near, resource.ExclusiveCollection("db", "c"))
	if err != nil {
		t.Fatal(err)
	}
	if res.BroadcastID != 1 {
		t.Fatalf("first broadcast got id %d: the refused one took an id", res.BroadcastID)
	}
}

// TestR7_5_LookupEmptyKey: Lookup of an empty key says so.
func TestR7_5_LookupEmptyKey(t *testing.T) {
	b := newEnv(t).open()
	_, err := b.Lookup(context.Background(), typCreate, "")
	if !errors.Is(err, broadcast.ErrInvalidArgument) || strings.Contains(err.Error(), "nil") || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("Lookup of an empty key: %v", err)
	}
}
