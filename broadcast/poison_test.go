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

var typPoison = message.Type{Name: "Poisoned", Version: 1}

// poisonEnv is an env whose Poisoned type's callback fails with fail.
func poisonEnv(t *testing.T, fail func() error) *env {
	e := newEnv(t)
	e.types.MustRegister(message.TypeInfo{Type: typPoison})
	if err := broadcast.OnAck(e.cbs, typPoison, broadcast.Raw(), func(context.Context, *broadcast.TypedEvent[[]byte]) error {
		return fail()
	}); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestR11_6_PoisonedCallbackStallsOnlyItsKeys: a callback that fails for
// ever (#47629 in the reference system blocks all DDL this way) holds only
// its own task's keys: broadcasts on other keys go through while it is
// retried, one on its keys waits; the stuck task is visible (a hanging
// task, its attempts and last error) and an operator's CompleteCallback
// ends it, after which the waiting broadcast goes on.
func TestR11_6_PoisonedCallbackStallsOnlyItsKeys(t *testing.T) {
	e := poisonEnv(t, func() error { return errors.New("the table is gone") })
	b := e.open()
	ctx := ctxT(t, 20*time.Second)
	poisonKey := resource.ExclusiveCollection("db", "poison")
	poisoned := make(chan error, 1)
	go func() {
		_, err := do(ctx, b, msgOf(t, typPoison, "p", []message.VChannel{vch(1, "c")}), poisonKey)
		poisoned <- err
	}()
	var id uint64
	waitFor(t, "the poisoned callback to be retried", func() bool {
		ts, err := b.Tasks(broadcast.Filter{Type: typPoison})
		if err != nil || len(ts) == 0 {
			return false
		}
		id = ts[0].ID
		return ts[0].Callback.Attempts >= 2
	})
	for i := range 10 {
		if _, err := do(ctx, b, msgOf(t, typCreate, "other", []message.VChannel{vch(2, "d")}),
			resource.ExclusiveCollection("db", "other"+string(rune('a'+i)))); err != nil {
			t.Fatalf("a broadcast on other keys while the callback is poisoned: %v", err)
		}
	}
	behind := make(chan error, 1)
	go func() {
		_, err := do(ctx, b, msgOf(t, typCreate, "behind", []message.VChannel{vch(2, "d")}), poisonKey)
		behind <- err
	}()
	hanging, err := b.Tasks(broadcast.Filter{States: []broadcast.State{broadcast.Pending}, OlderThan: time.Nanosecond})
	if err != nil || len(hanging) == 0 || hanging[0].ID != id || hanging[0].Callback.LastError == "" {
		t.Fatalf("the poisoned task among the hanging ones: %+v, %v", hanging, err)
	}
	select {
	case err := <-behind:
		t.Fatalf("a broadcast on the poisoned task's keys did not wait for it: %v", err)
	default:
	}
	if err := b.CompleteCallback(ctx, id, "poisoned: the table is gone"); err != nil {
		t.Fatal(err)
	}
	if err := <-poisoned; err != nil {
		t.Fatalf("the poisoned broadcast after the operator completed it: %v", err)
	}
	if err := <-behind; err != nil {
		t.Fatalf("the broadcast behind it: %v", err)
	}
	ti, err := b.Task(id)
	if err != nil || ti.Outcome.Status != broadcast.ForceCompleted {
		t.Fatalf("the completed task: %+v, %v", ti.Outcome, err)
	}
}

// TestR11_6_PermanentCallbackFailureEndsTheTask: a callback that fails
// with an error the application marks permanent (broadcast.Permanent) is
// not retried: its task ends with a Failed outcome carrying the error,
// without effects, and a broadcast on its keys goes on.
func TestR11_6_PermanentCallbackFailureEndsTheTask(t *testing.T) {
	calls := 0
	e := poisonEnv(t, func() error {
		calls++
		return broadcast.Permanent(errors.New("schema mismatch"))
	})
	b := e.open()
	ctx := ctxT(t, 20*time.Second)
	key := resource.ExclusiveCollection("db", "poison")
	res, err := do(ctx, b, msgOf(t, typPoison, "p", []message.VChannel{vch(1, "c")}), key)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome.Status != broadcast.Failed || res.Outcome.Detail != "schema mismatch" {
		t.Fatalf("outcome %+v, want failed with the error", res.Outcome)
	}
	if calls != 1 {
		t.Fatalf("the callback ran %d times, want once", calls)
	}
	if _, err := do(ctx, b, msgOf(t, typCreate, "after", []message.VChannel{vch(2, "d")}), key); err != nil {
		t.Fatalf("a broadcast on its keys afterwards: %v", err)
	}
	if !broadcast.IsPermanent(broadcast.Permanent(context.Canceled)) || broadcast.IsPermanent(context.Canceled) ||
		broadcast.Permanent(nil) != nil {
		t.Fatal("Permanent / IsPermanent")
	}
}
