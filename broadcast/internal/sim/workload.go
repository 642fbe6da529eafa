package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// request is one request of the engine's API in flight: the core answers
// it exactly once, unless the coordinator crashed first (lost).
type request struct {
	w *world
	// label names the request in traces and failures; labelFn, if set,
	// makes it when first asked (most requests are never named).
	label   string
	labelFn func() string
	c       *cluster
	replied bool
	done    bool // answered, lost, or given up
	// withdrawn says the core was told to withdraw it: it must never be
	// answered after (R11.5).
	withdrawn bool
	// step and at are when it was sent.
	step int
	at   time.Time
	// call is a driver-mode API call's (nil for an engine request).
	call    *driverCall
	onReply func(engine.Reply)
	onLost  func()
}

func (w *world) request(c *cluster, name string, onReply func(engine.Reply), onLost func()) *request {
	r := &request{w: w, label: name, c: c, onReply: onReply, onLost: onLost, step: w.steps, at: w.now}
	w.requests = append(w.requests, r)
	w.open++
	return r
}

// requestf is request with a name made only if it is asked for.
func (w *world) requestf(c *cluster, name func() string, onReply func(engine.Reply), onLost func()) *request {
	r := w.request(c, "", onReply, onLost)
	r.labelFn = name
	return r
}

// name names the request.
func (r *request) name() string {
	if r.labelFn != nil {
		r.label, r.labelFn = r.labelFn(), nil
	}
	return r.label
}

// end marks the request done: answered, lost, or given up.
func (r *request) end() {
	if !r.done {
		r.done = true
		r.w.open--
	}
}

func (r *request) deliver(a engine.Reply) {
	if r.replied {
		r.w.fail("request %s answered twice", r.name())
		return
	}
	r.replied = true
	if r.withdrawn {
		r.w.fail("%s: request %s answered after it was withdrawn (R11.5)", r.c.name, r.name())
		return
	}
	if r.done {
		return // given up (or lost) before the answer came
	}
	r.end()
	r.onReply(a)
}

func (r *request) lost() {
	r.end()
	if r.onLost != nil {
		r.onLost()
	}
}

// giveUp stops waiting (the caller's deadline); a late answer is ignored.
func (r *request) giveUp() { r.end() }

// client runs a few operations one after the other, as an application
// calling the engine's API does: for a keyed request Resolve first (R7.5),
// then Lock, then Submit, and Wait when it turns out a duplicate. It retries
// what was not created, with the same key, gives up waiting now and then,
// and sometimes closes a handle without broadcasting.
type client struct {
	w      *world
	id     int
	c      *cluster
	ops    []*clientOp
	cur    int
	wait   *request // the request the client waits for
	handle engine.HandleID
	until  time.Time // no new request before
	// stuck marks a client of a lost primary: it stops.
	stuck bool
}

type clientOp struct {
	typ     message.Type
	keys    []resource.Key
	targets []message.VChannel
	payload string
	key     message.IdempotencyKey
	tries   int
	done    bool
	outcome string
	// twoPhase appends the first target first (R13.11); local marks the
	// broadcast local-only (R13.13), accepted on any role.
	twoPhase, local bool
	// A group op (R13.1, R13.7): a transaction's Begin (txn) or an owner's
	// (ownerKey set), then members, the last of which ends the group.
	// phase 0 is the Begin, phase i member i; gid is the group once known.
	txn      bool
	ownerKey string
	members  []message.Type
	ends     message.GroupKind
	phase    int
	gid      uint64
	// reconcile marks a reconciler's rollback of a group the promote left
	// open: it has no Begin to fall back to.
	reconcile bool
	// fresh marks a quiescent phase's fresh request (R11.3); probe, one
	// that only resolves its key (a group's Begin key); poison, a
	// broadcast whose callback is poisoned (R11.6).
	fresh, probe, poison bool
	// started is when the op was first tried (its latency's start).
	started time.Time
}

func (op *clientOp) group() bool { return op.txn || op.ownerKey != "" }

