package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// TestR9_3_AppliesEveryCopyOnceAndAcks: every copy of a few broadcasts,
// control channel included, is applied once per vchannel and acked with its
// checkpoint and message.
func TestR9_3_AppliesEveryCopyOnceAndAcks(t *testing.T) {
	e := newEnv(t)
	app, acker := newCountApplier(), &recAcker{next: e.b}
	n := e.start(app, acker)
	var ids []uint64
	for i := range 5 {
		r := e.mustBroadcast(typCreate, fmt.Sprint("c", i), vA, vB)
		ids = append(ids, r.BroadcastID)
	}
	e.waitApplied(app)
	e.checkExactlyOnce(app)
	waitFor(t, "every copy to be acked", func() bool { return len(acker.succeeded()) == len(e.distinct()) })
	byKey := map[key]wal.Copy{}
	for _, c := range e.logCopies() {
		byKey[key{c.VChannel, c.Message.Broadcast.ID}] = c
	}
	for _, rec := range acker.records() {
		c, ok := byKey[key{rec.a.VChannel, rec.a.BroadcastID}]
		if !ok {
			t.Fatalf("ack of a copy not in the log: %+v", rec.a)
		}
		if rec.a.Checkpoint != c.Checkpoint || rec.a.Message == nil || rec.a.Message.Broadcast.ID != rec.a.BroadcastID {
			t.Errorf("ack %+v does not carry the copy's checkpoint %+v and message", rec.a, c.Checkpoint)
		}
	}
	for k, n := range acker.succeeded() {
		if n != 1 {
			t.Errorf("%s broadcast %d acked %d times", k.v, k.id, n)
		}
	}
	st := n.Status()
	if !st.Running || st.Name != "n1" || len(st.PChannels) != 2 {
		t.Fatalf("status %+v", st)
	}
	waitFor(t, "the status to settle", func() bool {
		for _, ps := range n.Status().PChannels {
			if ps.NextOffset != uint64(len(e.log.Entries(ps.PChannel))) || ps.Stage != StageIdle {
				return false
			}
		}
		return true
	})
	p1, err := n.PChannel("wal-1")
	if err != nil {
		t.Fatal(err)
	}
	if vs, ok := n.VChannel(vB); p1.LastBroadcastID != ids[4] || p1.Applied != 5 || p1.Acks != 5 ||
		p1.VChannels != 1 || !ok || vs != (VChannelStatus{VChannel: vB, Applied: 5, LastBroadcastID: ids[4]}) {
		t.Errorf("wal-1 status %+v, %s %+v", p1, vB, vs)
	}
	p0, _ := n.PChannel("wal-0")
	if c, ok := n.VChannel(cchan); p0.VChannels != 2 || !ok || c.Applied != 5 {
		t.Errorf("wal-0 status %+v, control channel %+v", p0, c)
	}
	if _, ok := n.VChannel(vA); !ok {
		t.Errorf("wal-0 status %+v: no %s", p0, vA)
	}
}

