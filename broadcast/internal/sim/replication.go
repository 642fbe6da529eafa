package sim

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// The replication scenario (SPEC §8): the secondary ("west") follows the
// primary ("east"); a replicator copies every primary entry, in order, into
// the same pchannel of the secondary with a replicate header; the
// secondary's nodes ack the copies, which creates REPLICATED tasks. At a
// point the seed picks, the primary is lost (its core stops for good, the
// replicator with it), and the secondary is force-promoted; clients then
// retry on the promoted cluster, whose answers for keys accepted before the
// failover must be the originals (R8.4).

type replicator struct {
	w        *world
	cursors  map[message.PChannel]int
	lost     bool // the primary is gone
	promoted bool
	promote  *request
	handle   engine.HandleID
	// lostAt is the step at which the primary is lost (0: never).
	lostAt int
}

func newReplicator(w *world) *replicator {
	r := &replicator{w: w, cursors: map[message.PChannel]int{}}
	if w.rng.IntN(3) > 0 {
		r.lostAt = 50 + w.rng.IntN(400)
	}
	return r
}

// follow makes the secondary follow the primary before the workload
// starts, with faults off.
func (w *world) follow() {
	c := w.second
	on := w.faultsOn
	w.faultsOn = false
	defer func() { w.faultsOn = on }()
	h := w.newHandle()
	cfg := engine.ReplicateConfig{Primary: "east", Secondaries: []engine.SecondaryConfig{{Name: "west"}}}
	var done bool
	c.step(withTarget(engine.Lock{Handle: h, Keys: []resource.Key{resource.ExclusiveCluster()}}, w.request(c, "follow/lock", func(r engine.Reply) {
		if r.Err != nil {
			w.fail("follow: lock: %v", r.Err)
			return
		}
		c.step(withTarget(engine.Follow{Handle: h, Config: cfg}, w.request(c, "follow", func(r engine.Reply) {
			if r.Err != nil {
				w.fail("follow: %v", r.Err)
			}
			done = true
		}, nil)))
	}, nil)))
	for !done && w.err == nil && len(c.ops) > 0 {
		c.complete(0)
	}
	if !done && w.err == nil {
		w.fail("follow did not finish")
	}
}

func (r *replicator) done() bool {
	if r.lost {
		return r.promoted
	}
	for _, lane := range r.w.primary.lanes {
		if r.behind(lane) {
			return false
		}
	}
	return true
}

// behind reports whether the primary's lane has entries not copied yet.
func (r *replicator) behind(lane message.PChannel) bool {
	_, ok := r.w.primary.log.Entry(lane, uint64(r.cursors[lane]))
	return ok
}

func (r *replicator) moves() []move {
	w := r.w
	var ms []move
	if !r.lost {
		for _, lane := range w.primary.lanes {
			if r.behind(lane) {
				lane := lane
				ms = append(ms, move{weight: 4, do: func() { r.copy(lane) }})
			}
		}
		if r.lostAt > 0 && w.steps >= r.lostAt {
			ms = append(ms, move{weight: 20, do: r.losePrimary})
		}
		return ms
	}
	if !r.promoted && (r.promote == nil || r.promote.done) && !w.second.down {
		ms = append(ms, move{weight: 5, do: r.forcePromote})
	}
	if p := r.promote; p != nil && !p.done && w.faultsOn && !w.second.down {
		// The promote's caller gives up (R11.5): its request is withdrawn,
		// a promote under way goes on, and a later call waits for it.
		ms = append(ms, move{weight: 1, do: func() {
			w.tracef("%s gives up", p.name())
			w.withdraw(w.second, p)
		}})
	}
	return ms
}

// copy replicates the next entry of a primary lane.
func (r *replicator) copy(lane message.PChannel) {
	w := r.w
	i := r.cursors[lane]
	data, _ := w.primary.log.Entry(lane, uint64(i))
	copies, err := wal.Decode(uint64(i), data)
	if err != nil {
		w.fail("replicator: %v", err)
		return
	}
	r.cursors[lane] = i + 1
	var items []wal.Item
	var cur *message.Message
	for _, cp := range copies {
		m0 := cp.Message
		if m0.Properties[engine.UnreplicableProperty] != "" {
			continue
		}
		if m0 != cur {
			cur = m0
			m := *m0
			m.Replicate = &message.ReplicateHeader{SourceCluster: "east", SourcePChannel: cp.VChannel.PChannel(),
				SourceMessageID: cp.Checkpoint.MessageID, SourceTimeTick: cp.Checkpoint.TimeTick}
			raw, err := message.Marshal(&m)
			if err != nil {
				w.fail("replicator: %v", err)
				return
			}
			items = append(items, wal.Item{Message: raw})
		}
		items[len(items)-1].VChannels = append(items[len(items)-1].VChannels, cp.VChannel)
	}
	if len(items) == 0 {
		return
	}
	if _, err := w.second.wal.AppendSalted(context.Background(), lane, "replicator", items); err != nil {
		w.fail("replicator append: %v", err)
	}
}