func (w *world) makeClients() {
	n := 2 + w.rng.IntN(4)
	for i := range n {
		cl := &client{w: w, id: i, c: w.primary}
		for range 2 + w.rng.IntN(5) {
			cl.ops = append(cl.ops, w.makeOp())
		}
		w.clients = append(w.clients, cl)
	}
	// A poisoned callback (R11.6) in some seeds: a broadcast on keys of
	// its own whose callback fails for ever (an operator completes it) or
	// fails with an error marked permanent (its task ends failed). The op
	// is made in every seed, so that a seed runs the same workload with
	// and without the poison (Config.Poison).
	cl := w.clients[w.rng.IntN(len(w.clients))]
	kind := []string{poisonForever, poisonPermanent}[w.rng.IntN(2)]
	poisoned := w.rng.IntN(4) == 0
	if w.cfg.Poison != nil {
		poisoned = *w.cfg.Poison
	}
	if poisoned {
		op := &clientOp{typ: typCreate, keys: []resource.Key{resource.ExclusiveDatabase("poison")}, payload: kind,
			targets: []message.VChannel{message.VChannel(string(pchans[2]) + "/poison")}, key: message.ClusterKey("poison"), poison: true}
		cl.ops = append(cl.ops[:len(cl.ops)/2], append([]*clientOp{op}, cl.ops[len(cl.ops)/2:]...)...)
	}
}

// Payloads of a poisoned broadcast's callback (R11.6): it fails for ever,
// or with an error the application marks permanent.
const (
	poisonForever   = "poison-forever"
	poisonPermanent = "poison-permanent"
)

// makeOp picks an operation: a type, conflicting or not keys, targets, and
// (often) an idempotency key from a small pool, so that retries and
// concurrent requests share scopes.
func (w *world) makeOp() *clientOp {
	t := types[w.rng.IntN(len(types))]
	op := &clientOp{typ: t.typ, payload: fmt.Sprint("p", w.rng.IntN(3))}
	defer w.makeGroupOp(op)
	coll := fmt.Sprint("c", w.rng.IntN(3))
	switch w.rng.IntN(3) {
	case 0:
		op.keys = []resource.Key{resource.SharedDatabase("db"), resource.ExclusiveCollection("db", coll)}
	case 1:
		op.keys = []resource.Key{resource.SharedDatabase("db"), resource.SharedCollection("db", coll)}
	default:
		op.keys = []resource.Key{resource.ExclusiveDatabase(fmt.Sprint("db", w.rng.IntN(2)))}
	}
	for _, p := range pchans {
		if w.rng.IntN(2) == 0 {
			op.targets = append(op.targets, message.VChannel(string(p)+"/"+coll))
		}
	}
	if len(op.targets) == 0 {
		op.targets = []message.VChannel{message.VChannel(string(pchans[1]) + "/" + coll)}
	}
	if w.rng.IntN(3) > 0 {
		op.key = message.ClusterKey(fmt.Sprint("k", w.rng.IntN(6)))
	}
	return op
}

// makeGroupOp turns some ops into group ops, two-phase appends or
// local-only broadcasts (R13). Group ops are always keyed: a client that
// lost an answer must be able to tell whether its Begin or member was
// created, and a group left open would hold its keys for ever.
func (w *world) makeGroupOp(op *clientOp) {
	switch r := w.rng.IntN(10); {
	case r < 2:
		op.txn = true
		op.typ, op.payload = typCreate, "begin"
		for range w.rng.IntN(4) {
			op.members = append(op.members, typCreate)
		}
		op.members = append(op.members, typCreate)
		op.ends = []message.GroupKind{message.GroupCommit, message.GroupRollback}[w.rng.IntN(2)]
		op.key = message.ClusterKey(fmt.Sprint("t", w.rng.IntN(4)))
	case r < 3:
		// The owner key is the idempotency key's: a retry, or another
		// client with the same key, sends the same request.
		n := w.rng.IntN(4)
		op.ownerKey = fmt.Sprint("own/", n%3)
		op.typ, op.payload = typOwner, op.ownerKey
		op.ends = []message.GroupKind{message.GroupCommit, message.GroupRollback}[w.rng.IntN(2)]
		op.members = []message.Type{map[message.GroupKind]message.Type{message.GroupCommit: typEnd, message.GroupRollback: typRoll}[op.ends]}
		op.key = message.ClusterKey(fmt.Sprint("o", n))
	case r < 4 && len(op.targets) > 0:
		op.twoPhase = true
	case r < 5:
		op.local = true
	}
}

