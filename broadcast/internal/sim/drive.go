package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/broadcast/internal/simrt"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/clock"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// A cluster in driver mode (Config.Driver) runs a real broadcast.Broadcaster:
// its handle and driver code, fast paths included, on the scheduler's
// goroutines (sched.go). Its catalog, WAL and callbacks are the simulator's:
// each write, append and callback parks its goroutine until the seed
// completes it, with the faults the core-level runs inject, and the checker
// watches what lands as in those runs. Clients call the broadcaster's API
// (Acquire, Broadcast, Ack) on goroutines of their own and give up by
// ending their context at any wait point.

// driven is what a cluster in driver mode has besides a core-level one.
type driven struct {
	b   *broadcast.Broadcaster
	rt  *drt
	clk *clock.Manual
	cbs *broadcast.Callbacks
	// appends counts the appends in flight (R4.3).
	appends int
	// async gives the broadcaster a catalog that commits asynchronously
	// (catalog.AsyncCommitter, as etcd's group commit does), chosen by the
	// seed: the driver then hands writes over from its loop.
	async bool
	// walPChans leaves Config.PChannels unset, chosen by the seed: the
	// WAL then says which pchannels the cluster has (R2.3).
	walPChans bool
	// closing says a graceful Close runs, closed that it returned;
	// closes counts them.
	closing, closed bool
	closes          int
}

// startDriver recovers a broadcaster from the catalog on a new runtime.
func (c *cluster) startDriver() error {
	if c.drv.cbs == nil {
		c.drv.cbs = c.callbacks()
		c.drv.clk = clock.NewManual(c.w.now)
		c.drv.async = c.w.rng.IntN(2) == 0
		c.drv.walPChans = c.w.rng.IntN(2) == 0
	}
	var cat catalog.Catalog = simCatalog{c}
	if c.drv.async {
		cat = simAsyncCatalog{simCatalog{c}}
	}
	c.drv.clk.Set(c.w.now)
	c.drv.rt = &drt{s: c.w.sched, c: c, bug: c.w.cfg.Mutation}
	cfg := broadcast.Config{
		Catalog: cat, WAL: wal.New(simLog{c}, wal.WithLanes(c.laneN, pchans)), Types: c.types,
		Callbacks: c.drv.cbs, ControlChannel: c.cfg.ControlChannel, PChannels: pchans, ClusterName: c.name, Prefix: prefix,
		// Two appends in flight, as the core-level runs have, whatever
		// the machine's CPUs.
		ConcurrencyRatio: 2.5 / float64(runtime.NumCPU()),
		Backoff:          broadcast.Backoff{Initial: c.cfg.Backoff.Initial, Multiplier: c.cfg.Backoff.Multiplier, Max: c.cfg.Backoff.Max},
		Tombstone: broadcast.TombstoneConfig{MaxLifetime: c.cfg.Classes[0].MaxLifetime, MaxCount: c.cfg.Classes[0].MaxCount,
			CheckInterval: c.cfg.CheckInterval, Classes: []broadcast.RetentionClass{{Name: c.cfg.Classes[1].Name,
				Types: []message.Type{typImport}, MaxCount: c.cfg.Classes[1].MaxCount, MaxLifetime: c.cfg.Classes[1].MaxLifetime}}},
		MaxKeyLength: c.cfg.MaxKeyLength, Clock: c.drv.clk, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		CallbackConcurrency: 64,
	}
	if c.drv.walPChans {
		cfg.PChannels = nil
	}
	cfg = simrt.WithRuntime(cfg, c.drv.rt, c.salt).(broadcast.Config)
	b, err := broadcast.New(context.Background(), cfg)
	if err != nil {
		c.w.sched.kill(c.drv.rt)
		return err
	}
	c.drv.b = b
	c.core = simrt.Core(b)
	return nil
}

