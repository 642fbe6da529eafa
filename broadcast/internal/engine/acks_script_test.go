package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/walcast/walcast/internal/retry"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// TestR4_5_AckTrackerScript runs testdata/acks.txt: a copy is acked once,
// at its first checkpoint (R4.5); a type's ack-once callback runs before
// an ack counts, its failure leaves the copy unacked and its waiters
// answered with the error; the engine's own acks (FastAck, R4.4) retry a
// failing run with backoff; an acker of a task whose acks must be durable
// (a REPLICATED or AckSyncUp task, R8.2) is answered once a record holding
// its ack is; a WaitAcked is answered once its copies are acked (R13.11).
//
// Commands:
//
//	new [ackonce]                   a tracker; ackonce: the type has an ack-once callback
//	task id=I copies=N [syncup] [replicated] [unappended]
//	                                a task of N copies, appended (copy i at position i+1)
//	                                unless unappended
//	fast id=I                       the engine acks every copy itself (FastAck)
//	ack id=I copy=C [cp=P] [from=W] a consumer W acks copy C at position P
//	run id=R [err=TEXT]             ack-once run R ends
//	timers                          the timers due run
//	written id=I n=N [refused]      a record holding the first N acks is durable (or refused)
//	wait id=I copies=(C,...) from=W W waits for those copies' acks
//	copies id=I                     each copy's ack
func TestR4_5_AckTrackerScript(t *testing.T) {
	var (
		a      ackTracker
		tasks  map[uint64]*task
		out    []string
		timers []func()
		acts   outbox
	)
	log := slog.New(slog.DiscardHandler)
	// drain writes the actions decided so far as lines, in order with the
	// lines of the tracker's other calls.
	drain := func() {
		for _, x := range acts.acts {
			switch x.Kind {
			case ActAckOnce:
				r := x.AckOnce
				out = append(out, fmt.Sprintf("ack-once run %d: broadcast %d on %s at %d", r.ID, r.Task, r.VChannel, r.Checkpoint.MessageID))
			case ActReply:
				if r := x.Reply; r.Err != nil {
					out = append(out, fmt.Sprintf("reply %v: %v", r.To, r.Err))
				} else {
					out = append(out, fmt.Sprintf("reply %v: ok", r.To))
				}
			}
		}
		acts.acts = acts.acts[:0]
	}
	flush := func() string {
		drain()
		return takeLines(&out)
	}
	runScript(t, "testdata/acks.txt", func(t *testing.T, d *scriptCmd) string {
		get := func() *task {
			x := tasks[d.uint(t, "id")]
			if x == nil {
				t.Fatalf("%s: no task %d", d.pos, d.uint(t, "id"))
			}
			return x
		}
		switch d.name {
		case "new":
			ackOnce := d.has("ackonce")
			var ids uint64
			pol := retry.Policy{Initial: 100 * time.Millisecond}
			a = ackTracker{runs: make(map[uint64]ackOnceRef), hasAckOnce: func(message.Type) bool { return ackOnce },
				nextID: func() uint64 { ids++; return ids },
				out:    &acts,
				now:    func() time.Time { return time.Unix(1, 0) },
				after: func(dur time.Duration, fn func()) *deadline {
					drain()
					out = append(out, fmt.Sprintf("retry in %s", dur))
					timers = append(timers, fn)
					return &deadline{}
				},
				backoff: func() *backoff.ExponentialBackOff { return pol.Schedule() },
				live:    func(x *task) bool { return tasks[x.id] == x },
				log:     func(*task) *slog.Logger { return log },
				acked: func(x *task, i int) {
					drain()
					out = append(out, fmt.Sprintf("copy %d acked (%d of %d)", i, x.nacked, len(x.copies)))
				},
				persist: func(x *task) {
					drain()
					out = append(out, fmt.Sprintf("persist acks of %d (%d recorded)", x.id, x.nacked))
				},
			}
			tasks, out, timers, acts = make(map[uint64]*task), nil, nil, outbox{}
			return ""
		case "task":
			m := &message.Message{Type: message.Type{Name: "t", Version: 1}}
			m.Broadcast.ID = d.uint(t, "id")
			n := int(d.uint(t, "copies"))
			for i := range n {
				m.Broadcast.VChannels = append(m.Broadcast.VChannels, message.VChannel(fmt.Sprintf("p%d_v", i)))
			}
			m.Broadcast.AckSyncUp = d.has("syncup")
			x := newTask(m, nil, message.TypeInfo{}, time.Time{})
			x.replicated = d.has("replicated")
			x.stage = Acking
			for i := range x.copies {
				if !d.has("unappended") {
					x.copies[i].appended, x.copies[i].appendCP = true, wal.Checkpoint{MessageID: uint64(i + 1)}
				}
			}
			tasks[x.id] = x
			return ""
		case "fast":
			a.fastAckAll(get())
			return flush()
		case "ack":
			var to Target
			if d.has("from") {
				to = d.str(t, "from")
			}
			a.ackCopy(get(), int(d.uint(t, "copy")), wal.Checkpoint{MessageID: d.uintOr(t, "cp", 0)}, to, context.Background(), nil)
			return flush()
		case "run":
			var err error
			if d.has("err") {
				err = errors.New(d.str(t, "err"))
			}
			a.done(AckOnceDone{ID: d.uint(t, "id"), Err: err})
			return flush()
		case "timers":
			due := timers
			timers = nil
			for _, fn := range due {
				fn()
			}
			return flush()
		case "written":
			x := get()
			dec, err := Done, error(nil)
			if d.has("refused") {
				dec, err = Refuse, errors.New("too large")
			}
			a.written(x, int(d.uint(t, "n")), dec, err)
			return flush()
		case "wait":
			var vs []message.VChannel
			x := get()
			for _, c := range d.strs("copies") {
				i, err := strconv.Atoi(c)
				if err != nil {
					t.Fatalf("%s: copy %q", d.pos, c)
				}
				vs = append(vs, x.msg.Broadcast.VChannels[i])
			}
			a.wait(x, d.str(t, "from"), vs)
			return flush()
		case "copies":
			x := get()
			var lines []string
			for i, cp := range x.copies {
				lines = append(lines, fmt.Sprintf("%d: acked %v at %d", i, cp.acked, cp.ackCP.MessageID))
			}
			return strings.Join(lines, "\n")
		}
		t.Fatalf("%s: unknown command %s", d.pos, d.name)
		return ""
	})
}