func (cl *client) done() bool { return cl.stuck || cl.cur >= len(cl.ops) }

func (cl *client) describe() string {
	s := fmt.Sprintf("client %d on %s: op %d/%d", cl.id, cl.c.name, cl.cur, len(cl.ops))
	if cl.wait != nil && !cl.wait.done {
		s += " waiting for " + cl.wait.name()
	}
	return s
}

// ready returns what the client can do now, moveDo if nothing.
func (cl *client) ready() moveKind {
	if cl.done() || cl.c.down {
		return moveDo
	}
	if w := cl.w; w.repl != nil && w.repl.lost && !w.repl.promoted || w.awaitPromote {
		return moveDo // waits for the promote to retry there
	}
	if cl.wait != nil && !cl.wait.done {
		if cl.w.faultsOn && cl.w.rng.IntN(40) == 0 {
			return moveClientGiveUp
		}
		return moveDo
	}
	if cl.w.now.Before(cl.until) {
		if cl.w.faultsOn {
			return moveDo
		}
		cl.until = time.Time{}
	}
	return moveClientStart
}

func (cl *client) op() *clientOp { return cl.ops[cl.cur] }

// scope is the idempotency scope of the current operation, zero if it is
// unkeyed or a group's (whose phases are answered with their members').
func (cl *client) scope() engine.Scope {
	if op := cl.op(); !op.group() {
		return engine.ScopeOf(op.typ, op.key)
	}
	return engine.Scope{}
}

// retry schedules the current operation again a little later.
func (cl *client) retry(why string) {
	op := cl.op()
	op.tries++
	cl.w.tracef("client %d: retry op %d (%s)", cl.id, cl.cur, why)
	if op.key == "" && why != "not created" {
		// Unkeyed: the caller cannot know what happened; it moves on.
		cl.next("unknown: " + why)
		return
	}
	if op.tries > 20 && !op.group() {
		// A group once begun is driven to its end: open, it would hold its
		// keys for ever.
		cl.next("gave up: " + why)
		return
	}
	cl.until = cl.w.now.Add(time.Duration(1+cl.w.rng.IntN(50)) * time.Millisecond)
}

func (cl *client) next(outcome string) {
	op := cl.op()
	op.done, op.outcome = true, outcome
	if !op.poison && !op.group() && !op.fresh && (strings.HasPrefix(outcome, "broadcast ") || strings.HasPrefix(outcome, "duplicate of ")) {
		cl.w.latencies = append(cl.w.latencies, cl.w.now.Sub(op.started))
	}
	cl.w.tracef("client %d: op %d %s", cl.id, cl.cur, outcome)
	cl.cur++
}

// start begins the current operation.
func (cl *client) start() {
	op := cl.op()
	if op.started.IsZero() {
		op.started = cl.w.now
	}
	cl.handle = cl.w.newHandle()
	if cl.c.driver && op.group() {
		cl.startDrivenGroup()
		return
	}
	if op.group() && op.phase > 0 {
		cl.startMember()
		return
	}
	if cl.c.driver {
		cl.startDriven()
		return
	}
	if op.key != "" {
		sc := engine.ScopeOf(op.typ, op.key)
		cl.w.noteScope(op.typ, op.key)
		cl.send(engine.Resolve{Handle: cl.handle, Scope: sc, Key: op.key, CheckNew: true}, "resolve", func(r engine.Reply) {
			switch {
			case r.Err != nil:
				cl.failed(r.Err)
			case r.Original != nil:
				cl.duplicate(r.Original)
			case op.probe:
				// Admitted: the key is new work again; a group's Begin is
				// not opened for it.
				cl.c.step(engine.Close{Handle: cl.handle})
				cl.next("admitted as new work")
			default:
				cl.lock()
			}
		})
		return
	}
	cl.lock()
}

func (cl *client) lock() {
	op := cl.op()
	keys, err := resource.WithClusterKey(op.keys)
	if err != nil {
		cl.w.fail("workload keys: %v", err)
		return
	}
	need := engine.Primary
	if op.local {
		need = 0
	}
	cl.send(engine.Lock{Handle: cl.handle, Keys: keys, Need: need}, "lock", func(r engine.Reply) {
		if r.Err != nil {
			cl.failed(r.Err)
			return
		}
		if cl.w.rng.IntN(10) == 0 {
			// Validation under the locks failed: the handle is closed
			// without a broadcast (R3.6).
			cl.c.step(engine.Close{Handle: cl.handle})
			cl.retry("closed unused")
			return
		}
		cl.submit(keys)
	})
}

