package sim

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"time"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/broadcast/internal/mutate"
	"github.com/walcast/walcast/message"
)

// Config is one simulation run.
type Config struct {
	// Seed decides everything: the workload, every interleaving, every
	// fault, every crash.
	Seed uint64
	// Mutation plants a known bug (package mutate; only in a build with
	// the tag walcast_mutate).
	Mutation mutate.Bug
	// IndexScopeBits is the core's engine.Config.IndexScopeBits: how many
	// bits of a scope key the idempotency index's main map (0: 64).
	IndexScopeBits int
	// Replication runs the two-cluster scenario: a secondary follows the
	// primary's WAL, the primary is lost, the secondary is force-promoted.
	// Default: chosen by the seed.
	Replication *bool
	// Poison plants a poisoned callback (R11.6). Default: chosen by the
	// seed.
	Poison *bool
	// Calm keeps the clock from jumping and from passing at random: time
	// passes only when nothing else can happen, so that virtual latencies
	// measure waits (TestR11_6_PoisonKeepsOthersLatency).
	Calm bool
	// Driver runs the real broadcaster — its handle and driver code, fast
	// paths included — on the simulator's goroutine scheduler, instead of
	// stepping the core directly (sched.go, drive.go), in a one-cluster
	// scenario. Default: chosen by the seed.
	Driver *bool
	// MaxSteps bounds a run (a run that does not finish is a liveness
	// failure). Default 20000.
	MaxSteps int
	// Trace keeps a readable log of the run for a failure report.
	Trace bool
	// panicAt makes the run panic at that step, on the simulator's
	// goroutine or (driver mode) in the next catalog commit: the harness's
	// own test (TestPanickingSeedReported).
	panicAt int
}

// Result is what a run found.
type Result struct {
	Seed  uint64
	Steps int
	// Hash digests every event and action of the run: the same seed gives
	// the same hash.
	Hash [32]byte
	// Err is the first invariant violated, nil if none.
	Err error
	// Trace is the run's log (with Config.Trace).
	Trace []string
	// Counts of what happened.
	Broadcasts, Duplicates, Crashes, Faults int
	Promoted                                bool
	// Driver says the run drove the real driver (Config.Driver).
	Driver bool
	// Latencies are the virtual times the workload's broadcasts took, from
	// their first try to their answer (but the poisoned one's).
	Latencies []time.Duration
	// Quiesced says the run reached its quiescent phase (R11.3): faults
	// stopped; it passed it if Err is nil.
	Quiesced bool
}

// world is one run: the clusters, the workload, the clock, the random
// source, and the checker.
type world struct {
	moveBuf []move // moves' slice, reused from step to step
	// reconciled holds the groups reconcile gave a rollback.
	reconciled map[uint64]bool
	cfg        Config
	// sched runs the goroutines of a driver-mode run (nil otherwise).
	sched    *sched
	rng      *rand.Rand
	now      time.Time
	steps    int
	maxCount int
	primary  *cluster
	second   *cluster // the secondary, in the replication scenario
	repl     *replicator
	clients  []*client
	requests []*request
	open     int            // requests not done
	failing  map[uint64]int // callback failures still to inject, per task
	check    *checker
	fnv      uint64
	trace    []string
	crashes  int
	faults   int
	fencings int
	handles  uint64
	// faultsOn turns fault injection off for the run's end, so that it
	// must finish (liveness).
	faultsOn bool
	// faultSteps bounds the fault phase; quiet is the quiescent phase
	// after it (R11.3), nil before.
	faultSteps int
	quiet      *quiescence
	// origin says which request made each handle, and scopes names the
	// workload's keyed scopes: a leak report names them.
	origin map[engine.HandleID]*request
	// operating marks the tasks an operator's call (driver mode) works on.
	operating map[uint64]bool
	latencies []time.Duration
	scopes    map[engine.Scope]scopeKey
	// watchers are the ack waits in flight (waits.go); promoters the
	// ForcePromote calls, while awaitPromote says the driven cluster
	// follows and waits to be promoted (follow.go); calls numbers them.
	watchers, promoters []*request
	watches             int
	awaitPromote        bool
	calls               int
	err                 error
}