// TestR4_4_AckSyncUpCompletesOnlyAfterApply: an AckSyncUp broadcast
// completes only through the node's acks, each sent after Apply ran and the
// node's state holding the copy was saved.
func TestR4_4_AckSyncUpCompletesOnlyAfterApply(t *testing.T) {
	e := newEnv(t)
	app := newCountApplier()
	release := make(chan struct{})
	var blocked atomic.Bool
	app.hook = func(ctx context.Context, c wal.Copy) error {
		if c.Message.Type == typSync && c.VChannel == vB {
			blocked.Store(true)
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	acker := &recAcker{next: e.b}
	acker.hook = func(_ context.Context, a broadcast.Ack) error {
		if a.Message.Type != typSync {
			return nil
		}
		if app.count(a.VChannel, a.BroadcastID) != 1 {
			t.Errorf("ack of %s/%d before Apply", a.VChannel, a.BroadcastID)
		}
		s, ok, err := loadState(e.dir, a.VChannel.PChannel())
		if err != nil || !ok || !s.st.applied(a.VChannel, a.BroadcastID) {
			t.Errorf("ack of AckSyncUp copy %s/%d before the node saved it (ok=%v err=%v)", a.VChannel, a.BroadcastID, ok, err)
		}
		return nil
	}
	e.start(app, acker)
	type out struct {
		r   *broadcast.Result
		err error
	}
	done := make(chan out, 1)
	go func() {
		r, err := e.broadcast(ctxT(t, 10*time.Second), typSync, "c", vA, vB)
		done <- out{r, err}
	}()
	waitFor(t, "Apply of the wal-1 copy to block", blocked.Load)
	// Every other copy is applied and acked: only the blocked one's ack is
	// missing, so the broadcast must not have completed.
	waitFor(t, "the other copies' acks", func() bool {
		n := 0
		for _, r := range acker.records() {
			if r.a.Message.Type == typSync && r.err == nil {
				n++
			}
		}
		return n == 2 // wal-0/a and the control channel
	})
	select {
	case o := <-done:
		t.Fatalf("AckSyncUp broadcast completed before the node applied every copy: %+v %v", o.r, o.err)
	default:
	}
	close(release)
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	e.checkExactlyOnce(app)
	// The results are the node's acks: the checkpoints of the copies it read.
	for _, c := range e.logCopies() {
		if got := o.r.Appends.Map()[c.VChannel]; got != c.Checkpoint {
			t.Errorf("%s: result %+v, want the acked checkpoint %+v", c.VChannel, got, c.Checkpoint)
		}
	}
}

// TestR9_3_RedeliveredCopiesAppliedOnceAckedAgain: the same broadcast
// written again (as a recovering coordinator re-appends it) is not applied
// again, but acked again.
func TestR9_3_RedeliveredCopiesAppliedOnceAckedAgain(t *testing.T) {
	e := newEnv(t)
	app, acker := newCountApplier(), &recAcker{next: e.b}
	n := e.start(app, acker)
	r := e.mustBroadcast(typCreate, "c", vA, vB)
	e.waitApplied(app)
	waitFor(t, "the first acks", func() bool { return len(acker.succeeded()) == 3 })

	// wal-0: a re-append in a different entry (other vchannel order), as
	// recovery would write it; wal-1: the very same bytes once more.
	var msg *message.Message
	for _, c := range e.logCopies() {
		msg = c.Message
	}
	appendMsg(t, e.w, "wal-0", msg, cchan, vA)
	data := e.log.Entries("wal-1")[0]
	if _, err := e.log.Append(context.Background(), "wal-1", "", data); err != nil {
		t.Fatal(err)
	}
	if len(e.log.Entries("wal-0")) != 2 || len(e.log.Entries("wal-1")) != 2 {
		t.Fatal("the re-appends were not written")
	}
	waitFor(t, "the re-delivered copies to be acked", func() bool {
		for _, n := range acker.succeeded() {
			if n != 2 {
				return false
			}
		}
		return true
	})
	e.checkExactlyOnce(app)
	if calls, _ := app.stats(); calls != 3 {
		t.Errorf("Apply called %d times, want 3", calls)
	}
	var dups uint64
	for _, ps := range n.Status().PChannels {
		dups += ps.Duplicates
		if ps.NextOffset != 2 {
			t.Errorf("%s: next offset %d, want 2", ps.PChannel, ps.NextOffset)
		}
	}
	if dups != 3 {
		t.Errorf("%d duplicates, want 3", dups)
	}
	if ti, err := e.b.Task(r.BroadcastID); err != nil || ti.State != broadcast.Tombstone {
		t.Errorf("task %d: %+v %v", r.BroadcastID, ti.State, err)
	}
}

// TestR10_4_RestartAppliesEveryCopyOnce: a node stopped mid-stream and a new
// one on the same StateDir together apply every copy exactly once, after a
// clean stop (no Apply call repeated) and after a crash (the copies after the
// last save are applied again, to the restored state).
func TestR10_4_RestartAppliesEveryCopyOnce(t *testing.T) {
	for _, perVChannel := range []bool{false, true} {
		for _, crash := range []bool{false, true} {
			name := map[bool]string{false: "clean", true: "crash"}[crash] + map[bool]string{false: "", true: "/per-vchannel"}[perVChannel]
			t.Run(name, func(t *testing.T) { restartAppliesEveryCopyOnce(t, crash, perVChannel) })
		}
	}
}

// restartAppliesEveryCopyOnce is TestR10_4_RestartAppliesEveryCopyOnce
// with a clean stop or a crash, with an Applier that snapshots its whole
// pchannels or a VChannelApplier.
func restartAppliesEveryCopyOnce(t *testing.T, crash, perVChannel bool) {
	applier := func(a *countApplier) Applier {
		if perVChannel {
			return vcApplier{a}
		}
		return a
	}
	e := newEnv(t)
	const total = 24
	var sent atomic.Int32
	bdone := make(chan error, 1)
	// The sender pauses a third of the way, right after a fast-acked
	// broadcast, so the node has unsaved progress when it is stopped
	// (however slow the machine), and resumes after.
	resume := make(chan struct{})
	go func() {
		for i := range total {
			if i == total/3+1 {
				<-resume
			}
			targets := []message.VChannel{vA, vB}
			typ := typCreate
			if i%4 == 3 {
				targets, typ = []message.VChannel{vB}, typSync
			}
			if _, err := e.broadcast(ctxT(t, 20*time.Second), typ, fmt.Sprint("c", i%3), targets...); err != nil {
				bdone <- err
				return
			}
			sent.Add(1)
		}
		bdone <- nil
	}()
	mod := func(c *Config) { c.SnapshotEvery, c.SnapshotInterval = 3, time.Hour }
	app1 := newCountApplier()
	n1, err := New(e.config(applier(app1), &recAcker{next: e.b}, mod))
	if err != nil {
		t.Fatal(err)
	}
	n1.crashOnClose = crash
	if err := n1.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a third of the broadcasts, and unsaved progress", func() bool {
		return sent.Load() > total/3 && unsaved(n1)
	})
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	close(resume)
	lost := crash && unsaved(n1) // progress the crash threw away
	calls1, _ := app1.stats()

	app2 := newCountApplier()
	n2 := e.start(applier(app2), &recAcker{next: e.b}, mod)
	if err := <-bdone; err != nil {
		t.Fatal(err) // AckSyncUp broadcasts need the second node's acks
	}
	e.waitApplied(app2)
	e.checkExactlyOnce(app2)
	calls2, _ := app2.stats()
	copies := len(e.distinct())
	t.Logf("copies %d, Apply calls %d + %d", copies, calls1, calls2)
	if !crash && calls1+calls2 != copies {
		t.Errorf("clean restart: %d + %d Apply calls for %d copies", calls1, calls2, copies)
	}
	if crash && calls1+calls2 < copies || lost && calls1+calls2 == copies {
		t.Errorf("crash (unsaved progress lost: %v): %d + %d Apply calls for %d copies", lost, calls1, calls2, copies)
	}
	if err := n2.Close(); err != nil {
		t.Fatal(err)
	}
}