func (cl *client) submit(keys []resource.Key) {
	op := cl.op()
	var opts []message.Option
	if op.key != "" {
		opts = append(opts, message.WithIdempotencyKey(op.key))
	}
	if op.twoPhase {
		opts = append(opts, message.WithAppendFirst(op.targets[0]), message.WithCopy(op.targets[0], "fence", nil))
	}
	if op.local {
		opts = append(opts, message.WithProperty(engine.UnreplicableProperty, engine.LocalMark))
	}
	m, err := message.NewBroadcast(op.typ, []byte(op.payload), op.targets, opts...)
	if err != nil {
		cl.w.fail("workload message: %v", err)
		return
	}
	switch {
	case op.txn:
		m.Group = &message.GroupHeader{Kind: message.GroupBegin}
	case op.ownerKey != "":
		m.Group = &message.GroupHeader{Kind: message.GroupBegin, OwnerKey: op.ownerKey}
	}
	st, raw, err := stampForSubmit(cl.c, m, keys)
	if err != nil {
		cl.w.fail("workload stamp: %v", err)
		return
	}
	cl.send(engine.Submit{Handle: cl.handle, Msg: st, Bytes: raw}, "submit", func(r engine.Reply) {
		switch {
		case r.Err != nil:
			cl.failed(r.Err)
		case r.Original != nil:
			cl.duplicate(r.Original)
		default:
			cl.w.check.answered(cl.c, r.Result.ID, false, cl.scope())
			cl.succeeded(r.Result.ID, fmt.Sprintf("broadcast %d", r.Result.ID))
		}
	})
}

// succeeded moves on after broadcast id answered the current phase: a
// plain op is done; a group op goes to its next member, or is done after
// its end (or when its Begin did not open a group).
func (cl *client) succeeded(id uint64, outcome string) {
	op := cl.op()
	if !op.group() {
		cl.next(outcome)
		return
	}
	if op.phase == 0 {
		op.gid = id
		if r := cl.w.check.facts(cl.c).recs[id]; r == nil || r.group == nil || r.group.Kind != message.GroupBegin {
			cl.next(outcome + ": no group opened")
			return
		}
	}
	op.phase++
	op.tries = 0
	if op.phase > len(op.members) {
		cl.next(fmt.Sprintf("group %d ended (%s)", op.gid, outcome))
		return
	}
	cl.w.tracef("client %d: op %d group %d phase %d", cl.id, cl.cur, op.gid, op.phase)
}

// startMember sends the current member of a group op: keyed (so that a
// retry is answered by its original), holding the shared Cluster key of
// its own, stamped with the group's keys and targets (R13.1, R13.8).
func (cl *client) startMember() {
	op := cl.op()
	kind := message.GroupBody
	if op.phase == len(op.members) {
		kind = op.ends
	}
	typ := op.members[op.phase-1]
	key := message.ClusterKey(fmt.Sprintf("%s/%d/%d/%d", op.key, cl.id, cl.cur, op.phase))
	sc := engine.ScopeOf(typ, key)
	cl.w.noteScope(typ, key)
	cl.send(engine.Resolve{Handle: cl.handle, Scope: sc, Key: key, CheckNew: true}, "resolve", func(r engine.Reply) {
		switch {
		case r.Err != nil:
			cl.memberFailed(r.Err)
		case r.Original != nil:
			cl.duplicate(r.Original)
		default:
			cl.lockMember(typ, kind, key)
		}
	})
}

func (cl *client) lockMember(typ message.Type, kind message.GroupKind, key message.IdempotencyKey) {
	keys := []resource.Key{resource.SharedCluster()}
	cl.send(engine.Lock{Handle: cl.handle, Keys: keys, Need: engine.Primary}, "lock", func(r engine.Reply) {
		if r.Err != nil {
			cl.memberFailed(r.Err)
			return
		}
		cl.submitMember(typ, kind, key)
	})
}