// stopDriver kills the broadcaster's goroutines (a crash, or a core that
// stopped itself when fenced): the writes and appends they have in flight
// land or not.
func (c *cluster) stopDriver() {
	if c.drv.rt != nil && !c.drv.rt.dead {
		c.w.sched.kill(c.drv.rt)
	}
	c.drv.b = nil
	c.drv.appends = 0
	c.drv.closing, c.drv.closed = false, false
}

// closeDriver closes c's broadcaster gracefully (Close), on a goroutine of
// its runtime, as a coordinator that shuts down does: every caller in
// flight must be answered (afterClose); then it recovers as after a crash.
func (c *cluster) closeDriver() {
	w, b := c.w, c.drv.b
	c.drv.closing = true
	c.drv.closes++
	w.tracef("%s: broadcaster %d closes", c.name, c.gen)
	r := w.request(c, fmt.Sprintf("%s/close%d", c.name, c.gen), nil, nil)
	c.call(r, func() { _ = b.Close() }, func() { c.drv.closed = true })
}

// afterClose runs, once Close returned, every goroutine of the closed
// broadcaster that may go on, and fails the run if one is left waiting:
// Close answers every caller, whatever it waited for (R11.5). The cluster
// is then down, to recover.
func (w *world) afterClose(c *cluster) {
	rt := c.drv.rt
	for range 10000 {
		var g *gor
		for _, x := range w.sched.gs {
			if x.rt == rt && x.runnable() {
				g = x
				break
			}
		}
		if g == nil || w.err != nil {
			break
		}
		w.sched.resume(g, true)
		if p := w.sched.panicked; p != "" {
			w.fail("panic: %s", p)
			return
		}
	}
	for _, g := range w.sched.gs {
		if g.rt == rt {
			w.fail("%s: %s still waits after Close returned (R11.5)", c.name, g.name)
			return
		}
	}
	w.tracef("%s: broadcaster %d closed", c.name, c.gen)
	c.stopDriver()
	c.down = true
}

// callbacks registers the workload's callbacks: each parks until the seed
// completes it (callback, ackOnce).
func (c *cluster) callbacks() *broadcast.Callbacks {
	cbs := broadcast.NewCallbacks()
	for _, t := range types {
		if t.callback {
			_ = broadcast.OnAck(cbs, t.typ, broadcast.Raw(), c.ackCallback)
		}
	}
	for _, t := range []message.Type{typOwner, typEnd, typRoll} {
		_ = broadcast.OnAck(cbs, t, broadcast.Raw(), c.ackCallback)
	}
	_ = broadcast.OnAckOnce(cbs, typOnce, broadcast.Raw(), func(ctx context.Context, _ *broadcast.TypedAckEvent[[]byte]) error {
		c.w.sched.park(always, true)
		if c.w.fault(0.2) {
			return errors.New("sim: ack-once callback failed")
		}
		return nil
	})
	return cbs
}

func always() bool { return true }

// ackCallback is the application's callback: a read-modify-write of the
// task's effect counter staged with the TOMBSTONE (R5.3), as the
// core-level runs' callback. It parks until the seed completes it.
func (c *cluster) ackCallback(ctx context.Context, ev *broadcast.TypedEvent[[]byte]) error {
	w := c.w
	w.sched.park(always, true)
	id := ev.Message.Broadcast.ID
	w.mix(31, id)
	if ctx.Err() != nil {
		return ctx.Err() // an operator or Close cut it short
	}
	switch string(ev.Message.Payload) {
	case poisonForever:
		return errors.New("sim: poisoned callback failed")
	case poisonPermanent:
		return broadcast.Permanent(errors.New("sim: poisoned"))
	}
	if n := w.failing[id]; n > 0 {
		w.failing[id] = n - 1
		return errors.New("sim: callback failed")
	}
	if w.fault(0.1) {
		return errors.New("sim: callback failed")
	}
	key := effectKey(id)
	n := uint64(0)
	if v, err := c.cat.Get(context.Background(), key); err == nil {
		n = beUint64(v)
	}
	if err := ev.Effects.Put(key, beBytes(n+1)); err != nil {
		return err
	}
	ev.Effects.SetOutcome(broadcast.Outcome{Detail: "sim"})
	return nil
}

