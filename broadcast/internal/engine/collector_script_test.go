package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/walcast/walcast/internal/idset"
	"github.com/walcast/walcast/internal/retry"
)

// TestR6_2_CollectorScript runs testdata/collector.txt: tombstone GC runs
// (R6.1, R6.2). A run deletes the victims the tombstones pick in one
// catalog write, with the ids of the replicated ones among them added to
// the durable collected set (#86) and the id floor raised above every
// deleted id; one GC write is in flight at a time, and a run asked for
// meanwhile runs once it ends. Only once the deletes committed are the
// tombstones forgotten; a failed write leaves them all for a later run.
// The periodic run comes every CheckInterval.
//
// Commands:
//
//	new classes=(name:maxCount:maxLifetime,...) [interval=DURATION]
//	tomb id=I class=C at=DURATION [replicated]  a tombstone completed at DURATION
//	run now=DURATION [all]                      a GC run at that time
//	written id=N [err=TEXT]                     write N's result (an error: ambiguous)
//	timers now=DURATION                         the timers due by then run
//	state                                       each class's tombstones, the collected ids, the id floor
func TestR6_2_CollectorScript(t *testing.T) {
	var (
		gc     collector
		ts     tombstones
		id     ids
		idem   idemIndex
		groups groupTable
		coll   idset.Set
		wr     writer
		tm     timers
		acts   outbox
		now    time.Time
	)
	log := slog.New(slog.DiscardHandler)
	dur := func(d *scriptCmd, key string) time.Duration {
		v, err := time.ParseDuration(d.str(t, key))
		if err != nil {
			t.Fatalf("%s: %s: %v", d.pos, key, err)
		}
		return v
	}
	var lines []string
	flush := func() string {
		for _, a := range acts.acts {
			if a.Kind != ActWrite {
				continue
			}
			var ops []string
			for _, op := range a.Write.Ops {
				if op.Delete {
					ops = append(ops, "delete "+op.Key)
				} else {
					ops = append(ops, "put "+op.Key)
				}
			}
			lines = append(lines, fmt.Sprintf("write %d (%s): %s", a.Write.ID, a.Write.Kind, strings.Join(ops, ", ")))
		}
		acts.acts = acts.acts[:0]
		s := strings.Join(lines, "\n")
		lines = nil
		return s
	}
	runScript(t, "testdata/collector.txt", func(t *testing.T, d *scriptCmd) string {
		switch d.name {
		case "new":
			var classes []Class
			for _, c := range d.strs("classes") {
				f := strings.Split(c, ":")
				n, err1 := strconv.Atoi(f[1])
				life, err2 := time.ParseDuration(f[2])
				if len(f) != 3 || err1 != nil || err2 != nil {
					t.Fatalf("%s: class %q", d.pos, c)
				}
				classes = append(classes, Class{Name: f[0], MaxCount: n, MaxLifetime: life})
			}
			var seq uint64
			stopped := false
			now, acts, coll, id = time.Unix(0, 0), outbox{}, idset.Set{}, ids{next: 1}
			ts = tombstones{}
			ts.init(classes)
			idem = newIdemIndex(0, func(uint64) (Scope, bool) { return Scope{}, false })
			groups = newGroupTable(0)
			tm = timers{now: func() time.Time { return now }, seq: func() uint64 { seq++; return seq }, stopped: &stopped}
			pol := retry.Policy{Initial: 100 * time.Millisecond}
			wr = writer{ops: map[uint64]*writeOp{}, prefix: "/p/", nextID: tm.seq, out: &acts, stats: &Stats{}, obs: nopObserver{},
				after: tm.after, backoff: func() *backoff.ExponentialBackOff { return pol.Schedule() },
				log: func(*task) *slog.Logger { return log }, live: func(*task) bool { return true }, fence: func(error) {}}
			gc = collector{tombs: &ts, ids: &id, idem: &idem, groups: &groups, collected: &coll, writes: &wr, timers: &tm,
				obs: nopObserver{}, stats: &Stats{}, log: log, prefix: "/p/", maxOps: 128, now: func() time.Time { return now },
				resumeIDs: func() {}}
			if d.has("interval") {
				gc.checkInterval = dur(d, "interval")
				gc.periodic()
			}
			return ""
		case "tomb":
			cls := scriptClass(t, d, &ts)
			ts.push(ts.newTomb(d.uint(t, "id"), nil, int64(dur(d, "at")), cls, d.has("replicated")))
			return ""
		case "run":
			now = time.Unix(0, 0).Add(dur(d, "now"))
			gc.run(d.has("all"))
			return flush()
		case "written":
			var err error
			if d.has("err") {
				err = errors.New(d.str(t, "err"))
			}
			wr.written(Written{ID: d.uint(t, "id"), Err: err})
			return flush()
		case "timers":
			now = time.Unix(0, 0).Add(dur(d, "now"))
			tm.fireDue()
			return flush()
		case "state":
			var out []string
			for _, cl := range ts.classes {
				var xs []string
				for _, tb := range cl.order[cl.head:] {
					xs = append(xs, strconv.FormatUint(tb.id, 10))
				}
				out = append(out, fmt.Sprintf("%s: %s", cl.cfg.Name, strings.Join(xs, " ")))
			}
			var cs []string
			for _, id := range []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10} {
				if coll.Has(id) {
					cs = append(cs, strconv.FormatUint(id, 10))
				}
			}
			out = append(out, fmt.Sprintf("collected: %s", strings.Join(cs, " ")), fmt.Sprintf("id floor: %d", id.floor))
			return strings.Join(out, "\n")
		}
		t.Fatalf("%s: unknown command %s", d.pos, d.name)
		return ""
	})
}