func (cl *client) submitMember(typ message.Type, kind message.GroupKind, key message.IdempotencyKey) {
	op := cl.op()
	gkeys, targets := cl.groupShape(op.gid)
	m := &message.Message{Type: typ, Payload: []byte(fmt.Sprint("m", op.phase)), IdempotencyKey: key,
		Broadcast: message.BroadcastHeader{VChannels: targets},
		Group:     &message.GroupHeader{ID: op.gid, Kind: kind, OwnerKey: op.ownerKey}}
	if op.ownerKey != "" {
		m.Payload = []byte(op.ownerKey)
	}
	st, raw, err := stampForSubmit(cl.c, m, gkeys)
	if err != nil {
		cl.w.fail("workload member stamp: %v", err)
		return
	}
	cl.send(engine.Submit{Handle: cl.handle, Msg: st, Bytes: raw, Group: op.gid}, "submit", func(r engine.Reply) {
		switch {
		case r.Err != nil:
			cl.memberFailed(r.Err)
		case r.Original != nil:
			cl.duplicate(r.Original)
		default:
			cl.w.check.answered(cl.c, r.Result.ID, false, cl.scope())
			cl.succeeded(r.Result.ID, fmt.Sprintf("member %d", r.Result.ID))
		}
	})
}

// groupShape returns the keys and targets a member of group gid carries:
// the open group's, or its Begin's record's.
func (cl *client) groupShape(gid uint64) ([]resource.Key, []message.VChannel) {
	if g, ok := cl.c.core.View().Group(gid); ok && g.Keys != nil {
		return g.Keys, g.Targets
	}
	if r := cl.w.check.facts(cl.c).recs[gid]; r != nil {
		return r.keys, r.targets
	}
	return []resource.Key{resource.SharedCluster()}, []message.VChannel{pchans[0].Control()}
}

// memberFailed handles a member's error: a group that ended or is full
// moves the op on, one this cluster does not know (a promoted secondary
// the Begin never reached) begins again.
func (cl *client) memberFailed(err error) {
	op := cl.op()
	switch {
	case errors.Is(err, engine.ErrGroupFull):
		op.phase = len(op.members) // straight to the end
		cl.retry("group full")
	case errors.Is(err, engine.ErrFailedPrecondition):
		cl.next("group not open: " + err.Error())
	case errors.Is(err, engine.ErrNotFound) && op.reconcile:
		cl.next("group gone: " + err.Error())
	case errors.Is(err, engine.ErrNotFound):
		op.phase, op.gid = 0, 0
		cl.retry("group unknown here: begin again")
	default:
		cl.failed(err)
	}
}

// stampForSubmit stamps m as the face does before Submit: the control
// channel added, keys, AckSyncUp from the type, id 0, encoded.
func stampForSubmit(c *cluster, m *message.Message, keys []resource.Key) (*message.Message, []byte, error) {
	st, err := m.Stamp(math.MaxUint64, c.cfg.ControlChannel, keys)
	if err != nil {
		return nil, nil, err
	}
	if info, ok := c.types.Lookup(m.Type); ok && info.AckSyncUp {
		st.Broadcast.AckSyncUp = true
	}
	st.Broadcast.ID = 0
	raw, err := message.Marshal(st)
	return st, raw, err
}

// duplicate handles an answer naming an original: a live one is waited for.
func (cl *client) duplicate(o *engine.Original) {
	if !o.Live {
		cl.w.check.answered(cl.c, o.ID, true, cl.scope())
		cl.succeeded(o.ID, fmt.Sprintf("duplicate of %d", o.ID))
		return
	}
	cl.send(engine.Wait{ID: o.ID}, "wait", func(r engine.Reply) {
		switch {
		case r.Err != nil:
			cl.failed(r.Err)
		case r.Original != nil:
			cl.w.check.answered(cl.c, r.Original.ID, true, cl.scope())
			cl.succeeded(r.Original.ID, fmt.Sprintf("duplicate of %d", r.Original.ID))
		default:
			cl.w.check.answered(cl.c, r.Result.ID, true, cl.scope())
			cl.succeeded(r.Result.ID, fmt.Sprintf("duplicate of %d", r.Result.ID))
		}
	})
}

func (cl *client) failed(err error) {
	switch {
	case errors.Is(err, engine.ErrFailedPrecondition) && cl.op().group():
		cl.next("group refused: " + err.Error())
	case errors.Is(err, engine.ErrTaskNotCreated):
		cl.retry("not created")
	case errors.Is(err, engine.ErrNotPrimary):
		cl.next("not primary")
	case errors.Is(err, engine.ErrClosed):
		cl.retry("closed")
	default:
		cl.retry(err.Error())
	}
}

