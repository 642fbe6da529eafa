package engine

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/walcast/walcast/message"
)

// TestR8_1_RolesScript runs testdata/roles.txt: the role a topology gives
// this cluster (R8.1), what AlterReplicateConfig's callback stores — a
// replicated change that a force promote overtook ignored (R8.3), a force
// promote's new generation (R8.5), a primary's own change keeping its
// generation — and applying what it stored.
//
// Commands:
//
//	new cluster=NAME
//	set primary=P [generation=N]            a stored topology applied
//	fence                                   a force promote has every ack
//	alter id=I [primary=P] [force] [generation=N] [replicated]
//	                                        AlterReplicateConfig's callback
//	apply id=I                              its stored topology applied
//	role                                    the role and topology
func TestR8_1_RolesScript(t *testing.T) {
	var (
		r    roles
		out  outbox
		done map[uint64]*task
	)
	show := func() string {
		var b strings.Builder
		for _, a := range out.acts {
			if rc := a.RoleChanged; a.Kind == ActRoleChanged {
				fmt.Fprintf(&b, "role changed: %s (primary %q, generation %d)\n", rc.Role, rc.Config.Primary, rc.Config.Generation)
			}
		}
		out.acts = out.acts[:0]
		return strings.TrimSuffix(b.String(), "\n")
	}
	runScript(t, "testdata/roles.txt", func(t *testing.T, d *scriptCmd) string {
		switch d.name {
		case "new":
			log := slog.New(slog.DiscardHandler)
			r = roles{cluster: d.str(t, "cluster"), prefix: "/p", out: &out,
				log: func(*task) *slog.Logger { return log }}
			out, done = outbox{}, make(map[uint64]*task)
			return ""
		case "set":
			r.set(ReplicateConfig{Primary: d.str(t, "primary"), Generation: d.uintOr(t, "generation", 0)})
			return show()
		case "fence":
			r.fenced = true
			return ""
		case "alter":
			cfg := ReplicateConfig{ForcePromote: d.has("force"), Generation: d.uintOr(t, "generation", 0)}
			if d.has("primary") {
				cfg.Primary = d.str(t, "primary")
			}
			payload, err := json.Marshal(cfg)
			if err != nil {
				t.Fatal(err)
			}
			m := &message.Message{Type: AlterReplicateConfig, Payload: payload}
			m.Broadcast.ID = d.uint(t, "id")
			m.Broadcast.VChannels = []message.VChannel{"v1"}
			if d.has("replicated") {
				m.Replicate = &message.ReplicateHeader{SourceCluster: "a"}
			}
			x := newTask(m, nil, message.TypeInfo{}, timeZero)
			ops, o, err := r.callback(x)
			if err != nil {
				return "error: " + err.Error()
			}
			x.outcome = o
			done[x.id] = x
			s := fmt.Sprintf("%s: %s", o.Status, o.Detail)
			for _, op := range ops {
				s += fmt.Sprintf("\nput %s %s", op.Key, op.Value)
			}
			return s
		case "apply":
			x := done[d.uint(t, "id")]
			if x == nil {
				t.Fatalf("%s: no alter %d", d.pos, d.uint(t, "id"))
			}
			r.apply(x)
			if s := show(); s != "" {
				return s
			}
			return "unchanged"
		case "role":
			return fmt.Sprintf("%s (primary %q, generation %d, replaced %q, fenced %v)", r.role, r.cfg.Primary, r.cfg.Generation, r.cfg.Replaced, r.fenced)
		}
		t.Fatalf("%s: unknown command %s", d.pos, d.name)
		return ""
	})
}