// Run runs one simulation. A panic is reported as the run's failure, with
// the stack, so that the seed that caused it is known.
func Run(cfg Config) (res Result) {
	if cfg.MaxSteps == 0 {
		cfg.MaxSteps = 20000
	}
	w := &world{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x5eed)), fnv: 14695981039346656037,
		now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), failing: map[uint64]int{}, faultsOn: true,
		origin: map[engine.HandleID]*request{}, scopes: map[engine.Scope]scopeKey{}, operating: map[uint64]bool{}}
	defer func() {
		if p := recover(); p != nil {
			w.err = fmt.Errorf("step %d: panic: %v\n%s", w.steps, p, debug.Stack())
			w.tracef("PANIC: %v", p)
		}
		res = w.result()
	}()
	w.check = newChecker(w)
	w.maxCount = []int{3, 8, 64}[w.rng.IntN(3)]
	lanes := []int{0, 2}[w.rng.IntN(2)]
	repl := w.rng.IntN(4) == 0
	if cfg.Replication != nil {
		repl = *cfg.Replication
	}
	driver := !repl && w.rng.IntN(3) == 0
	if cfg.Driver != nil {
		driver = *cfg.Driver
	}
	repl = repl && !driver
	w.cfg.Driver = &driver
	if driver {
		w.sched = newSched(w)
		defer w.stopGoroutines()
	}
	w.primary = newCluster(w, "east", lanes)
	if err := w.primary.start(); err != nil {
		w.fail("start: %v", err)
	}
	if driver && w.err == nil && w.rng.IntN(3) == 0 {
		w.followFirst(w.primary)
	}
	if repl && w.err == nil {
		w.second = newCluster(w, "west", lanes)
		if err := w.second.start(); err != nil {
			w.fail("start secondary: %v", err)
		}
		w.repl = newReplicator(w)
		w.follow()
	}
	w.makeClients()
	// The fault phase ends when the workload is done, or earlier: some
	// seeds stop faults in the middle of it.
	w.faultSteps = 100 + w.rng.IntN(1500)
	if w.repl != nil && w.repl.lostAt > 0 {
		// Faults go on through the force promote, crashes of the secondary
		// included (crashMove).
		w.faultSteps = max(w.faultSteps, w.repl.lostAt+300)
	}
	w.run()
	return w.result()
}

func (w *world) result() Result {
	res := Result{Seed: w.cfg.Seed, Steps: w.steps, Err: w.err, Trace: w.trace, Crashes: w.crashes, Faults: w.faults,
		Broadcasts: w.check.created, Duplicates: w.check.dups, Promoted: w.repl != nil && w.repl.promoted,
		Quiesced: w.quiet != nil, Driver: w.sched != nil, Latencies: w.latencies}
	res.Hash = sha256.Sum256(binary.BigEndian.AppendUint64(nil, w.fnv))
	return res
}

func (w *world) newHandle() engine.HandleID {
	w.handles++
	return engine.HandleID(w.handles)
}

// move is one thing that can happen next: do, or for the moves offered at
// nearly every step, one of the kinds below, which needs no closure (the
// simulator's speed is bounded by what it allocates per step).
type move struct {
	weight int
	do     func()
	kind   moveKind
	c      *cluster
	n      *consumer
	cl     *client
	g      *gor
	i      int
}

// moveKind is a move that needs no closure.
type moveKind uint8

const (
	moveDo           moveKind = iota // do
	moveComplete                     // c completes its operation i
	moveConsume                      // n reads its next entry
	moveRestartNode                  // n restarts
	moveClientStart                  // cl starts its next operation
	moveClientGiveUp                 // cl gives up its wait
	moveTick                         // time passes
	moveClockJump                    // the clock jumps
	moveResume                       // g, a driver's goroutine, goes on
)

// run makes the move happen.
func (m move) run(w *world) {
	switch m.kind {
	case moveComplete:
		m.c.complete(m.i)
	case moveConsume:
		m.n.next()
	case moveRestartNode:
		m.n.restart()
	case moveClientStart:
		m.cl.start()
	case moveClientGiveUp:
		m.cl.giveUp()
	case moveTick:
		w.tick()
	case moveClockJump:
		w.clockJump()
	case moveResume:
		w.sched.goOn(m.g)
	default:
		m.do()
	}
}