// send sends one request to the client's cluster.
func (cl *client) send(ev engine.Event, what string, onReply func(engine.Reply)) {
	id, cur := cl.id, cl.cur
	r := cl.w.requestf(cl.c, func() string { return fmt.Sprintf("client%d/op%d/%s", id, cur, what) }, onReply, func() { cl.retry("coordinator lost") })
	cl.wait = r
	switch e := ev.(type) {
	case engine.Resolve:
		cl.w.origin[e.Handle] = r
	case engine.Lock:
		if cl.w.origin[e.Handle] == nil {
			cl.w.origin[e.Handle] = r
		}
	}
	cl.c.step(withTarget(ev, r))
}

// giveUp stops waiting for the pending request (a deadline), as the driver
// does: the request is withdrawn (R11.5), and a handle whose lock wait was
// given up is closed, giving back the admission slot it holds; a broadcast
// carries on in the background.
func (cl *client) giveUp() {
	r := cl.wait
	if r.call != nil {
		r.giveUp()
		// The real driver withdraws what the call waits for.
		r.call.cancel()
		r.call.g.cancelled = r.call.g.started
		cl.retry("deadline")
		return
	}
	cl.w.withdraw(cl.c, r)
	if strings.HasSuffix(r.name(), "/lock") {
		cl.c.step(engine.Close{Handle: cl.handle})
	}
	if !cl.c.down {
		// Withdrawn, the request leaves nothing behind (R11.3): no Resolve
		// among a slot's waiters, no handle but one whose Submit goes on.
		for _, v := range cl.c.core.View().Requests() {
			if v.Handle == cl.handle && !v.Busy {
				cl.w.fail("%s: %s withdrawn, but %s (R11.3)", cl.c.name, r.name(), cl.w.describeHold(v))
			}
		}
	}
	cl.retry("deadline")
}

// withTarget sets a request event's reply target.
func withTarget(ev engine.Event, r *request) engine.Event {
	switch e := ev.(type) {
	case engine.Resolve:
		e.To = r
		return e
	case engine.Lock:
		e.To = r
		return e
	case engine.Submit:
		e.To = r
		return e
	case engine.Wait:
		e.To = r
		return e
	case engine.Ack:
		e.To = r
		return e
	case engine.Follow:
		e.To = r
		return e
	case engine.WaitAcked:
		e.To = r
		return e
	case engine.RetryNow:
		e.To = r
		return e
	case engine.Complete:
		e.To = r
		return e
	}
	panic(fmt.Sprintf("sim: %T is not a request", ev))
}

// consumer is a streaming node's consumer of one pchannel: it reads the
// pchannel's copies in WAL order and acks them one at a time, retrying a
// refused ack; AckSyncUp copies must be acked, others are now and then
// (the engine ignores those). A restart goes back to an older saved
// position and acks again what it reads again.
type consumer struct {
	c      *cluster
	p      message.PChannel
	ln     message.PChannel // p's lane (a cluster's lanes are fixed)
	cursor int              // next entry of the lane
	saved  int
	queue  []engine.Ack
	wait   *request
	until  time.Time
}

func (n *consumer) lane() message.PChannel { return n.ln }

func (n *consumer) ready() bool {
	if n.c.down || n.wait != nil && !n.wait.done {
		return false
	}
	if len(n.queue) > 0 {
		return !n.c.w.now.Before(n.until) || !n.c.w.faultsOn
	}
	end, _ := n.c.log.End(context.Background(), n.lane())
	return uint64(n.cursor) < end
}

