package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// script drives one simulated cluster by hand, for the scenarios and the
// engine rules that need an exact interleaving: no random move, no fault
// but those a scenario injects; the checker watches every write as in a
// seeded run.
type script struct {
	t *testing.T
	w *world
	c *cluster
}

func newScript(t *testing.T, secondary bool, maxCount int) *script {
	t.Helper()
	w := &world{cfg: Config{Seed: 1, Trace: true, Mutation: flagMutation(t)}, rng: rand.New(rand.NewPCG(1, 0x5eed)), now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		failing: map[uint64]int{}, maxCount: maxCount}
	w.check = newChecker(w)
	name := "east"
	if secondary {
		name = "west" // follow() makes "west" follow "east"
	}
	w.primary = newCluster(w, name, 0)
	s := &script{t: t, w: w, c: w.primary}
	if err := s.c.start(); err != nil {
		t.Fatal(err)
	}
	if secondary {
		w.second = w.primary // follow() works on w.second
		w.follow()
		w.second = nil
		s.noViolation()
	}
	return s
}

func (s *script) noViolation() {
	s.t.Helper()
	if s.w.err != nil {
		s.t.Fatalf("%v\ntrace:\n%s", s.w.err, s.traceTail())
	}
}

func (s *script) traceTail() string {
	tr := s.w.trace
	if len(tr) > 80 {
		tr = tr[len(tr)-80:]
	}
	out := ""
	for _, l := range tr {
		out += l + "\n"
	}
	return out
}

// settle completes every op hold does not hold, firing the retries that
// come due within a second, until nothing else can happen.
func (s *script) settle(hold func(engine.Action) bool) {
	s.t.Helper()
	for range 10000 {
		i := slices.IndexFunc(s.c.ops, func(o *op) bool { return o.gen != s.c.gen || hold == nil || !hold(o.a) })
		if i >= 0 {
			s.c.complete(i)
			continue
		}
		if s.c.down {
			return
		}
		d, ok := s.c.core.Deadline()
		if !ok || d.Sub(s.w.now) > time.Second {
			s.noViolation()
			return
		}
		if d.After(s.w.now) {
			s.w.now = d
		}
		s.c.step(engine.Tick{})
	}
	s.t.Fatal("settle: no end")
}

// sent is a request of a script and its reply, once it came.
type sent struct {
	r     *request
	reply *engine.Reply
	then  func(engine.Reply)
}

// send steps a request and returns it, to read its reply later.
func (s *script) send(ev engine.Event, name string) *sent {
	x := &sent{}
	x.r = &request{w: s.w, label: name, c: s.c, onReply: func(a engine.Reply) {
		x.reply = &a
		if x.then != nil {
			x.then(a)
		}
	}}
	s.c.step(withTarget(ev, x.r))
	return x
}

// call is a client's broadcast: its Lock, then its Submit.
type call struct {
	h      engine.HandleID
	lock   *sent
	submit *sent
}

// result is the Submit's reply (nil until the task finished), or the
// failed Lock's or Resolve's.
func (c *call) result() *engine.Reply {
	if c.submit != nil {
		return c.submit.reply
	}
	if c.lock != nil && c.lock.reply != nil && c.lock.reply.Err != nil {
		return c.lock.reply
	}
	return nil
}

// broadcast runs a client's Lock and Submit (with Resolve first for a keyed
// one); a Lock that waits submits once granted.
func (s *script) broadcast(typ message.Type, key message.IdempotencyKey, keys []resource.Key, targets ...message.VChannel) *call {
	s.t.Helper()
	c := &call{h: s.w.newHandle()}
	if key != "" {
		r := s.send(engine.Resolve{Handle: c.h, Scope: engine.ScopeOf(typ, key), Key: key, CheckNew: true}, "resolve")
		if r.reply == nil || r.reply.Err != nil || !r.reply.Admitted {
			c.submit = r
			return c
		}
	}
	norm, err := resource.WithClusterKey(keys)
	if err != nil {
		s.t.Fatal(err)
	}
	submit := func() *sent {
		var opts []message.Option
		if key != "" {
			opts = append(opts, message.WithIdempotencyKey(key))
		}
		m, err := message.NewBroadcast(typ, []byte("p"), targets, opts...)
		if err != nil {
			s.t.Fatal(err)
		}
		st, raw, err := stampForSubmit(s.c, m, norm)
		if err != nil {
			s.t.Fatal(err)
		}
		return s.send(engine.Submit{Handle: c.h, Msg: st, Bytes: raw}, "submit")
	}
	c.lock = s.send(engine.Lock{Handle: c.h, Keys: norm, Need: engine.Primary}, "lock")
	switch {
	case c.lock.reply == nil:
		c.lock.then = func(a engine.Reply) {
			if a.Err == nil {
				c.submit = submit()
			}
		}
	case c.lock.reply.Err == nil:
		c.submit = submit()
	}
	return c
}