// simCatalog is a driver's catalog: the cluster's current term on the
// in-memory store, whose commits park until the seed completes them, with
// faults.
type simCatalog struct{ c *cluster }

func (s simCatalog) Commit(ctx context.Context, ops ...catalog.Op) error {
	c, w := s.c, s.c.w
	if w.cfg.panicAt != 0 && w.steps >= w.cfg.panicAt {
		panic("sim: a planted panic in a commit")
	}
	cat := c.cat // this term's handle: a later term fences it
	w.sched.inFlight(func() {
		if cat.Commit(context.Background(), ops...) == nil {
			w.check.committed(c, engine.Write{}, ops)
		}
	})
	var err error
	switch {
	case w.fault(0.05):
		err = errDefinite
	case w.fault(0.05):
		err = errTimeout
	default:
		if w.fault(0.01) && w.fencings < 2 {
			w.fencings++
			c.store.Open()
		}
		if err = cat.Commit(context.Background(), ops...); err == nil {
			w.check.committed(c, engine.Write{}, ops)
			if w.fault(0.05) {
				err = errLost
			} else {
				s.heard(ops)
			}
		}
	}
	w.mix(32, errFlag(err))
	w.tracef("%s: commit of %d ops: %v", c.name, len(ops), err)
	return err
}

// heard notes the TOMBSTONEs the driver hears are durable: it steps the
// core with the result before any later one (its mutex, or the loop's
// queue, keeps the order), so this is the order the core keeps them in.
func (s simCatalog) heard(ops []catalog.Op) {
	for _, o := range ops {
		if o.Delete || !strings.HasPrefix(o.Key, engine.TasksPrefix(prefix)) {
			continue
		}
		if rec, err := engine.DecodeRecord(o.Value); err == nil && rec.State == engine.Tombstone {
			id, _ := engine.ParseTaskKey(prefix, o.Key)
			s.c.w.check.heardDurable(s.c, engine.Write{Task: id})
		}
	}
}

// simAsyncCatalog is a simCatalog that also commits asynchronously: each
// commit runs on a goroutine of its own (the catalog's flusher), which
// answers it.
type simAsyncCatalog struct{ simCatalog }

func (s simAsyncCatalog) CommitAsync(done catalog.Completion, ops ...catalog.Op) error {
	c := s.c
	if c.drv.rt == nil || c.drv.rt.dead {
		return catalog.ErrClosed
	}
	c.w.sched.spawn(c.drv.rt, "catalog", func() { done.Committed(s.Commit(context.Background(), ops...)) }, nil)
	return nil
}

func (s simCatalog) Get(ctx context.Context, key string) ([]byte, error) {
	return s.c.cat.Get(ctx, key)
}

func (s simCatalog) List(ctx context.Context, p string, fn func(string, []byte) error) error {
	return s.c.cat.List(ctx, p, fn)
}

func (s simCatalog) Limits() catalog.Limits { return s.c.cat.Limits() }

// simLog is a driver's WAL backend: the cluster's in-memory log, whose
// appends park until the seed completes them, with faults.
type simLog struct{ c *cluster }

func (l simLog) Append(ctx context.Context, p message.PChannel, id string, data []byte) (uint64, error) {
	c, w := l.c, l.c.w
	c.drv.appends++
	if c.drv.appends > 2 {
		w.fail("%s: %d appends in flight, AppendConcurrency 2 (R4.3)", c.name, c.drv.appends)
	}
	defer func() { c.drv.appends-- }()
	w.sched.inFlight(func() {
		w.check.beforeEntry(c, data)
		_, _ = c.log.Append(context.Background(), p, id, data)
	})
	var off uint64
	var err error
	switch {
	case w.fault(0.06):
		err = errAppend
	case w.fault(0.04):
		err = errTimeout
	default:
		w.check.beforeEntry(c, data)
		if off, err = c.log.Append(context.Background(), p, id, data); err == nil && w.fault(0.04) {
			err = errLost
		}
	}
	w.mix(33, errFlag(err))
	w.tracef("%s: append on %s: %v", c.name, p, err)
	return off, err
}

