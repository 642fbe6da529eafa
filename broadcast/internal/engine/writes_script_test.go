package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/retry"
	"github.com/walcast/walcast/message"
)

// TestR6_5_WriterScript runs testdata/writer.txt: every catalog write goes
// through the writer, which decides its result by the durable-write policy
// (R6.5). A task has at most one write in flight or waiting to be retried,
// the next queued behind it and issued once it ends (so that no REPLICATED
// record lands after its TOMBSTONE, R5.3); RetrySame issues the same write
// again after the backoff (the write's failed hook told of each failed
// attempt); StepDown gives the write its decision and fences the core; every
// other decision goes to the write. A write waiting for its retry can be
// dropped, one in flight cannot.
//
// Commands:
//
//	new                       a writer
//	write task=I kind=K       a write of task I (0: none) of kind K (pending, ack, tombstone, gc, ids, promote)
//	written id=N [err=E]      write N's result; E is definite, ambiguous, fenced or too-large
//	cancel task=I             drop task I's write if it waits for its retry
//	dead task=I               task I is no longer live
//	timers                    the retries due run (but dropped ones)
func TestR6_5_WriterScript(t *testing.T) {
	var (
		wr     writer
		tasks  map[uint64]*task
		dead   map[uint64]bool
		out    []string
		timers []*deadline
		acts   outbox
	)
	log := slog.New(slog.DiscardHandler)
	drain := func() {
		for _, a := range acts.acts {
			if a.Kind == ActWrite {
				out = append(out, fmt.Sprintf("write %d: %s of task %d", a.Write.ID, a.Write.Kind, a.Write.Task))
			}
		}
		acts.acts = acts.acts[:0]
	}
	flush := func() string {
		drain()
		return takeLines(&out)
	}
	kinds := map[string]WriteKind{}
	for k, n := range kindNames {
		kinds[n] = k
	}
	errs := map[string]error{
		"definite":  fmt.Errorf("refused: %w", catalog.ErrNotApplied),
		"ambiguous": errors.New("timeout"),
		"fenced":    fmt.Errorf("deposed: %w", catalog.ErrFenced),
		"too-large": fmt.Errorf("big: %w", catalog.ErrTooLarge),
	}
	runScript(t, "testdata/writer.txt", func(t *testing.T, d *scriptCmd) string {
		switch d.name {
		case "new":
			var ids uint64
			pol := retry.Policy{Initial: 100 * time.Millisecond}
			tasks, dead, out, timers, acts = map[uint64]*task{}, map[uint64]bool{}, nil, nil, outbox{}
			wr = writer{ops: make(map[uint64]*writeOp), prefix: "/p", nextID: func() uint64 { ids++; return ids }, out: &acts,
				stats: &Stats{}, obs: nopObserver{},
				after: func(dur time.Duration, fn func()) *deadline {
					drain()
					out = append(out, fmt.Sprintf("retry in %s", dur))
					dl := &deadline{fn: fn}
					timers = append(timers, dl)
					return dl
				},
				backoff: func() *backoff.ExponentialBackOff { return pol.Schedule() },
				log:     func(*task) *slog.Logger { return log },
				live:    func(x *task) bool { return !dead[x.id] },
				fence: func(err error) {
					drain()
					out = append(out, fmt.Sprintf("fenced: %v", err))
				}}
			return ""
		case "write":
			kind, ok := kinds[d.str(t, "kind")]
			if !ok {
				t.Fatalf("%s: kind %q", d.pos, d.str(t, "kind"))
			}
			var x *task
			if id := d.uint(t, "task"); id != 0 {
				x = tasks[id]
				if x == nil {
					m := &message.Message{Type: message.Type{Name: "t", Version: 1}}
					m.Broadcast.ID = id
					x = newTask(m, nil, message.TypeInfo{}, time.Time{})
					tasks[id] = x
				}
			}
			var w *writeOp
			w = wr.write(kind, x, nil, nil, func(_ *Core, w *writeOp, dec Decision, err error) {
				drain()
				out = append(out, fmt.Sprintf("write %d decided: %s (%v)", w.id, dec, err))
			})
			w.failed = func(_ *Core, w *writeOp, err error) {
				drain()
				out = append(out, fmt.Sprintf("write %d failed: %v", w.id, err))
			}
			if x != nil && x.write != w {
				out = append(out, fmt.Sprintf("queued behind write %d", x.write.id))
			}
			return flush()
		case "written":
			var err error
			if d.has("err") {
				err = errs[d.str(t, "err")]
				if err == nil {
					t.Fatalf("%s: err %q", d.pos, d.str(t, "err"))
				}
			}
			wr.written(Written{ID: d.uint(t, "id"), Err: err})
			return flush()
		case "cancel":
			x := tasks[d.uint(t, "task")]
			out = append(out, fmt.Sprintf("dropped: %v", wr.cancelRetry(x.write)))
			return flush()
		case "dead":
			dead[d.uint(t, "task")] = true
			return ""
		case "timers":
			due := timers
			timers = nil
			for _, dl := range due {
				if !dl.cancelled {
					dl.fn()
				}
			}
			return flush()
		}
		t.Fatalf("%s: unknown command %s", d.pos, d.name)
		return ""
	})
}