// unsaved reports whether n applied copies its saved state does not have.
func unsaved(n *Node) bool {
	for _, c := range n.chans {
		c.mu.Lock()
		handled := c.st.handled
		c.mu.Unlock()
		saved, ok, err := loadState(c.cfg.StateDir, c.p)
		if err != nil || !ok || saved.st.handled < handled {
			return true
		}
	}
	return false
}

// TestCloseMidEntryReacksAfterRestart: a node closed while an entry's acks
// are failing saves the applied copies; the next node re-reads the entry,
// does not apply it again, and acks it.
func TestCloseMidEntryReacksAfterRestart(t *testing.T) {
	e := newEnv(t)
	app1 := newCountApplier()
	acker1 := &recAcker{next: e.b, hook: func(ctx context.Context, a broadcast.Ack) error {
		if a.VChannel == cchan {
			return errors.New("coordinator unreachable")
		}
		return nil
	}}
	n1 := e.start(app1, acker1)
	done := make(chan error, 1)
	go func() {
		_, err := e.broadcast(ctxT(t, 10*time.Second), typSync, "c", vA)
		done <- err
	}()
	waitFor(t, "the control copy's ack to fail", func() bool {
		p0, _ := n1.PChannel("wal-0")
		return p0.Stage == StageAcking && p0.Attempts >= 2
	})
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	s, ok, err := loadState(e.dir, "wal-0")
	if err != nil || !ok || s.st.resume != 0 || !s.st.applied(cchan, 1) || !s.st.applied(vA, 1) {
		t.Fatalf("saved state %+v ok=%v err=%v; want resume 0 with both copies applied", s, ok, err)
	}
	app2, acker2 := newCountApplier(), &recAcker{next: e.b}
	n2 := e.start(app2, acker2)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.checkExactlyOnce(app2)
	if calls, _ := app2.stats(); calls != 0 {
		t.Errorf("the restarted node applied %d copies again", calls)
	}
	// The broadcast can return before the last Ack call returns to the
	// recording acker: wait for both records, then count them.
	waitFor(t, "the restarted node's acks recorded", func() bool {
		got := acker2.succeeded()
		return got[key{cchan, 1}] > 0 && got[key{vA, 1}] > 0
	})
	if got := acker2.succeeded(); got[key{cchan, 1}] != 1 || got[key{vA, 1}] != 1 {
		t.Errorf("the restarted node's acks: %v", got)
	}
	waitFor(t, "the entry to be done", func() bool {
		p0, _ := n2.PChannel("wal-0")
		return p0.NextOffset == 1 && p0.Duplicates == 2
	})
}