func (w *world) run() {
	for w.err == nil {
		if w.steps >= w.cfg.MaxSteps {
			w.fail("liveness: the run did not finish in %d steps (R11.3)\n%s", w.cfg.MaxSteps, w.state())
			return
		}
		if w.quiet == nil && (w.steps >= w.faultSteps || w.finished()) {
			w.quiesce()
		}
		if w.quiet != nil {
			if w.quietLate() {
				return
			}
			if w.finished() {
				if w.quiet.fresh == nil {
					w.freshRequests()
					continue
				}
				w.finish()
				return
			}
		}
		moves := w.moves()
		if len(moves) == 0 {
			if !w.tick() {
				w.fail("liveness: nothing can happen and the run has not finished (R11.3)\n%s", w.state())
				return
			}
			continue
		}
		total := 0
		for _, m := range moves {
			total += m.weight
		}
		if w.cfg.panicAt != 0 && w.steps >= w.cfg.panicAt && w.sched == nil {
			panic("sim: a planted panic")
		}
		r := w.rng.IntN(total)
		for _, m := range moves {
			if r < m.weight {
				w.steps++
				m.run(w)
				break
			}
			r -= m.weight
		}
		if w.sched != nil {
			w.afterGoroutines()
		}
		if w.err == nil {
			w.check.always()
		}
	}
}

// moves lists what can happen now, with weights.
func (w *world) moves() []move {
	ms := w.moveBuf[:0]
	for _, c := range w.clusters() {
		c := c
		if c.down {
			if !w.lost(c) {
				ms = append(ms, move{weight: 5, do: func() { w.restart(c) }})
			}
			continue
		}
		for i := range c.ops {
			ms = append(ms, move{weight: 10, kind: moveComplete, c: c, i: i})
		}
		if c.driver {
			c.tickDriver()
		}
		for _, n := range c.nodes {
			if n.ready() {
				ms = append(ms, move{weight: 4, kind: moveConsume, n: n})
			}
		}
		if w.faultsOn {
			if n, crash := w.crashMove(c); n > 0 {
				ms = append(ms, move{weight: n, do: crash})
			}
			if c.driver && !c.drv.closing && c.drv.closes < 2 {
				ms = append(ms, move{weight: 1, do: c.closeDriver})
			}
		}
		if d, ok := c.core.Deadline(); ok && !w.cfg.Calm && (w.faultsOn || d.Sub(w.now) <= time.Minute) {
			// Time passes at random while faults are on; then it passes
			// only to retry what failed (a minute covers a backoff after
			// the clock jumped back), or when nothing else can happen, so
			// that the quiescent phase's virtual time measures waits.
			ms = append(ms, move{weight: 1, kind: moveTick})
		}
	}
	for _, cl := range w.clients {
		if k := cl.ready(); k != moveDo {
			ms = append(ms, move{weight: 5, kind: k, cl: cl})
		}
	}
	if w.sched != nil {
		ms = w.sched.moves(ms)
		ms = w.promoteMoves(ms)
	}
	if w.repl != nil {
		ms = append(ms, w.repl.moves()...)
	}
	ms = w.watchMoves(ms)
	if len(w.orphans()) > 0 {
		ms = append(ms, move{weight: 1, do: w.reconcile})
	}
	if w.faultsOn {
		if !w.cfg.Calm {
			ms = append(ms, move{weight: 1, kind: moveClockJump})
		}
		for _, c := range w.clusters() {
			if !c.down {
				for _, n := range c.nodes {
					ms = append(ms, move{weight: 1, kind: moveRestartNode, n: n})
				}
			}
		}
	}
	if op := w.operator(); op != nil {
		ms = append(ms, move{weight: 1, do: op})
	}
	w.moveBuf = ms[:0] // the next step appends over this one's moves
	return ms
}

// crashMove is the move that crashes c now and its weight, 0 if it may
// not crash: each cluster crashes at most three times, and a secondary
// whose force promote has appended supplements and not ended twice more,
// likely while it has writes or appends in flight. So seeds often crash it
// with a supplement, or the ack that records it, landing unheard, and its
// resumed promote must find what the first run appended (R8.3).
func (w *world) crashMove(c *cluster) (int, func()) {
	if c == w.second && w.repl.lost && !w.repl.promoted && c.promoteCrashes < 2 &&
		len(w.check.facts(c).supplements) > 0 && c.core.View().PromoteTask() != 0 {
		n := 1
		if len(c.ops) > 0 {
			n = 12
		}
		return n, func() {
			c.promoteCrashes++
			c.crash()
		}
	}
	if c.crashN < 3 {
		return 1, c.crash
	}
	return 0, nil
}

