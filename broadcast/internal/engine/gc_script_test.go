package engine

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestR6_1_GCVictimsScript runs testdata/gc.txt: which tombstones a GC run
// deletes — per retention class the oldest beyond MaxCount (early, before
// their MaxLifetime: R6.4) and those past MaxLifetime (R6.1), in completion
// order, a finished group's tombstones together (R13.3), as many as one
// catalog transaction holds; below a batch beyond MaxCount, a periodic run
// waits unless one of those is aged.
//
// Commands:
//
//	new classes=(name:maxCount:maxLifetime,...) [maxops=N]
//	tomb id=I class=C at=DURATION [run=N]   a tombstone completed at DURATION
//	collect now=DURATION [all]              the victims, then deleted
//	classes                                 each class's tombstones
func TestR6_1_GCVictimsScript(t *testing.T) {
	var (
		ts     tombstones
		maxOps int
	)
	at := func(d *scriptCmd, key string) int64 {
		v, err := time.ParseDuration(d.str(t, key))
		if err != nil {
			t.Fatalf("%s: %s: %v", d.pos, key, err)
		}
		return int64(v)
	}
	runScript(t, "testdata/gc.txt", func(t *testing.T, d *scriptCmd) string {
		switch d.name {
		case "new":
			var classes []Class
			for _, c := range d.strs("classes") {
				f := strings.Split(c, ":")
				if len(f) != 3 {
					t.Fatalf("%s: class %q: want name:maxCount:maxLifetime", d.pos, c)
				}
				n, err1 := strconv.Atoi(f[1])
				life, err2 := time.ParseDuration(f[2])
				if err1 != nil || err2 != nil {
					t.Fatalf("%s: class %q", d.pos, c)
				}
				classes = append(classes, Class{Name: f[0], MaxCount: n, MaxLifetime: life})
			}
			ts = tombstones{}
			ts.init(classes)
			maxOps = int(d.uintOr(t, "maxops", 128))
			return ""
		case "tomb":
			cls := scriptClass(t, d, &ts)
			tb := ts.newTomb(d.uint(t, "id"), nil, at(d, "at"), cls, false)
			tb.run = uint16(d.uintOr(t, "run", 0))
			ts.push(tb)
			return ""
		case "collect":
			vs := ts.victims(at(d, "now"), maxOps, d.has("all"), 0)
			var out []string
			for _, v := range vs {
				s := fmt.Sprintf("%d (%s)", v.tb.id, v.cl.cfg.Name)
				if v.early {
					s += " early"
				}
				out = append(out, s)
				ts.dropOldest(v.cl, 1)
			}
			if len(out) == 0 {
				return "none"
			}
			return strings.Join(out, "\n")
		case "classes":
			var out []string
			for _, cl := range ts.classes {
				var ids []string
				for _, tb := range cl.order[cl.head:] {
					ids = append(ids, strconv.FormatUint(tb.id, 10))
				}
				if len(ids) == 0 {
					ids = []string{"(none)"}
				}
				out = append(out, fmt.Sprintf("%s: %s", cl.cfg.Name, strings.Join(ids, " ")))
			}
			return strings.Join(out, "\n")
		}
		t.Fatalf("%s: unknown command %s", d.pos, d.name)
		return ""
	})
}