// TestR9_3_AcksRetriedAndNeverCancelledByCaller: acks that fail are retried
// until they succeed, on the node's own lifetime: the context given to Start
// is gone long before.
func TestR9_3_AcksRetriedAndNeverCancelledByCaller(t *testing.T) {
	e := newEnv(t)
	app := newCountApplier()
	acker := &recAcker{next: e.b, failNext: 5}
	n, err := New(e.config(app, acker))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cancel() // the caller goes away
	r, err := e.broadcast(ctxT(t, 10*time.Second), typSync, "c", vA, vB)
	if err != nil {
		t.Fatal(err) // completes only through the node's acks
	}
	recs := acker.records()
	failed := 0
	for _, rec := range recs {
		if rec.ctxDone {
			t.Errorf("ack called with a done context: %+v", rec)
		}
		if rec.err != nil {
			failed++
		}
	}
	if failed != 5 {
		t.Errorf("%d failed acks, want 5", failed)
	}
	var retries uint64
	for _, ps := range n.Status().PChannels {
		retries += ps.AckRetries
	}
	if retries != 5 {
		t.Errorf("status counts %d ack retries, want 5", retries)
	}
	if ti, err := e.b.Task(r.BroadcastID); err != nil || ti.State != broadcast.Tombstone {
		t.Errorf("task: %v %v", ti.State, err)
	}
}

// TestR9_3_EntryAckedInOneCallAndOnlyFailuresRetried: an Acker that takes
// an entry's acks together gets them in one call; an attempt retries only
// the acks that failed and not those refused for good.
func TestR9_3_EntryAckedInOneCallAndOnlyFailuresRetried(t *testing.T) {
	e := newEnv(t)
	vB2, vB3 := message.VChannel("wal-1/b2"), message.VChannel("wal-1/b3")
	flaky := 2 // broadcast 8's ack fails twice
	var mu sync.Mutex
	acker := &allAcker{recAcker: &recAcker{hook: func(_ context.Context, a broadcast.Ack) error {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case a.BroadcastID == 7:
			return fmt.Errorf("remote: %w", broadcast.ErrVChannelNotInTask)
		case a.BroadcastID == 8 && flaky > 0:
			flaky--
			return errors.New("injected: coordinator unavailable")
		}
		return nil
	}}}
	n := e.start(newCountApplier(), acker)
	var items []wal.Item
	for id, v := range map[uint64]message.VChannel{7: vB, 8: vB2, 9: vB3} {
		raw, err := message.Marshal(stamped(t, typCreate, id, v))
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, wal.Item{Message: raw, VChannels: []message.VChannel{v}})
	}
	if _, err := e.w.Append(context.Background(), "wal-1", items); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the entry's acks", func() bool { return len(acker.succeeded()) == 2 })
	calls := acker.allCalls()
	if len(calls) != 3 {
		t.Fatalf("%d AckAll calls, want 3 (the entry, then two retries of the failed ack): %+v", len(calls), calls)
	}
	if len(calls[0]) != 3 {
		t.Errorf("first call had %d acks, want the entry's 3", len(calls[0]))
	}
	for i, c := range calls[1:] {
		if len(c) != 1 || c[0].BroadcastID != 8 {
			t.Errorf("retry %d sent %+v, want only broadcast 8's ack", i+1, c)
		}
	}
	if got := len(acker.records()); got != 5 {
		t.Errorf("%d acks in all, want 5 (3, then 8's twice)", got)
	}
	var st PChannelStatus
	for _, ps := range n.Status().PChannels {
		if ps.PChannel == "wal-1" {
			st = ps
		}
	}
	if st.Acks != 2 || st.AckRetries != 2 || st.AcksRejected != 1 {
		t.Errorf("status: %d acks, %d retries, %d rejected; want 2, 2, 1", st.Acks, st.AckRetries, st.AcksRejected)
	}
}

