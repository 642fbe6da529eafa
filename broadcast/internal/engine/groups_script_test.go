package engine

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// TestR13_5_GroupTableScript runs testdata/groups.txt: the open groups and
// their owner keys — an owner key held by one group at a time (R13.7),
// replicated members placed in their groups, a malformed replicated group
// header refused before anything is written (R13.1, R13.2), and the
// members a secondary never received, which a force promote refuses to
// start over and, once fenced, completes others after as Ignored (R13.5).
//
// Commands:
//
//	new [max=N]                            a table of groups of up to N members
//	begin id=I [owner=K]                   a local Begin opens a group
//	replicated id=I kind=K [group=G] [seq=S] [owner=K] [keys=(a,b)]
//	                                       a replicated broadcast's first ack
//	gaps                                   the first missing member per group
//	ignore                                 the members a force promote ignores
//	groups                                 the open groups and owner keys
func TestR13_5_GroupTableScript(t *testing.T) {
	var gt groupTable
	tasks := map[uint64]*task{}
	reset := func(max int) {
		gt = newGroupTable(max)
		tasks = map[uint64]*task{}
	}
	kinds := map[string]message.GroupKind{"begin": message.GroupBegin, "body": message.GroupBody,
		"commit": message.GroupCommit, "rollback": message.GroupRollback}
	msgOf := func(d *scriptCmd, kind message.GroupKind) *message.Message {
		m := &message.Message{Type: message.Type{Name: "t", Version: 1}}
		m.Broadcast.ID = d.uint(t, "id")
		m.Broadcast.VChannels = []message.VChannel{"v1"}
		for _, k := range d.strs("keys") {
			m.Broadcast.ResourceKeys = append(m.Broadcast.ResourceKeys, resource.ExclusiveDatabase(k))
		}
		m.Group = &message.GroupHeader{ID: d.uintOr(t, "group", 0), Seq: uint32(d.uintOr(t, "seq", 0)), Kind: kind}
		if d.has("owner") {
			m.Group.OwnerKey = d.str(t, "owner")
		}
		return m
	}
	reset(0)
	runScript(t, "testdata/groups.txt", func(t *testing.T, d *scriptCmd) string {
		switch d.name {
		case "new":
			reset(int(d.uintOr(t, "max", 0)))
			return fmt.Sprintf("max members %d", gt.maxMembers)
		case "begin":
			m := msgOf(d, message.GroupBegin)
			if err := gt.checkBegin(m); err != nil {
				return "refused: " + err.Error()
			}
			tk := newTask(m, nil, message.TypeInfo{}, time.Time{})
			tasks[tk.id] = tk
			return fmt.Sprintf("opened group %d", gt.openGroup(tk).id)
		case "replicated":
			kind, ok := kinds[d.str(t, "kind")]
			if !ok {
				t.Fatalf("%s: kind %s", d.pos, d.str(t, "kind"))
			}
			m := msgOf(d, kind)
			if err := gt.replicatedError(m); err != nil {
				return "refused: " + err.Error()
			}
			tk := newTask(m, nil, message.TypeInfo{}, time.Time{})
			tasks[tk.id] = tk
			return fmt.Sprintf("in group %d", gt.groupOf(tk).id)
		case "gaps":
			if gaps := gt.gaps(); len(gaps) > 0 {
				return strings.Join(gaps, "\n")
			}
			return "none"
		case "ignore":
			gt.ignoreUnordered(slog.New(slog.DiscardHandler))
			var out []string
			for _, id := range sortedKeys(tasks) {
				if x := tasks[id]; x.ignore != nil {
					out = append(out, fmt.Sprintf("%d: %s", id, x.ignore.Detail))
				}
			}
			if len(out) == 0 {
				return "none"
			}
			return strings.Join(out, "\n")
		case "groups":
			var out []string
			for _, id := range sortedKeys(gt.open) {
				g := gt.open[id]
				live := slices.Sorted(maps.Keys(g.live))
				out = append(out, fmt.Sprintf("%s %d: begin %v, live %v, next %d", groupWord(g), g.id, g.begin != nil, live, g.next))
			}
			for _, k := range slices.Sorted(maps.Keys(gt.owners)) {
				out = append(out, fmt.Sprintf("owner key %s: group %d", k, gt.owners[k]))
			}
			if len(out) == 0 {
				return "none"
			}
			return strings.Join(out, "\n")
		}
		t.Fatalf("%s: unknown command %s", d.pos, d.name)
		return ""
	})
}