func (l simLog) Read(ctx context.Context, p message.PChannel, from uint64) (wal.Cursor, error) {
	return l.c.log.Read(ctx, p, from)
}

func (l simLog) End(ctx context.Context, p message.PChannel) (uint64, error) {
	return l.c.log.End(ctx, p)
}
func (l simLog) MaxEntryBytes() int { return wmem.DefaultMaxEntryBytes }
func (l simLog) Close() error       { return nil }

// call runs fn, a caller of c's broadcaster, on a goroutine of the
// scheduler; done gets fn's outcome on the simulator's goroutine, unless a
// crash killed it (r is then lost) or its caller gave up on r.
func (c *cluster) call(r *request, fn func(), done func()) *gor {
	return c.w.sched.spawn(c.drv.rt, r.name(), fn, func(killed bool) {
		switch {
		case killed && !r.done:
			r.lost()
		case !killed && !r.done:
			r.end()
			done()
		}
	})
}

// driverCall is what a client's current call in driver mode needs: its
// context (give up: cancel) and its goroutine.
type driverCall struct {
	cancel context.CancelFunc
	g      *gor
}

// startDriven runs the client's current operation through the API: Acquire
// (the key resolved first when keyed, R7.5), then Broadcast, which a
// duplicate answers with its original; sometimes the handle is closed
// unused (R3.6). The same key comes back with another payload now and then
// (R7.6).
func (cl *client) startDriven() {
	op := cl.op()
	c := cl.c
	ctx, cancel := context.WithCancel(context.Background())
	r := cl.w.request(c, fmt.Sprintf("client%d/op%d/call", cl.id, cl.cur), nil, func() { cl.retry("coordinator lost") })
	r.call = &driverCall{cancel: cancel}
	cl.wait = r
	payload := op.payload
	if op.tries > 0 && cl.w.rng.IntN(8) == 0 {
		payload += "-changed"
	}
	closeUnused := cl.w.rng.IntN(10) == 0
	targets := op.targets
	// Now and then a try names a vchannel on a pchannel the cluster does
	// not have: bad input, refused before anything is created, its keys
	// free at once (R2.3).
	bad := !op.twoPhase && cl.w.rng.IntN(16) == 0
	if bad {
		targets = append(slices.Clip(targets), unknownVChannel)
	}
	acq := broadcast.AcquireRequest{Keys: op.keys, Unreplicable: op.local}
	var idem *broadcast.Idempotent
	if op.key != "" {
		cl.w.noteScope(op.typ, op.key)
		idem = &broadcast.Idempotent{Type: op.typ, Key: op.key, Digest: []byte(payload)}
	}
	var (
		res              *broadcast.Result
		err              error
		closed, admitted bool
	)
	r.call.g = c.call(r, func() {
		defer cancel()
		acq.Idempotent = idem
		h, aerr := c.drv.b.Acquire(ctx, acq)
		if aerr != nil {
			err = aerr
			return
		}
		defer h.Close()
		if op.probe && !h.Duplicate() {
			// A group's Begin key admitted as new work: no group is
			// opened for it.
			admitted = true
			return
		}
		if closeUnused && !h.Duplicate() {
			closed = true
			return
		}
		var opts []message.Option
		if op.key != "" {
			opts = append(opts, message.WithIdempotencyKey(op.key))
		}
		if op.twoPhase {
			opts = append(opts, message.WithAppendFirst(op.targets[0]), message.WithCopy(op.targets[0], "fence", nil))
		}
		m, merr := message.NewBroadcast(op.typ, []byte(payload), targets, opts...)
		if merr != nil {
			err = merr
			return
		}
		res, err = h.Broadcast(ctx, m)
	}, func() {
		switch {
		case bad && errors.Is(err, broadcast.ErrInvalidArgument):
			cl.retry("target refused")
		case bad && err == nil && res != nil && res.Duplicated == nil:
			cl.w.fail("%s: broadcast %d created with a target on a pchannel the cluster does not have (R2.3)", c.name, res.BroadcastID)
		case admitted:
			cl.next("admitted as new work")
		case closed:
			cl.retry("closed unused")
		case err != nil:
			cl.drivenFailed(err)
		case res.Duplicated != nil:
			cl.w.check.answered(c, res.BroadcastID, true, cl.scope())
			cl.succeeded(res.BroadcastID, fmt.Sprintf("duplicate of %d", res.BroadcastID))
		default:
			cl.w.check.answered(c, res.BroadcastID, false, cl.scope())
			cl.succeeded(res.BroadcastID, fmt.Sprintf("broadcast %d", res.BroadcastID))
		}
	})
}