// TestR9_3_PermanentAckErrorIsNotRetried: an ack for a vchannel outside the
// task can never succeed; the node logs it and goes on.
func TestR9_3_PermanentAckErrorIsNotRetried(t *testing.T) {
	e := newEnv(t)
	app := newCountApplier()
	acker := &recAcker{hook: func(_ context.Context, a broadcast.Ack) error {
		if a.BroadcastID == 7 {
			return fmt.Errorf("remote: %w", broadcast.ErrVChannelNotInTask)
		}
		return nil
	}}
	n := e.start(app, acker)
	appendMsg(t, e.w, "wal-1", stamped(t, typCreate, 7, vB), vB)
	appendMsg(t, e.w, "wal-1", stamped(t, typCreate, 8, vB), vB)
	// The node counts the refusal once it has given up on the ack: a retry
	// would come before that.
	waitFor(t, "both acks, one refused for good", func() bool {
		p1, _ := n.PChannel("wal-1")
		return len(acker.succeeded()) == 1 && p1.AcksRejected == 1
	})
	if recs := acker.records(); len(recs) != 2 {
		t.Fatalf("%d ack calls, want 2 (the permanent failure is not retried)", len(recs))
	}
	p1, _ := n.PChannel("wal-1")
	if p1.AcksRejected != 1 || p1.Acks != 1 || p1.Applied != 2 {
		t.Errorf("status %+v", p1)
	}
}

// TestR9_3_ApplyRetriedThenAppliedOnce: a failing Apply is retried with
// backoff, never skipped, and the copy is applied once.
func TestR9_3_ApplyRetriedThenAppliedOnce(t *testing.T) {
	e := newEnv(t)
	app := newCountApplier()
	app.failNext = 3
	e.start(app, &recAcker{next: e.b})
	if _, err := e.broadcast(ctxT(t, 10*time.Second), typSync, "c", vB); err != nil {
		t.Fatal(err)
	}
	e.checkExactlyOnce(app)
	calls, fails := app.stats()
	if fails != 3 || calls != 2 {
		t.Errorf("%d failed and %d successful Apply calls, want 3 and 2", fails, calls)
	}
}

// TestApplyFailureIsVisibleAndNeverSkipped: while Apply keeps failing, the
// pchannel does not move on, and Status says why.
func TestApplyFailureIsVisibleAndNeverSkipped(t *testing.T) {
	e := newEnv(t)
	app := newCountApplier()
	app.hook = func(_ context.Context, c wal.Copy) error {
		if c.Message.Broadcast.ID == 1 {
			return errors.New("schema conflict")
		}
		return nil
	}
	n := e.start(app, &recAcker{})
	appendMsg(t, e.w, "wal-1", stamped(t, typCreate, 1, vB), vB)
	appendMsg(t, e.w, "wal-1", stamped(t, typCreate, 2, vB), vB)
	waitFor(t, "retries", func() bool {
		p1, _ := n.PChannel("wal-1")
		return p1.Stage == StageApplying && p1.Attempts >= 3 && p1.LastError == "schema conflict"
	})
	if app.count(vB, 2) != 0 {
		t.Fatal("a later copy was applied while an earlier one was failing")
	}
	app.mu.Lock()
	app.hook = nil
	app.mu.Unlock()
	waitFor(t, "both copies", func() bool { return app.count(vB, 2) == 1 })
	if app.count(vB, 1) != 1 {
		t.Error("the failing copy was not applied once")
	}
}