func (w *world) clusters() []*cluster {
	if w.second != nil {
		return []*cluster{w.primary, w.second}
	}
	return []*cluster{w.primary}
}

// tick moves the clock to the earliest deadline of a running core and
// steps it; false if no core has one.
func (w *world) tick() bool {
	var at time.Time
	var who *cluster
	for _, c := range w.clusters() {
		if c.down {
			continue
		}
		if d, ok := c.core.Deadline(); ok && (who == nil || d.Before(at)) {
			at, who = d, c
		}
	}
	if who == nil {
		return false
	}
	if at.After(w.now) {
		w.now = at
	}
	who.step(engine.Tick{})
	return true
}

// restart recovers a crashed or fenced cluster from its catalog and WAL.
func (w *world) restart(c *cluster) {
	if err := c.start(); err != nil {
		w.fail("%s: recovery failed: %v", c.name, err)
	}
}

// clockJump moves the wall clock: forward by up to two hours, or back a
// little (R6.3: a restart or a jump must never extend a window).
func (w *world) clockJump() {
	d := time.Duration(w.rng.IntN(120)) * time.Minute
	if w.rng.IntN(4) == 0 {
		d = -time.Duration(w.rng.IntN(30)) * time.Second
	}
	w.now = w.now.Add(d)
	w.tracef("clock jumps %v", d)
}

// fault reports whether an injected fault with probability p happens.
func (w *world) fault(p float64) bool {
	if !w.faultsOn || w.rng.Float64() >= p {
		return false
	}
	w.faults++
	return true
}

func (w *world) fail(format string, args ...any) {
	if w.err == nil {
		w.err = fmt.Errorf("step %d: %s", w.steps, fmt.Sprintf(format, args...))
		w.tracef("VIOLATION: %v", w.err)
	}
}

func (w *world) tracef(format string, args ...any) {
	if w.cfg.Trace {
		w.trace = append(w.trace, fmt.Sprintf("%6d %s ", w.steps, w.now.Format("15:04:05.000"))+fmt.Sprintf(format, args...))
	}
}

// hashEvent and hashAction digest the run so that two runs of one seed can
// be compared: the cluster, the time and the numbers that identify each
// event and action (ids, attempts, whether it failed).
func (w *world) hashEvent(c *cluster, ev engine.Event) {
	w.mix(c.name[0], uint64(w.now.UnixNano()))
	w.mixValue(ev)
	if w.cfg.Trace {
		if _, tick := ev.(engine.Tick); !tick {
			w.tracef("%s <- %T %s", c.name, ev, summary(ev))
		}
	}
}

func (w *world) hashAction(c *cluster, a *engine.Action) {
	w.mix(c.name[0] + 1)
	w.mixAction(a)
	if w.cfg.Trace {
		x := actionValue(a)
		w.tracef("%s -> %T %s", c.name, x, summary(x))
	}
}

// actionValue is the field of a that holds it.
func actionValue(a *engine.Action) any {
	switch a.Kind {
	case engine.ActReply:
		return a.Reply
	case engine.ActWrite:
		return a.Write
	case engine.ActAppend:
		return a.Append
	case engine.ActCallback:
		return a.Callback
	case engine.ActCancelCallback:
		return a.CancelCallback
	case engine.ActAckOnce:
		return a.AckOnce
	case engine.ActScan:
		return a.Scan
	case engine.ActRoleChanged:
		return a.RoleChanged
	case engine.ActFenced:
		return a.Fenced
	}
	return nil
}

// mix folds numbers into the run's digest (FNV-1a over their bytes).
func (w *world) mix(tag byte, nums ...uint64) {
	const prime = 1099511628211
	w.fnv = (w.fnv ^ uint64(tag)) * prime
	for _, n := range nums {
		for range 8 {
			w.fnv = (w.fnv ^ (n & 0xff)) * prime
			n >>= 8
		}
	}
}