// unknownVChannel is on a pchannel no cluster of the simulator has.
const unknownVChannel = message.VChannel("wal-9/nowhere")

// drivenFailed handles an API call's error.
func (cl *client) drivenFailed(err error) {
	switch {
	case errors.Is(err, broadcast.ErrKeyReusedWithDifferentPayload):
		cl.next("key reused with another payload")
	case broadcast.IsTaskNotCreated(err):
		cl.retry("not created")
	case errors.Is(err, broadcast.ErrNotPrimary):
		cl.next("not primary")
	default:
		cl.retry(err.Error())
	}
}

// ackDriven acks a copy through the API, as a streaming node does.
func (n *consumer) ackDriven(a engine.Ack, r *request) {
	c := n.c
	var err error
	c.call(r, func() {
		err = c.drv.b.Ack(context.Background(), broadcast.Ack{BroadcastID: a.ID, VChannel: a.VChannel, Checkpoint: a.Checkpoint, Message: a.Msg})
	}, func() { r.onReply(engine.Reply{Err: err}) })
}

// ackAllDriven acks every copy the consumer holds in one AckAll, as a
// streaming node acks the copies of one entry: each is answered as Ack
// alone would answer it, and the refused ones (but for a vchannel or
// argument the task refuses for good) stay queued to be retried.
func (n *consumer) ackAllDriven() {
	c, w := n.c, n.c.w
	batch := slices.Clone(n.queue)
	acks := make([]broadcast.Ack, len(batch))
	for i, a := range batch {
		acks[i] = broadcast.Ack{BroadcastID: a.ID, VChannel: a.VChannel, Checkpoint: a.Checkpoint, Message: a.Msg}
	}
	var errs []error
	r := w.request(c, fmt.Sprintf("%s-node-%s/ackall%d", c.name, n.p, len(acks)), nil, nil)
	n.wait = r
	c.call(r, func() {
		errs = c.drv.b.AckAll(context.Background(), acks)
	}, func() {
		var again []engine.Ack
		for i, a := range batch {
			if errs != nil && errs[i] != nil && !errors.Is(errs[i], broadcast.ErrVChannelNotInTask) && !errors.Is(errs[i], broadcast.ErrInvalidArgument) {
				again = append(again, a)
			}
		}
		n.queue = append(again, n.queue[len(batch):]...)
		if len(again) > 0 {
			n.until = w.now.Add(5 * time.Millisecond)
			return
		}
		n.maybeSave()
	})
}

// tickDriver moves a driven cluster's clock: the loop's timer fires.
func (c *cluster) tickDriver() {
	if c.drv.clk != nil && !c.drv.clk.Now().Equal(c.w.now) {
		c.drv.clk.Set(c.w.now)
		c.w.check.stepped()
	}
}