// TestR8_2_AcksCarryTheMessage: on a secondary, the node's acks of
// replicated copies create REPLICATED tasks that complete.
func TestR8_2_AcksCarryTheMessage(t *testing.T) {
	e := newEnv(t)
	sec, err := broadcast.New(ctxT(t, 10*time.Second), broadcast.Config{
		Catalog: cmem.NewStore().Open(), WAL: e.w, Types: e.types, ControlChannel: cchan,
		Backoff: fastBackoff, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sec.Close() })
	if err := sec.Follow(ctxT(t, 10*time.Second), broadcast.ReplicateConfig{Primary: "primary",
		Secondaries: []broadcast.SecondaryConfig{{Name: "walcast"}}}); err != nil {
		t.Fatal(err)
	}
	app := newCountApplier()
	e.start(app, sec)
	m := stamped(t, typCreate, 42, vA, vB)
	m.Replicate = &message.ReplicateHeader{SourceCluster: "primary", SourcePChannel: "wal-0", SourceMessageID: 1, SourceTimeTick: 1}
	appendMsg(t, e.w, "wal-0", m, vA, cchan)
	appendMsg(t, e.w, "wal-1", m, vB)
	waitFor(t, "the replicated task to complete", func() bool {
		ti, err := sec.Task(42)
		return err == nil && ti.State == broadcast.Tombstone
	})
	e.checkExactlyOnce(app)
}

// TestCorruptEntryIsNeverSkipped: an entry that does not decode stops its
// pchannel (visibly), not the others, and is not skipped.
func TestCorruptEntryIsNeverSkipped(t *testing.T) {
	e := newEnv(t)
	app := newCountApplier()
	rc := &readCounter{Log: e.log}
	n := e.start(app, &recAcker{}, func(c *Config) { c.WAL = wal.New(rc) })
	if _, err := e.log.Append(context.Background(), "wal-1", "", []byte{0xff, 0xff, 0xff}); err != nil {
		t.Fatal(err)
	}
	appendMsg(t, e.w, "wal-1", stamped(t, typCreate, 1, vB), vB)
	appendMsg(t, e.w, "wal-0", stamped(t, typCreate, 2, vA), vA)
	waitFor(t, "wal-0 to go on", func() bool { return app.count(vA, 2) == 1 })
	waitFor(t, "the read error to show", func() bool {
		p1, _ := n.PChannel("wal-1")
		return p1.ReadError != ""
	})
	// The reader reopens at the corrupt entry and fails again, and again.
	reads := rc.reads.Load()
	waitFor(t, "two more reads of wal-1", func() bool { return rc.reads.Load() >= reads+2 })
	if app.count(vB, 1) != 0 {
		t.Fatal("the copy after a corrupt entry was applied: the entry was skipped")
	}
	if p1, _ := n.PChannel("wal-1"); p1.NextOffset != 0 {
		t.Errorf("next offset %d moved past the corrupt entry", p1.NextOffset)
	}
}

// TestSnapshotInterval: an idle pchannel with unsaved progress is saved
// SnapshotInterval later.
func TestSnapshotInterval(t *testing.T) {
	e := newEnv(t)
	app := newCountApplier()
	n := e.start(app, &recAcker{}, func(c *Config) { c.SnapshotEvery, c.SnapshotInterval = 1000, 20*time.Millisecond })
	appendMsg(t, e.w, "wal-1", stamped(t, typCreate, 1, vB), vB)
	waitFor(t, "the save", func() bool {
		p1, _ := n.PChannel("wal-1")
		return p1.SavedOffset == 1 && !p1.SavedAt.IsZero()
	})
	s, ok, err := loadState(e.dir, "wal-1")
	if err != nil || !ok || s.st.resume != 1 || !s.st.applied(vB, 1) {
		t.Fatalf("saved %+v ok=%v err=%v", s, ok, err)
	}
	other := newCountApplier()
	if err := other.Restore("wal-1", s.whole); err != nil || other.count(vB, 1) != 1 {
		t.Fatalf("the saved snapshot does not hold the copy: %v", err)
	}
}