// ack acks one copy as a node does and returns the request.
func (s *script) ack(m *message.Message, v message.VChannel, pos uint64) *sent {
	a := engine.Ack{ID: m.Broadcast.ID, VChannel: v, Msg: m, Checkpoint: wal.Checkpoint{MessageID: pos, TimeTick: pos, LastConfirmed: pos}}
	x := s.send(a, fmt.Sprintf("ack%d", m.Broadcast.ID))
	// A replicated ack is answered once durable: complete its write (and
	// only that).
	for x.reply == nil {
		i := slices.IndexFunc(s.c.ops, func(o *op) bool { return o.a.Kind == engine.ActWrite && o.a.Write.Kind == engine.WriteAcks })
		if i < 0 {
			break
		}
		s.c.complete(i)
	}
	return x
}

// replicated builds a message replicated from a primary.
func replicatedMsg(id uint64, typ message.Type, targets []message.VChannel, keys ...resource.Key) *message.Message {
	keys, _ = resource.WithClusterKey(keys)
	return &message.Message{Type: typ, Payload: []byte(fmt.Sprint("r", id)),
		Broadcast: message.BroadcastHeader{ID: id, VChannels: append(targets, pchans[0].Control()), ResourceKeys: keys},
		Replicate: &message.ReplicateHeader{SourceCluster: "primary", SourcePChannel: "wal-0"}}
}

// applied returns the broadcasts whose callback took effect, in order.
func (s *script) applied() []uint64 {
	var ids []uint64
	for _, a := range s.w.check.facts(s.c).applied {
		ids = append(ids, a.id)
	}
	return ids
}

func (s *script) stage(id uint64) engine.Stage {
	st := engine.Tombstoned
	if live, _, _, ok := s.c.core.View().TaskByID(id); ok && live != nil {
		st = live.Stage
	} else if !ok {
		st = engine.StageNone
	}
	return st
}

func (s *script) effect(id uint64) uint64 {
	if v, err := s.c.cat.Get(context.Background(), effectKey(id)); err == nil {
		return beUint64(v)
	}
	return 0
}

func isCallback(id uint64) func(engine.Action) bool {
	return func(a engine.Action) bool {
		return a.Kind == engine.ActCallback && a.Callback.Task == id
	}
}

func vc(p int, name string) message.VChannel {
	return message.VChannel(fmt.Sprintf("wal-%d/%s", p, name))
}

// promote starts a force promote as ForcePromote does: the exclusive
// Cluster key on a secondary, then the promote's broadcast.
func (s *script) promote() *call {
	s.t.Helper()
	c := &call{h: s.w.newHandle()}
	keys := []resource.Key{resource.ExclusiveCluster()}
	submit := func() *sent {
		payload, _ := json.Marshal(engine.ReplicateConfig{Primary: s.c.name, ForcePromote: true})
		m, err := message.NewBroadcast(engine.AlterReplicateConfig, payload, s.c.cfg.ControlTargets, message.WithAckSyncUp())
		if err != nil {
			s.t.Fatal(err)
		}
		st, _, err := stampForSubmit(s.c, m, keys)
		if err != nil {
			s.t.Fatal(err)
		}
		st.Properties = map[string]string{engine.UnreplicableProperty: engine.ForcePromoteMark}
		raw, err := message.Marshal(st)
		if err != nil {
			s.t.Fatal(err)
		}
		return s.send(engine.Submit{Handle: c.h, Msg: st, Bytes: raw}, "promote")
	}
	c.lock = s.send(engine.Lock{Handle: c.h, Keys: keys, Need: engine.Secondary}, "promote/lock")
	if c.lock.reply == nil {
		c.lock.then = func(a engine.Reply) {
			if a.Err == nil {
				c.submit = submit()
			}
		}
	} else if c.lock.reply.Err == nil {
		c.submit = submit()
	}
	return c
}

// consume lets the nodes read and ack everything they can, settling after
// each step.
func (s *script) consume(hold func(engine.Action) bool) {
	for range 200 {
		moved := false
		for _, n := range s.c.nodes {
			if n.ready() {
				n.next()
				moved = true
				s.settle(hold)
			}
		}
		if !moved {
			return
		}
	}
}

// supplements counts, per vchannel, the copies of broadcast id in the WAL
// without a replicate header.
func (s *script) copies(id uint64) map[message.VChannel]int {
	out := map[message.VChannel]int{}
	for _, lane := range s.c.lanes {
		for off, data := range s.c.log.Entries(lane) {
			cs, _ := wal.Decode(uint64(off), data)
			for _, cp := range cs {
				if cp.Message.Broadcast.ID == id && cp.Message.Replicate == nil {
					out[cp.VChannel]++
				}
			}
		}
	}
	return out
}

// replicate appends a replicated message's copies to the cluster's WAL, as
// the replicator does.
func (s *script) replicate(m *message.Message, vs ...message.VChannel) {
	s.t.Helper()
	raw, err := message.Marshal(m)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, v := range vs {
		if _, err := s.c.wal.AppendSalted(context.Background(), v.PChannel(), "replicator", []wal.Item{{Message: raw, VChannels: []message.VChannel{v}}}); err != nil {
			s.t.Fatal(err)
		}
	}
}
