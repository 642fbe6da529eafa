package engine

import (
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// TestR8_3_PromoterScript runs testdata/promoter.txt: step 3 of a force
// promote (R8.3). Once the groups' members that can never run in order are
// marked, the incomplete tasks are finished one at a time in id order, the
// next once the one before is Done: each copy an earlier run appended (the
// scan found it) counts as appended and is acked by the engine, unless its
// task is AckSyncUp (its consumers ack it, R4.4); every other missing copy
// is appended now; a REPLICATED task collecting acks is queued for its
// callback. Once every task finished, the promote itself moves on.
//
// Commands:
//
//	new promote=P                    a promoter for force promote P
//	task id=I copies=N [acked=(C,...)] [queued] [syncup]
//	                                 an incomplete REPLICATED task (collecting acks, or queued)
//	found id=I copy=C pos=X          the scan found copy C of I at X
//	finish                           the incomplete tasks are listed and the first started
//	done id=I                        task I is Done
func TestR8_3_PromoterScript(t *testing.T) {
	var (
		p     *promoter
		tasks map[uint64]*task
		out   []string
	)
	log := slog.New(slog.DiscardHandler)
	flush := func() string {
		return takeLines(&out)
	}
	get := func(t *testing.T, d *scriptCmd) *task {
		x := tasks[d.uint(t, "id")]
		if x == nil {
			t.Fatalf("%s: no task %d", d.pos, d.uint(t, "id"))
		}
		return x
	}
	mk := func(id uint64, n int) *task {
		m := &message.Message{Type: message.Type{Name: "t", Version: 1}}
		m.Broadcast.ID = id
		for i := range n {
			m.Broadcast.VChannels = append(m.Broadcast.VChannels, message.VChannel(fmt.Sprintf("p%d_v", i)))
		}
		return newTask(m, nil, message.TypeInfo{}, time.Time{})
	}
	runScript(t, "testdata/promoter.txt", func(t *testing.T, d *scriptCmd) string {
		switch d.name {
		case "new":
			tasks, out = map[uint64]*task{}, nil
			pt := mk(d.uint(t, "promote"), 1)
			pt.stage = Promoting
			tasks[pt.id] = pt
			p = &promoter{t: pt, from: map[message.PChannel]uint64{}, found: map[copyKey]wal.Checkpoint{},
				tasks: func() []*task {
					var xs []*task
					for _, id := range slices.Sorted(func(yield func(uint64) bool) {
						for id := range tasks {
							if !yield(id) {
								return
							}
						}
					}) {
						xs = append(xs, tasks[id])
					}
					return xs
				},
				live:            func(x *task) bool { return tasks[x.id] == x },
				ignoreUnordered: func() { out = append(out, "groups: members out of order ignored") },
				fastAck:         func(x *task, i int) { out = append(out, fmt.Sprintf("fast ack %d copy %d", x.id, i)) },
				supplementMissing: func(x *task) {
					var missing []string
					for i, cp := range x.copies {
						if !cp.acked && !cp.appended {
							missing = append(missing, strconv.Itoa(i))
						}
					}
					out = append(out, fmt.Sprintf("append %d copies (%s)", x.id, strings.Join(missing, ",")))
				},
				move: func(x *task, on Trigger, to Stage) {
					out = append(out, fmt.Sprintf("move %d: %s --%s--> %s", x.id, x.stage, on, to))
					x.stage = to
				},
				log:  log,
				done: func() { out = append(out, "promoter done") },
			}
			return ""
		case "task":
			x := mk(d.uint(t, "id"), int(d.uint(t, "copies")))
			x.replicated = true
			x.msg.Broadcast.AckSyncUp = d.has("syncup")
			x.stage = Collecting
			if d.has("queued") {
				x.stage = Queued
			}
			for _, c := range d.strs("acked") {
				i, err := strconv.Atoi(c)
				if err != nil {
					t.Fatalf("%s: copy %q", d.pos, c)
				}
				x.copies[i].acked = true
			}
			tasks[x.id] = x
			return ""
		case "found":
			x := get(t, d)
			i := int(d.uint(t, "copy"))
			p.found[copyKey{x.id, x.msg.Broadcast.VChannels[i]}] = wal.Checkpoint{MessageID: d.uint(t, "pos")}
			return ""
		case "finish":
			p.finishAll()
			return flush()
		case "done":
			x := get(t, d)
			delete(tasks, x.id)
			p.finished(x)
			return flush()
		}
		t.Fatalf("%s: unknown command %s", d.pos, d.name)
		return ""
	})
}