func (n *consumer) next() {
	w := n.c.w
	if len(n.queue) == 0 {
		entry, _ := n.c.log.Entry(n.lane(), uint64(n.cursor))
		copies, err := wal.Decode(uint64(n.cursor), entry)
		if err != nil {
			w.fail("%s: entry %d of %s does not decode: %v", n.c.name, n.cursor, n.lane(), err)
			return
		}
		n.cursor++
		for _, cp := range copies {
			if cp.VChannel.PChannel() != n.p {
				continue
			}
			m := cp.Message
			must := m.Broadcast.AckSyncUp || m.Replicate != nil || m.AppendsFirst(cp.VChannel)
			if !must && w.rng.IntN(3) > 0 {
				continue
			}
			a := engine.Ack{ID: m.Broadcast.ID, VChannel: cp.VChannel, Checkpoint: cp.Checkpoint, Msg: m}
			if m.Replicate == nil && w.rng.IntN(5) == 0 {
				// A consumer that does not carry the message (LegacyAck).
				a.Checkpoint, a.Msg = wal.Checkpoint{}, nil
			}
			n.queue = append(n.queue, a)
		}
		n.maybeSave()
		return
	}
	if n.c.driver && len(n.queue) > 1 && w.rng.IntN(2) == 0 {
		n.ackAllDriven()
		return
	}
	a := n.queue[0]
	r := w.requestf(n.c, func() string { return fmt.Sprintf("%s-node-%s/ack%d", n.c.name, n.p, a.ID) }, func(r engine.Reply) {
		if r.Err != nil && !errors.Is(r.Err, engine.ErrVChannelNotInTask) && !errors.Is(r.Err, engine.ErrInvalidArgument) {
			n.until = w.now.Add(5 * time.Millisecond)
			return // retried
		}
		n.queue = n.queue[1:]
		n.maybeSave()
	}, nil)
	n.wait = r
	if n.c.driver {
		n.ackDriven(a, r)
		return
	}
	n.c.step(withTarget(a, r))
}

// maybeSave saves the position now and then, once every copy read is acked
// (a node saves its resume offset past an entry only after acking it).
func (n *consumer) maybeSave() {
	if len(n.queue) == 0 && n.c.w.rng.IntN(4) == 0 {
		n.saved = n.cursor
	}
}

// restart loses the consumer's unsaved progress.
func (n *consumer) restart() {
	if n.cursor == n.saved && len(n.queue) == 0 {
		return
	}
	if n.wait != nil {
		n.wait.giveUp()
	}
	n.cursor, n.queue = n.saved, nil
	n.c.w.tracef("%s: node of %s restarts at entry %d", n.c.name, n.p, n.cursor)
}

// operator retries or completes a task whose callback keeps failing (while
// faults go on), and completes a poisoned one (R11.6), whose callback
// would fail for ever, once it failed a dozen times. In driver mode it
// calls the broadcaster's API.
func (w *world) operator() func() {
	for _, c := range w.clusters() {
		if c.down {
			continue
		}
		var id uint64
		for _, t := range c.liveTasks() {
			if t.stage != engine.Backoff || w.operating[t.id] {
				continue
			}
			poisoned := string(t.msg.Payload) == poisonForever
			if t.attempts >= 3 && w.faultsOn && !poisoned || t.attempts >= 12 && poisoned {
				id = t.id
				break
			}
		}
		if id == 0 {
			continue
		}
		c := c
		return func() {
			complete := !w.faultsOn || w.rng.IntN(3) == 0 || w.poisoned(c, id)
			if complete {
				w.tracef("operator completes %d", id)
				w.check.forced(c, id)
			} else {
				w.tracef("operator retries %d", id)
			}
			if c.driver {
				w.operating[id] = true
				r := w.request(c, fmt.Sprint("operator/", id), nil, nil)
				c.call(r, func() {
					if complete {
						_ = c.drv.b.CompleteCallback(context.Background(), id, "sim operator")
					} else {
						_ = c.drv.b.RetryCallback(id)
					}
				}, func() { delete(w.operating, id) })
				r.onLost = func() { delete(w.operating, id) }
				return
			}
			if complete {
				c.step(withTarget(engine.Complete{ID: id, Reason: "sim operator"}, w.request(c, fmt.Sprint("operator/complete", id), func(engine.Reply) {}, nil)))
				return
			}
			c.step(withTarget(engine.RetryNow{ID: id}, w.request(c, fmt.Sprint("operator/retry", id), func(engine.Reply) {}, nil)))
		}
	}
	return nil
}

// poisoned reports whether c's live task id is a poisoned broadcast.
func (w *world) poisoned(c *cluster, id uint64) bool {
	live, _, _, ok := c.core.View().TaskByID(id)
	return ok && live != nil && string(live.Msg.Payload) == poisonForever
}