// startDrivenGroup runs the current phase of a group op through the API
// (R13): a transaction's Begin (BeginTxn, keyed: a retry returns the open
// transaction) or an owner's (a keyed broadcast of the owner type), then
// each member through ResumeTxn (which finds the group after any restart)
// or, for an owner, its end through EndOwnership.
func (cl *client) startDrivenGroup() {
	op := cl.op()
	c := cl.c
	ctx, cancel := context.WithCancel(context.Background())
	r := cl.w.request(c, fmt.Sprintf("client%d/op%d/group%d", cl.id, cl.cur, op.phase), nil, func() { cl.retry("coordinator lost") })
	r.call = &driverCall{cancel: cancel}
	cl.wait = r
	phase, gid := op.phase, op.gid
	kind := message.GroupBody
	var typ message.Type
	var key message.IdempotencyKey
	if phase > 0 {
		if phase == len(op.members) {
			kind = op.ends
		}
		typ = op.members[phase-1]
		key = message.ClusterKey(fmt.Sprintf("%s/%d/%d/%d", op.key, cl.id, cl.cur, phase))
		cl.w.noteScope(typ, key)
	} else {
		cl.w.noteScope(op.typ, op.key)
	}
	var (
		id  uint64
		dup bool
		err error
	)
	r.call.g = c.call(r, func() {
		defer cancel()
		b := c.drv.b
		var res *broadcast.Result
		switch {
		case phase == 0 && op.txn:
			m, merr := message.NewBroadcast(op.typ, []byte(op.payload), op.targets, message.WithIdempotencyKey(op.key))
			if merr != nil {
				err = merr
				return
			}
			x, berr := b.BeginTxn(ctx, broadcast.TxnRequest{Keys: op.keys, Idempotent: &broadcast.Idempotent{Type: op.typ, Key: op.key}}, m)
			if berr != nil {
				err = berr
				return
			}
			id, dup = x.ID, x.Duplicate
			return
		case phase == 0:
			h, aerr := b.Acquire(ctx, broadcast.AcquireRequest{Keys: op.keys, Idempotent: &broadcast.Idempotent{Type: op.typ, Key: op.key}})
			if aerr != nil {
				err = aerr
				return
			}
			defer h.Close()
			m, merr := message.NewBroadcast(op.typ, []byte(op.ownerKey), op.targets, message.WithIdempotencyKey(op.key))
			if merr != nil {
				err = merr
				return
			}
			res, err = h.Broadcast(ctx, m)
		case op.txn:
			x, rerr := b.ResumeTxn(gid)
			if rerr != nil {
				err = rerr
				return
			}
			m := &message.Message{Type: typ, Payload: []byte(fmt.Sprint("m", phase)), IdempotencyKey: key}
			switch kind {
			case message.GroupBody:
				res, err = x.Body(ctx, m)
			case message.GroupCommit:
				res, err = x.Commit(ctx, m)
			default:
				res, err = x.Rollback(ctx, m)
			}
		default:
			res, err = b.EndOwnership(ctx, &message.Message{Type: typ, Payload: []byte(op.ownerKey), IdempotencyKey: key})
		}
		if err == nil {
			id, dup = res.BroadcastID, res.Duplicated != nil
		}
	}, func() {
		if err != nil {
			cl.drivenMemberFailed(err)
			return
		}
		cl.w.check.answered(c, id, dup, engine.Scope{})
		cl.succeeded(id, fmt.Sprintf("member %d", id))
	})
}

// drivenMemberFailed handles a group phase's error, as memberFailed does.
func (cl *client) drivenMemberFailed(err error) {
	op := cl.op()
	switch {
	case errors.Is(err, broadcast.ErrTxnFull):
		op.phase = len(op.members) // straight to the end
		cl.retry("group full")
	case errors.Is(err, broadcast.ErrFailedPrecondition):
		cl.next("group not open: " + err.Error())
	case errors.Is(err, broadcast.ErrKeyReusedWithDifferentPayload):
		// A body for a transaction another client ended: its key
		// answers no member of it (R13.2).
		cl.next("group ended: " + err.Error())
	case errors.Is(err, broadcast.ErrNotFound) && op.phase > 0:
		op.phase, op.gid = 0, 0
		cl.retry("group unknown here: begin again")
	default:
		cl.drivenFailed(err) // not created, not primary, the rest retried
	}
}