func bit(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func errFlag(err error) uint64 { return bit(err != nil) }

// mixValue folds an event or action's identifying numbers into the digest.
func (w *world) mixValue(x any) {
	switch x := x.(type) {
	case engine.Resolve:
		w.mix(1, uint64(x.Handle))
	case engine.Lock:
		w.mix(2, uint64(x.Handle), uint64(len(x.Keys)), bit(x.Try))
	case engine.Close:
		w.mix(3, uint64(x.Handle))
	case engine.Submit:
		w.mix(4, uint64(x.Handle), uint64(len(x.Bytes)))
	case engine.Wait:
		w.mix(5, x.ID)
	case engine.Ack:
		w.mix(6, x.ID, x.Checkpoint.MessageID, bit(x.Msg != nil), uint64(len(x.VChannel)))
	case engine.Written:
		w.mix(7, x.ID, errFlag(x.Err))
	case engine.Appended:
		w.mix(8, x.ID, errFlag(x.Err))
	case engine.CallbackDone:
		w.mix(9, x.Task, uint64(x.Attempt), errFlag(x.Err))
	case engine.AckOnceDone:
		w.mix(10, x.ID, errFlag(x.Err))
	case engine.Scanned:
		w.mix(11, x.ID, uint64(len(x.Found)), errFlag(x.Err))
	case engine.Tick:
		w.mix(12)
	case engine.WaitAcked:
		w.mix(22, x.ID, uint64(len(x.VChannels)))
	default:
		w.mix(0)
	}
}

// mixAction folds an action's identifying numbers into the digest.
func (w *world) mixAction(a *engine.Action) {
	switch a.Kind {
	case engine.ActReply:
		x := &a.Reply
		var o, r uint64
		if x.Original != nil {
			o = x.Original.ID
		}
		if x.Result != nil {
			r = x.Result.ID
		}
		w.mix(13, errFlag(x.Err), bit(x.Admitted), bit(x.Granted), o, r)
	case engine.ActWrite:
		x := &a.Write
		w.mix(14, x.ID, uint64(x.Kind), x.Task, uint64(len(x.Ops)))
	case engine.ActAppend:
		x := &a.Append
		w.mix(15, x.ID, uint64(len(x.Items)), uint64(len(x.Lane)))
	case engine.ActCallback:
		w.mix(16, a.Callback.Task, uint64(a.Callback.Attempt))
	case engine.ActAckOnce:
		w.mix(17, a.AckOnce.ID, a.AckOnce.Task)
	case engine.ActScan:
		w.mix(18, a.Scan.ID, a.Scan.From)
	case engine.ActRoleChanged:
		w.mix(19, uint64(a.RoleChanged.Role))
	case engine.ActFenced:
		w.mix(20)
	case engine.ActCancelCallback:
		w.mix(21, a.CancelCallback.Task)
	default:
		w.mix(0)
	}
}

// summary is a short, deterministic description of an event or action.
func summary(x any) string {
	switch x := x.(type) {
	case engine.Resolve:
		return fmt.Sprintf("handle=%d key=%s", x.Handle, x.Key.Fingerprint())
	case engine.Lock:
		return fmt.Sprintf("handle=%d keys=%v try=%v", x.Handle, x.Keys, x.Try)
	case engine.Close:
		return fmt.Sprintf("handle=%d", x.Handle)
	case engine.Submit:
		return fmt.Sprintf("handle=%d type=%s", x.Handle, x.Msg.Type)
	case engine.Wait:
		return fmt.Sprintf("id=%d", x.ID)
	case engine.Ack:
		return fmt.Sprintf("id=%d v=%s cp=%d msg=%v", x.ID, x.VChannel, x.Checkpoint.MessageID, x.Msg != nil)
	case engine.Written:
		return fmt.Sprintf("id=%d err=%v", x.ID, x.Err)
	case engine.Appended:
		return fmt.Sprintf("id=%d err=%v", x.ID, x.Err)
	case engine.CallbackDone:
		return fmt.Sprintf("task=%d attempt=%d err=%v", x.Task, x.Attempt, x.Err)
	case engine.AckOnceDone:
		return fmt.Sprintf("id=%d err=%v", x.ID, x.Err)
	case engine.Scanned:
		return fmt.Sprintf("id=%d found=%d err=%v", x.ID, len(x.Found), x.Err)
	case engine.Reply:
		s := fmt.Sprintf("to=%s err=%v admitted=%v granted=%v", x.To.(*request).name(), x.Err, x.Admitted, x.Granted)
		if x.Original != nil {
			s += fmt.Sprintf(" original=%d", x.Original.ID)
		}
		if x.Result != nil {
			s += fmt.Sprintf(" result=%d", x.Result.ID)
		}
		return s
	case engine.Write:
		return fmt.Sprintf("id=%d kind=%s task=%d ops=%d", x.ID, x.Kind, x.Task, len(x.Ops))
	case engine.Append:
		return fmt.Sprintf("id=%d lane=%s items=%d", x.ID, x.Lane, len(x.Items))
	case engine.Callback:
		return fmt.Sprintf("task=%d attempt=%d", x.Task, x.Attempt)
	case engine.AckOnce:
		return fmt.Sprintf("id=%d task=%d v=%s", x.ID, x.Task, x.VChannel)
	case engine.Scan:
		return fmt.Sprintf("id=%d p=%s from=%d", x.ID, x.PChannel, x.From)
	case engine.RoleChanged:
		return fmt.Sprintf("role=%s", x.Role)
	case engine.Fenced:
		return fmt.Sprintf("err=%v", x.Err)
	case engine.CancelCallback:
		return fmt.Sprintf("task=%d", x.Task)
	case engine.WaitAcked:
		return fmt.Sprintf("id=%d vchannels=%v", x.ID, x.VChannels)
	}
	return ""
}

// finished reports whether the workload is done and every cluster idle.
func (w *world) finished() bool {
	if w.open > 0 {
		return false
	}
	for _, cl := range w.clients {
		if !cl.done() {
			return false
		}
	}
	if w.repl != nil && !w.repl.done() {
		return false
	}
	if len(w.orphans()) > 0 {
		return false
	}
	for _, c := range w.clusters() {
		if w.lost(c) {
			continue
		}
		if c.down || len(c.ops) > 0 || c.driver && w.sched.busy(c.drv.rt) {
			return false
		}
		for _, n := range c.nodes {
			// A node waiting out a retry is not idle (with faults on,
			// ready says no while it waits).
			if n.ready() || len(n.queue) > 0 || n.wait != nil && !n.wait.done {
				return false
			}
		}
		if live, _ := c.core.View().Counts(); live > 0 {
			return false
		}
	}
	return true
}

// lost reports whether c is a primary lost for good.
func (w *world) lost(c *cluster) bool { return c == w.primary && w.repl != nil && w.repl.lost }

// orphans lists the groups a force promote left open on the promoted
// cluster, begun on the old primary, that no reconciler has taken yet:
// their end may never reach the promoted cluster (their clients moved on
// when the old primary answered), so an application reconciles them after
// the failover (R13.5). Only groups begun on the old primary qualify, so a
// group of the promoted cluster's own that failed to end is still caught.
func (w *world) orphans() []engine.GroupView {
	if w.repl == nil || !w.repl.promoted || w.second.down {
		return nil
	}
	var out []engine.GroupView
	for _, g := range w.second.openGroups() {
		if g.Holding && !w.reconciled[g.ID] && w.check.facts(w.primary).recs[g.ID] != nil {
			out = append(out, g)
		}
	}
	return out
}

// reconcile starts a client of its own that rolls back the first orphan
// group, racing its original client's end if that is still retrying (the
// first end wins, R13.3).
func (w *world) reconcile() {
	g := w.orphans()[0]
	if w.reconciled == nil {
		w.reconciled = map[uint64]bool{}
	}
	w.reconciled[g.ID] = true
	op := &clientOp{typ: typCreate, ownerKey: g.OwnerKey, txn: g.OwnerKey == "", ends: message.GroupRollback,
		members: []message.Type{typCreate}, phase: 1, gid: g.ID, reconcile: true, key: message.ClusterKey(fmt.Sprint("reconcile/", g.ID))}
	if g.OwnerKey != "" {
		op.typ, op.members[0] = typOwner, typRoll
	}
	cl := &client{w: w, id: len(w.clients), c: w.second, ops: []*clientOp{op}}
	w.clients = append(w.clients, cl)
	w.tracef("reconciler: client %d rolls back group %d left open by the promote", cl.id, g.ID)
}

// finish checks the end state and then lets every window expire, checking
// that GC collects everything.
func (w *world) finish() {
	w.leaks()
	if w.err != nil {
		return
	}
	w.check.final()
	if w.err != nil {
		return
	}
	w.now = w.now.Add(4 * time.Hour)
	for range 1000 {
		if !w.tick() || w.err != nil {
			break
		}
		for _, c := range w.clusters() {
			for len(c.ops) > 0 && w.err == nil {
				c.complete(0)
			}
		}
		w.settleGoroutines()
		if w.collected() {
			break
		}
	}
	if w.err == nil && !w.collected() {
		w.fail("GC left tombstones past every window:\n%s", w.state())
	}
}

// collected reports whether every running cluster's tombstones are gone.
func (w *world) collected() bool {
	for _, c := range w.clusters() {
		if c.down || c == w.primary && w.repl != nil && w.repl.lost {
			continue
		}
		if _, n := c.core.View().Counts(); n > 0 {
			return false
		}
	}
	return true
}

// state describes the clusters, for a failure report.
func (w *world) state() string {
	s := ""
	for _, c := range w.clusters() {
		if c.down {
			s += c.name + ": down\n"
			continue
		}
		for _, t := range c.core.View().LiveTasks() {
			s += fmt.Sprintf("%s: task %d %s stage %s copies %+v attempts %d err %q\n", c.name, t.ID, t.Msg.Type, t.Stage, t.Copies, t.Attempts, t.LastError)
		}
		s += fmt.Sprintf("%s: %d ops in flight, locks %+v\n", c.name, len(c.ops), c.core.View().Locks())
		for _, g := range c.core.View().Groups() {
			s += fmt.Sprintf("%s: open group %+v\n", c.name, g)
		}
		if live, n := c.core.View().Counts(); n > 0 {
			s += fmt.Sprintf("%s: %d live, %d tombstones\n", c.name, live, n)
		}
	}
	for _, cl := range w.clients {
		s += cl.describe() + "\n"
	}
	return s
}

func beUint64(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

func beBytes(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// message types of the workload.
var (
	typCreate = message.Type{Name: "CreateCollection", Version: 1}
	typSync   = message.Type{Name: "Truncate", Version: 1} // AckSyncUp
	typOnce   = message.Type{Name: "Flush", Version: 1}    // with an ack-once callback
	typPlain  = message.Type{Name: "NoCallback", Version: 1}
	typImport = message.Type{Name: "Import", Version: 1} // a retention class of its own
	// An owner (R13.7) acquires the ownership its payload names; typEnd
	// and typRoll end it.
	typOwner = message.Type{Name: "ImportJob", Version: 1}
	typEnd   = message.Type{Name: "CommitImport", Version: 1}
	typRoll  = message.Type{Name: "RollbackImport", Version: 1}
)

var types = []struct {
	typ              message.Type
	syncUp, callback bool
}{
	{typCreate, false, true}, {typSync, true, true}, {typOnce, false, true}, {typPlain, false, false}, {typImport, false, true},
}

// afterGoroutines checks, after a move of a driver-mode run, for a
// goroutine's panic and for a broadcaster that stopped itself (fenced):
// its goroutines are killed as in a crash, and it recovers as after one.
func (w *world) afterGoroutines() {
	if p := w.sched.panicked; p != "" {
		w.fail("panic: %s", p)
		return
	}
	w.sched.waitsOnlyForTheCore()
	for _, c := range w.clusters() {
		if c.driver && !c.down && c.drv.closing {
			if c.drv.closed {
				w.afterClose(c)
			}
			continue
		}
		if c.driver && !c.down && c.core.View().Stopped() {
			w.tracef("%s: broadcaster %d stopped", c.name, c.gen)
			c.stopDriver()
			c.down = true
			for _, r := range w.requests {
				if r.c == c && !r.done {
					r.lost()
				}
			}
		}
	}
}

// settleGoroutines runs every goroutine that may go on, in order, until
// none may (the end of a run, with no faults).
func (w *world) settleGoroutines() {
	if w.sched == nil {
		return
	}
	for range 10000 {
		var g *gor
		for _, x := range w.sched.gs {
			if !x.rt.dead && x.runnable() {
				g = x
				break
			}
		}
		if g == nil || w.err != nil {
			return
		}
		w.sched.resume(g, true)
		w.afterGoroutines()
	}
}

// stopGoroutines kills what every broadcaster of a driver-mode run still
// runs, so that no goroutine outlives its run.
func (w *world) stopGoroutines() {
	for _, c := range w.clusters() {
		if c != nil && c.driver && c.drv.rt != nil && !c.drv.rt.dead {
			w.sched.kill(c.drv.rt)
		}
	}
	w.sched.stop()
}
