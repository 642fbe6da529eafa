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

	"github.com/walcast/walcast/internal/retry"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// TestR8_3_ScannerScript runs testdata/scanner.txt: the WAL reads a force
// promote needs (R8.3). Every pchannel is read from its entry offset to the
// end, each by a Scan of its own; a read that failed is read again whole
// after the backoff (a partial read could append a copy twice), and the
// promote hears once, with every copy found, when every read succeeded.
//
// Commands:
//
//	new                                a scanner
//	all from=(P:OFFSET,...)            read those pchannels
//	scanned id=N [found=(ID:V:POS,...)] [err=TEXT]
//	                                   scan N's result: copies of broadcast ID on vchannel V at POS
//	timers                             the retries due run
func TestR8_3_ScannerScript(t *testing.T) {
	var (
		sc     scanner
		out    []string
		timers []func()
		acts   outbox
	)
	log := slog.New(slog.DiscardHandler)
	flush := func() string {
		for _, a := range acts.acts {
			if a.Kind == ActScan {
				out = append(out, fmt.Sprintf("scan %d: %s from %d", a.Scan.ID, a.Scan.PChannel, a.Scan.From))
			}
		}
		acts.acts = acts.acts[:0]
		return takeLines(&out)
	}
	runScript(t, "testdata/scanner.txt", func(t *testing.T, d *scriptCmd) string {
		switch d.name {
		case "new":
			var ids uint64
			pol := retry.Policy{Initial: 100 * time.Millisecond}
			out, timers, acts = nil, nil, outbox{}
			sc = scanner{ops: make(map[uint64]*scanOp), nextID: func() uint64 { ids++; return ids }, out: &acts, log: log,
				after: func(dur time.Duration, fn func()) *deadline {
					out = append(out, fmt.Sprintf("retry in %s", dur))
					timers = append(timers, fn)
					return &deadline{}
				},
				backoff: func() *backoff.ExponentialBackOff { return pol.Schedule() }}
			return ""
		case "all":
			from := map[message.PChannel]uint64{}
			for _, f := range d.strs("from") {
				p, off, _ := strings.Cut(f, ":")
				n, err := strconv.ParseUint(off, 10, 64)
				if err != nil {
					t.Fatalf("%s: from %q", d.pos, f)
				}
				from[message.PChannel(p)] = n
			}
			sc.all(from, func(found []Found) {
				var fs []string
				for _, f := range found {
					fs = append(fs, fmt.Sprintf("%d:%s:%d", f.ID, f.VChannel, f.Checkpoint.MessageID))
				}
				out = append(out, fmt.Sprintf("done: found (%s)", strings.Join(fs, ",")))
			})
			return flush()
		case "scanned":
			var found []Found
			for _, f := range d.strs("found") {
				parts := strings.Split(f, ":")
				if len(parts) != 3 {
					t.Fatalf("%s: found %q", d.pos, f)
				}
				id, err1 := strconv.ParseUint(parts[0], 10, 64)
				pos, err2 := strconv.ParseUint(parts[2], 10, 64)
				if err1 != nil || err2 != nil {
					t.Fatalf("%s: found %q", d.pos, f)
				}
				found = append(found, Found{ID: id, VChannel: message.VChannel(parts[1]), Checkpoint: wal.Checkpoint{MessageID: pos}})
			}
			var err error
			if d.has("err") {
				err = errors.New(d.str(t, "err"))
			}
			sc.scanned(Scanned{ID: d.uint(t, "id"), Found: found, Err: err})
			return flush()
		case "timers":
			due := timers
			timers = nil
			for _, fn := range due {
				fn()
			}
			return flush()
		}
		t.Fatalf("%s: unknown command %s", d.pos, d.name)
		return ""
	})
}
