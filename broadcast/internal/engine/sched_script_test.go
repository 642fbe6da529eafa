package engine

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/internal/retry"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// TestR5_4_SchedulerScript runs testdata/sched.txt: which task's callback
// may run — a queued task whose copies are all acked and that no earlier
// enrolled, unfinished task conflicts with on a key (R5.4): exclusive
// claims in enrolment order, shared ones together until an exclusive one;
// which tasks a finished one unblocks; the attempts of a callback and the
// backoff before a failed one's next attempt (R5.2, R5.6).
//
// Commands:
//
//	new [initial=DURATION] [max=DURATION]   a scheduler with that retry policy
//	enroll id=I keys=(k,k:shared,...) [unacked]
//	                                        a queued task claiming keys, enrolled
//	ack id=I                                its copies acked
//	runnable                                each enrolled task: runs, or why not
//	start id=I at=DURATION                  an attempt of its callback starts
//	fail id=I at=DURATION [err=TEXT]        the attempt failed: the wait before the next
//	soon id=I                               the next failure retries at once (RetryNow)
//	finish id=I                             its callback done: the tasks it may unblock
func TestR5_4_SchedulerScript(t *testing.T) {
	var (
		s     scheduler
		tasks map[uint64]*task
		order []uint64
	)
	at := func(d *scriptCmd) time.Time {
		v, err := time.ParseDuration(d.str(t, "at"))
		if err != nil {
			t.Fatalf("%s: at: %v", d.pos, err)
		}
		return time.Unix(0, 0).Add(v)
	}
	get := func(d *scriptCmd) *task {
		x := tasks[d.uint(t, "id")]
		if x == nil {
			t.Fatalf("%s: no task %d", d.pos, d.uint(t, "id"))
		}
		return x
	}
	runScript(t, "testdata/sched.txt", func(t *testing.T, d *scriptCmd) string {
		switch d.name {
		case "new":
			pol := retry.Policy{}
			if d.has("initial") {
				pol.Initial, _ = time.ParseDuration(d.str(t, "initial"))
			}
			if d.has("max") {
				pol.Max, _ = time.ParseDuration(d.str(t, "max"))
			}
			s = scheduler{backoff: pol.Schedule}
			s.init()
			tasks, order = make(map[uint64]*task), nil
			return ""
		case "enroll":
			m := &message.Message{Type: message.Type{Name: "t", Version: 1}}
			m.Broadcast.ID = d.uint(t, "id")
			m.Broadcast.VChannels = []message.VChannel{"v1", "v2"}
			for _, k := range d.strs("keys") {
				name, mode, _ := strings.Cut(k, ":")
				key := resource.ExclusiveDatabase(name)
				if mode == "shared" {
					key = resource.SharedDatabase(name)
				}
				m.Broadcast.ResourceKeys = append(m.Broadcast.ResourceKeys, key)
			}
			x := newTask(m, nil, message.TypeInfo{}, time.Time{})
			x.stage = Queued
			if !d.has("unacked") {
				x.nacked = len(x.copies)
			}
			tasks[x.id] = x
			order = append(order, x.id)
			s.enroll(x)
			return ""
		case "ack":
			x := get(d)
			x.nacked = len(x.copies)
			return ""
		case "runnable":
			var out []string
			for _, id := range order {
				x := tasks[id]
				if x == nil {
					continue
				}
				switch {
				case x.stage != Queued:
					out = append(out, fmt.Sprintf("%d: %s", id, x.stage))
				case s.runnable(x, false):
					out = append(out, fmt.Sprintf("%d: runs", id))
				case !x.allAcked():
					out = append(out, fmt.Sprintf("%d: copies not acked", id))
				default:
					out = append(out, fmt.Sprintf("%d: blocked", id))
				}
			}
			if len(out) == 0 {
				return "none"
			}
			return strings.Join(out, "\n")
		case "start":
			x := get(d)
			x.stage = Calling
			s.started(x, at(d))
			return fmt.Sprintf("attempt %d", x.attempts)
		case "fail":
			x := get(d)
			msg := "failed"
			if d.has("err") {
				msg = d.str(t, "err")
			}
			now := at(d)
			s.ended(x, x.attempts, now, errors.New(msg))
			x.stage = Backoff
			wait := s.failed(x, errors.New(msg), now)
			h := x.history[len(x.history)-1]
			return fmt.Sprintf("attempt %d failed (%s): next in %s, at %s", h.N, h.Err, wait, x.nextAt.Sub(time.Unix(0, 0)))
		case "soon":
			get(d).retrySoon = true
			return ""
		case "finish":
			x := get(d)
			next := s.remove(x)
			x.stage = Tombstoned
			delete(tasks, x.id)
			if len(next) == 0 {
				return "unblocks none"
			}
			ids := make([]string, len(next))
			for i, n := range next {
				ids[i] = fmt.Sprint(n.id)
			}
			return "may unblock " + strings.Join(ids, " ")
		}
		t.Fatalf("%s: unknown command %s", d.pos, d.name)
		return ""
	})
}