// losePrimary loses the primary for good.
func (r *replicator) losePrimary() {
	w := r.w
	r.lost = true
	p := w.primary
	p.crash()
	p.down, p.ops = true, nil
	w.tracef("primary lost")
	for _, cl := range w.clients {
		// Clients move to the secondary: keyed requests retry there once it
		// is promoted, and some retry a request the primary accepted, which
		// the promoted cluster must answer with its original (R8.4).
		cl.c = w.second
		if cl.wait != nil && !cl.wait.done {
			cl.wait.lost()
		}
		var keyed []*clientOp
		for _, op := range cl.ops[:cl.cur] {
			if op.key != "" {
				keyed = append(keyed, op)
			}
		}
		if len(keyed) > 0 && w.rng.IntN(2) == 0 {
			old := keyed[w.rng.IntN(len(keyed))]
			again := *old
			again.done, again.tries, again.outcome, again.phase, again.gid = false, 0, "", 0, 0
			cl.ops = append(cl.ops, &again)
		}
	}
}

// forcePromote runs a force promote on the secondary, as ForcePromote does.
func (r *replicator) forcePromote() {
	w := r.w
	c := w.second
	if id := c.core.View().PromoteTask(); id != 0 {
		r.promote = w.request(c, "promote/wait", r.promoted1, func() {})
		c.step(withTarget(engine.Wait{ID: id}, r.promote))
		return
	}
	if role, _ := c.core.View().Role(); role != engine.Secondary {
		r.promoted = true
		return
	}
	r.handle = w.newHandle()
	keys := []resource.Key{resource.ExclusiveCluster()}
	r.promote = w.request(c, "promote/lock", func(rep engine.Reply) {
		if rep.Err != nil {
			return // tried again
		}
		payload, _ := json.Marshal(engine.ReplicateConfig{Primary: "west", ForcePromote: true})
		m, err := message.NewBroadcast(engine.AlterReplicateConfig, payload, c.cfg.ControlTargets, message.WithAckSyncUp())
		if err != nil {
			w.fail("promote message: %v", err)
			return
		}
		st, _, err := stampForSubmit(c, m, keys)
		if err != nil {
			w.fail("promote stamp: %v", err)
			return
		}
		if st.Properties == nil {
			st.Properties = map[string]string{}
		}
		st.Properties[engine.UnreplicableProperty] = engine.ForcePromoteMark
		raw, err := message.Marshal(st)
		if err != nil {
			w.fail("promote encode: %v", err)
			return
		}
		r.promote = w.request(c, "promote/submit", r.promoted1, func() {})
		c.step(withTarget(engine.Submit{Handle: r.handle, Msg: st, Bytes: raw}, r.promote))
	}, func() {})
	c.step(withTarget(engine.Lock{Handle: r.handle, Keys: keys, Need: engine.Secondary}, r.promote))
}

func (r *replicator) promoted1(rep engine.Reply) {
	if rep.Err != nil {
		r.w.tracef("promote: %v", rep.Err)
		return // tried again
	}
	role, cfg := r.w.second.core.View().Role()
	if role != engine.Primary {
		r.w.fail("promote answered but the cluster is %s", role)
		return
	}
	// The promote opened a new replication generation: its id space, above
	// the primary's (R8.5).
	if rep.Result != nil && (cfg.Generation != engine.Space(rep.Result.ID) || cfg.Generation == 0 || cfg.Replaced != "east") {
		r.w.fail("promote %d left generation %d replacing %q, want %d replacing east", rep.Result.ID, cfg.Generation, cfg.Replaced, engine.Space(rep.Result.ID))
		return
	}
	r.promoted = true
	r.w.tracef("promoted")
}

var _ = fmt.Sprint
