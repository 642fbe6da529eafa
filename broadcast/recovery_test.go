package broadcast_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/durablepb"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// record writes a task record as an earlier broadcaster left it: acked
// lists which targets have a checkpoint.
func record(t *testing.T, c catalog.Catalog, state durablepb.TaskState, m *message.Message, acked ...bool) {
	t.Helper()
	raw, err := message.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	rec := &durablepb.Task{Message: raw, State: state, CreatedUnixNano: time.Now().UnixNano(), PayloadDigest: make([]byte, 16)}
	if len(acked) > 0 {
		for i, a := range acked {
			cp := &durablepb.Checkpoint{}
			if a {
				cp = &durablepb.Checkpoint{Acked: true, MessageId: uint64(i+1) << 16}
			}
			rec.Checkpoints = append(rec.Checkpoints, cp)
		}
	}
	if state == durablepb.TaskState_TASK_STATE_TOMBSTONE {
		rec.CompletedUnixNano = time.Now().UnixNano()
		rec.Outcome = &durablepb.Outcome{Status: durablepb.OutcomeStatus_OUTCOME_STATUS_SUCCEEDED}
	}
	b, err := proto.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(context.Background(), catalog.Put(fmt.Sprintf("walcast/tasks/%020d", m.Broadcast.ID), b)); err != nil {
		t.Fatal(err)
	}
}

func stampedMsg(id uint64, typ message.Type, coll string, targets ...message.VChannel) *message.Message {
	keys, _ := resource.WithClusterKey([]resource.Key{resource.ExclusiveCollection("db", coll)})
	return &message.Message{Type: typ, Payload: []byte(fmt.Sprint(id)),
		Broadcast: message.BroadcastHeader{ID: id, VChannels: append(targets, cchan), ResourceKeys: keys}}
}

// TestR4_8_MixedRecovery is the reference system's recovery scenario,
// rewritten: a catalog holding pending tasks with none, some or all copies
// acked, a replicated task and a tombstone recovers into exactly the
// expected appends and tombstones, and the replicated task completes only
// once its copies are acked.
func TestR4_8_MixedRecovery(t *testing.T) {
	e := newEnv(t)
	c := e.store.Open()
	pend := durablepb.TaskState_TASK_STATE_PENDING
	record(t, c, pend, stampedMsg(1, typCreate, "a", vch(1, "x"), vch(2, "y")))                     // none acked: 3 copies
	record(t, c, pend, stampedMsg(2, typCreate, "b", vch(1, "x")))                                  // none acked, no checkpoints: 2
	record(t, c, pend, stampedMsg(3, typCreate, "c", vch(1, "x"), vch(2, "y")), true, false, false) // first acked: 2
	record(t, c, pend, stampedMsg(4, typCreate, "d", vch(3, "x"), vch(2, "y")), false, true, true)  // last two acked: 1
	record(t, c, pend, stampedMsg(5, typCreate, "e", vch(3, "x")), true, true)                      // all acked: 0
	rep := stampedMsg(6, typCreate, "f", vch(1, "r"), vch(3, "r"))
	rep.Replicate = &message.ReplicateHeader{SourceCluster: "upstream"}
	record(t, c, durablepb.TaskState_TASK_STATE_REPLICATED, rep, false, false, true)                               // control acked, 2 to go
	record(t, c, durablepb.TaskState_TASK_STATE_TOMBSTONE, stampedMsg(7, typCreate, "g", vch(1, "t")), true, true) // done
	if err := c.Commit(context.Background(), catalog.Put("walcast/replicate", []byte(`{"primary":"upstream"}`))); err != nil {
		t.Fatal(err)
	}

	b := e.open()
	waitFor(t, "the pending tasks", func() bool {
		for id := uint64(1); id <= 5; id++ {
			if ti, _ := b.Task(id); ti.State != broadcast.Tombstone {
				return false
			}
		}
		return true
	})
	copies := e.copies()
	want := map[uint64]int{1: 3, 2: 2, 3: 2, 4: 1, 5: 0, 6: 0, 7: 0}
	for id, n := range want {
		got := 0
		for _, k := range copies[id] {
			got += k
		}
		if got != n {
			t.Errorf("broadcast %d: %d copies appended on recovery, want %d (%v)", id, got, n, copies[id])
		}
	}
	if ti, _ := b.Task(6); ti.State != broadcast.Replicated {
		t.Fatalf("replicated task %+v", ti)
	}
	for i, v := range []message.VChannel{vch(1, "r"), vch(3, "r")} {
		if err := b.Ack(ctxT(t, 5*time.Second), broadcast.Ack{BroadcastID: 6, VChannel: v,
			Checkpoint: wal.Checkpoint{MessageID: uint64(10+i) << 16, TimeTick: uint64(10+i) << 16}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the replicated task", func() bool { ti, _ := b.Task(6); return ti.State == broadcast.Tombstone })
	for id := uint64(1); id <= 6; id++ {
		if e.effects()[id] != 1 {
			t.Errorf("broadcast %d: effect applied %d times", id, e.effects()[id])
		}
	}
	if e.effects()[7] != 0 {
		t.Error("a recovered tombstone's callback ran again")
	}
	if st := b.Stats(); st.Recovered != 7 || st.Tombstones != 7 {
		t.Fatalf("stats %+v", st)
	}
	if len(b.Locks()) != 0 {
		t.Fatalf("locks %+v", b.Locks())
	}
}

// TestR4_8_ConflictingRecoveredTasksAreCorrupt: two pending tasks holding
// conflicting keys cannot both be live; recovery reports corrupt metadata
// instead of looping or panicking.
func TestR4_8_ConflictingRecoveredTasksAreCorrupt(t *testing.T) {
	e := newEnv(t)
	c := e.store.Open()
	record(t, c, durablepb.TaskState_TASK_STATE_PENDING, stampedMsg(1, typCreate, "same", vch(1, "x")))
	record(t, c, durablepb.TaskState_TASK_STATE_PENDING, stampedMsg(2, typCreate, "same", vch(2, "x")))
	_, err := e.tryOpen()
	if err == nil || !errors.Is(err, broadcast.ErrCorruptCatalog) {
		t.Fatalf("recovery with conflicting pending tasks: %v, want ErrCorruptCatalog", err)
	}
	// A record that does not decode is reported the same way, naming it.
	e2 := newEnv(t)
	if err := e2.store.Open().Commit(context.Background(), catalog.Put("walcast/tasks/00000000000000000009", []byte{0xff, 0xff})); err != nil {
		t.Fatal(err)
	}
	if _, err := e2.tryOpen(); err == nil || !errors.Is(err, broadcast.ErrCorruptCatalog) {
		t.Fatalf("recovery of a garbage record: %v", err)
	}
}
