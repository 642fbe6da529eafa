package engine

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// TestR4_3_AppendLanesScript runs testdata/lanes.txt: append lanes (R4.3)
// — what one entry carries (every queued copy that fits, an exclusive
// broadcast alone: R2.5), the bound on appends in flight, a failed append
// retried as the same entry ahead of new work after the lane's backoff,
// an entry too large split.
//
// Commands:
//
//	new [concurrency=N] [max=BYTES]   lanes with that bound and entry size
//	queue lane=L task=T vcs=(a,b) [size=N] [exclusive]
//	acked task=T                      T's copies need no append any more
//	start                             the lanes start what they may
//	answer id=I (ok|fail|too-large)   append I's result, as the core takes it
//	tick                              the lanes' retry timers fire
//	lanes                             each lane's queue and batch
//
// Commands print the appends they made the lanes send.
func TestR4_3_AppendLanesScript(t *testing.T) {
	var (
		ls     appendLanes
		seq    uint64
		out    outbox
		stats  Stats
		timers []func()
		acked  map[uint64]bool
	)
	reset := func(concurrency, maxBytes int) {
		ls = newAppendLanes(Config{AppendConcurrency: concurrency, MaxEntryBytes: maxBytes + 4096})
		seq, out, stats, timers, acked = 0, outbox{}, Stats{}, nil, map[uint64]bool{}
		ls.nextID = func() uint64 { seq++; return seq }
		ls.out = &out
		ls.stats = &stats
		ls.after = func(_ time.Duration, fn func()) *deadline {
			timers = append(timers, fn)
			return &deadline{}
		}
		ls.backoff = func() *backoff.ExponentialBackOff { return backoff.NewExponentialBackOff() }
	}
	needed := func(r *appendReq) *appendReq {
		if acked[r.t.id] {
			return nil
		}
		return r
	}
	sent := func() string {
		var b strings.Builder
		for _, a := range out.acts {
			ap := a.Append
			var items []string
			for _, it := range ap.Items {
				var vs []string
				for _, v := range it.VChannels {
					vs = append(vs, string(v))
				}
				items = append(items, string(it.Message)+"("+strings.Join(vs, ",")+")")
			}
			fmt.Fprintf(&b, "append %d lane=%s: %s\n", ap.ID, ap.Lane, strings.Join(items, " "))
		}
		out.acts = out.acts[:0]
		fmt.Fprintf(&b, "in flight %d", ls.inflight)
		return b.String()
	}
	reset(1, 1000)
	runScript(t, "testdata/lanes.txt", func(t *testing.T, d *scriptCmd) string {
		switch d.name {
		case "new":
			reset(int(d.uintOr(t, "concurrency", 1)), int(d.uintOr(t, "max", 1000)))
			return ""
		case "queue":
			id := d.uint(t, "task")
			tk := &task{id: id}
			var vs []message.VChannel
			var idx []int
			for i, v := range d.strs("vcs") {
				vs, idx = append(vs, message.VChannel(v)), append(idx, i)
			}
			r := &appendReq{t: tk, idx: idx, item: wal.Item{Message: []byte("t" + strconv.FormatUint(id, 10)), VChannels: vs},
				exclusive: d.has("exclusive")}
			r.size = int(d.uintOr(t, "size", uint64(wal.EncodedSize(r.item))))
			l := ls.lane(message.PChannel(d.str(t, "lane")))
			l.queue = append(l.queue, r)
			return ""
		case "acked":
			acked[d.uint(t, "task")] = true
			return ""
		case "start":
			ls.start(needed)
			return sent()
		case "answer":
			b := ls.answered(d.uint(t, "id"))
			if b == nil {
				return "no such append in flight"
			}
			switch {
			case d.has("ok"):
				ls.done(b)
				ls.recycle(b)
			case d.has("too-large"):
				if ls.split(b) {
					return sent()
				}
				ls.retry(b)
			default:
				ls.retry(b)
			}
			ls.start(needed)
			return sent()
		case "tick":
			fire := timers
			timers = nil
			for _, fn := range fire {
				fn()
			}
			ls.start(needed)
			return sent()
		case "lanes":
			var b strings.Builder
			for _, l := range ls.list {
				var q []string
				for _, r := range l.queue {
					q = append(q, string(r.item.Message))
				}
				fmt.Fprintf(&b, "%s: queue (%s)", l.name, strings.Join(q, ","))
				if l.batch != nil {
					fmt.Fprintf(&b, " batch %d in flight %v waiting %v", l.batch.id, l.batch.inFlight, l.waiting)
				}
				b.WriteString("\n")
			}
			fmt.Fprintf(&b, "rounds %d", stats.AppendRounds)
			return b.String()
		}
		t.Fatalf("%s: unknown command %s", d.pos, d.name)
		return ""
	})
}