// TestCloseIsPromptWithRetriesInBackoff: goroutines waiting in long backoffs
// (failing Apply on one pchannel, failing acks on the other) stop at once.
func TestCloseIsPromptWithRetriesInBackoff(t *testing.T) {
	e := newEnv(t)
	app := newCountApplier()
	app.hook = func(_ context.Context, c wal.Copy) error {
		if c.VChannel == vA {
			return errors.New("always failing")
		}
		return nil
	}
	acker := &recAcker{hook: func(context.Context, broadcast.Ack) error { return errors.New("always failing") }}
	n, err := New(e.config(app, acker, func(c *Config) {
		c.Backoff = broadcast.Backoff{Initial: time.Hour, Multiplier: 2, Max: time.Hour}
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	appendMsg(t, e.w, "wal-0", stamped(t, typCreate, 1, vA), vA)
	appendMsg(t, e.w, "wal-1", stamped(t, typCreate, 2, vB), vB)
	waitFor(t, "both pchannels to wait in backoff", func() bool {
		st := n.Status()
		return st.PChannels[0].Stage == StageApplying && st.PChannels[0].Attempts == 1 &&
			st.PChannels[1].Stage == StageAcking && st.PChannels[1].Attempts == 1
	})
	start := time.Now()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v", d)
	}
	if err := n.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	st := n.Status()
	if st.Running || st.PChannels[0].Stage != StageStopped {
		t.Errorf("status after Close: %+v", st)
	}
}

func TestBadInput(t *testing.T) {
	e := newEnv(t)
	app, acker := newCountApplier(), &recAcker{}
	for name, mod := range map[string]func(*Config){
		"empty":        func(c *Config) { *c = Config{} },
		"no name":      func(c *Config) { c.Name = "" },
		"no WAL":       func(c *Config) { c.WAL = nil },
		"no applier":   func(c *Config) { c.Applier = nil },
		"no acker":     func(c *Config) { c.Acker = nil },
		"no state dir": func(c *Config) { c.StateDir = "" },
		"no pchannels": func(c *Config) { c.PChannels = nil },
		"bad pchannel": func(c *Config) { c.PChannels = []message.PChannel{"wal/0"} },
		"twice":        func(c *Config) { c.PChannels = []message.PChannel{"wal-0", "wal-0"} },
		"bad backoff": func(c *Config) {
			c.Backoff = broadcast.Backoff{Initial: time.Second, Multiplier: 0.5, Max: time.Second}
		},
		"negative every": func(c *Config) { c.SnapshotEvery = -1 },
		"negative ival":  func(c *Config) { c.SnapshotInterval = -1 },
		"negative ack":   func(c *Config) { c.AckTimeout = -1 },
	} {
		if _, err := New(e.config(app, acker, mod)); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}

	// A pchannel the WAL does not have.
	n, err := New(e.config(app, acker, func(c *Config) { c.PChannels = []message.PChannel{"wal-0", "wal-9"} }))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); !errors.Is(err, ErrUnknownPChannel) || !errors.Is(err, wal.ErrUnknownPChannel) {
		t.Errorf("Start with an unknown pchannel: %v", err)
	}
	if _, err := n.PChannel("wal-7"); !errors.Is(err, ErrUnknownPChannel) {
		t.Errorf("status of a pchannel not consumed: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Error(err)
	}

	n = e.start(app, acker)
	if err := n.Start(context.Background()); !errors.Is(err, ErrStarted) {
		t.Errorf("second Start: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Start after Close: %v", err)
	}
}

func TestCorruptStateFile(t *testing.T) {
	e := newEnv(t)
	app := newCountApplier()
	n := e.start(app, &recAcker{}, func(c *Config) { c.SnapshotEvery = 1 })
	appendMsg(t, e.w, "wal-1", stamped(t, typCreate, 1, vB), vB)
	waitFor(t, "the save", func() bool { p1, _ := n.PChannel("wal-1"); return p1.SavedOffset == 1 })
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	path := statePath(e.dir, "wal-1")
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"empty":     {},
		"garbage":   []byte("hello\nworld"),
		"bit flip":  append(append([]byte(nil), good[:len(good)-3]...), good[len(good)-3]^1, good[len(good)-2], good[len(good)-1]),
		"truncated": good[:len(good)/2],
	} {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := New(e.config(newCountApplier(), &recAcker{})); !errors.Is(err, ErrCorruptState) {
			t.Errorf("%s: %v, want ErrCorruptState", name, err)
		}
	}
	// Another pchannel's file under this name.
	other, err := encodeBase("n1", "wal-0", 1, newPState(), func(message.VChannel) ([]byte, error) { return nil, nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, other, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(e.config(newCountApplier(), &recAcker{})); !errors.Is(err, ErrCorruptState) {
		t.Errorf("foreign file: %v, want ErrCorruptState", err)
	}
	if err := os.WriteFile(path, good, 0o644); err != nil {
		t.Fatal(err)
	}
	app2 := newCountApplier()
	if _, err := New(e.config(app2, &recAcker{})); err != nil || app2.count(vB, 1) != 1 {
		t.Errorf("the good file does not restore: %v", err)
	}
}

// TestLanesEachPChannelHandlesOnlyItsCopies: with both pchannels in one WAL
// lane, every entry holds copies for both; the reader of each pchannel
// skips the other's, so each worker applies and acks only its own
// vchannels' copies, every copy exactly once.
func TestLanesEachPChannelHandlesOnlyItsCopies(t *testing.T) {
	e := newLanedEnv(t, 1)
	app, acker := newCountApplier(), &recAcker{next: e.b}
	n := e.start(app, acker)
	for i := range 5 {
		e.mustBroadcast(typCreate, fmt.Sprint("c", i), vA, vB)
	}
	e.waitApplied(app)
	e.checkExactlyOnce(app)
	waitFor(t, "every copy to be acked", func() bool { return len(acker.succeeded()) == len(e.distinct()) })
	for k, n := range acker.succeeded() {
		if n != 1 {
			t.Errorf("%s broadcast %d acked %d times", k.v, k.id, n)
		}
	}
	for _, p := range pchans {
		ps, err := n.PChannel(p)
		if err != nil {
			t.Fatal(err)
		}
		if ps.Applied == 0 {
			t.Errorf("%s applied nothing", p)
		}
		c := n.byName[p]
		c.mu.Lock()
		for v := range c.st.each {
			if v.PChannel() != p {
				t.Errorf("%s handled %s", p, v)
			}
		}
		c.mu.Unlock()
	}
}

// readCounter counts the cursors opened on a log: a reader that fails
// opens another to read again.
type readCounter struct {
	wal.Log
	reads atomic.Int32
}

func (r *readCounter) Read(ctx context.Context, p message.PChannel, from uint64) (wal.Cursor, error) {
	r.reads.Add(1)
	return r.Log.Read(ctx, p, from)
}

// TestR9_3_ApplyLagCountsOnlyItsPChannel: a node consuming wal-0 of a lane
// it shares with wal-1 shows no lag while only wal-1 is written: the lag
// counts the entries it still has to handle, not the other pchannel's.
func TestR9_3_ApplyLagCountsOnlyItsPChannel(t *testing.T) {
	e := newLanedEnv(t, 1)
	app, acker := newCountApplier(), &recAcker{next: e.b}
	n := e.start(app, acker, func(c *Config) { c.PChannels = []message.PChannel{"wal-0"} })
	for i := range 20 {
		// Only wal-1's copies; acked by the engine (FastAck).
		e.mustBroadcast(typCreate, fmt.Sprint("c", i), vB)
	}
	end, err := e.w.End(context.Background(), "wal-0")
	if err != nil {
		t.Fatal(err)
	}
	if end < 20 {
		t.Fatalf("the lane ends at %d after 20 broadcasts", end)
	}
	// The reader hands every entry of the lane to the worker, which skips
	// wal-1's copies: wait until it has taken them all and none is queued.
	waitFor(t, "the reader to pass wal-1's entries", func() bool {
		ps, err := n.PChannel("wal-0")
		return err == nil && ps.ReadOffset >= end && ps.Queued == 0
	})
	ps, err := n.PChannel("wal-0")
	if err != nil {
		t.Fatal(err)
	}
	if lag := ps.Lag(end); lag != 0 {
		t.Errorf("wal-0's lag %d while only wal-1 was written (next %d, read %d, end %d)", lag, ps.NextOffset, ps.ReadOffset, end)
	}
	// Its own entries count until handled.
	if lag := (PChannelStatus{NextOffset: 3, ReadOffset: 5, Queued: 1}).Lag(9); lag != 5 {
		t.Errorf("lag of next 3, read 5, 1 queued, end 9: %d, want 4 unread + 1 queued", lag)
	}
}
