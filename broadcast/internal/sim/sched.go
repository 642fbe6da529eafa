package sim

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/walcast/walcast/broadcast/internal/mutate"
)

// The goroutine layer (R11.1). Seeds that run the real driver
// (Config.Driver) run every goroutine of a broadcaster — its loop, its
// pools' jobs, the callers of its API — as a goroutine of this scheduler:
// one runs at a time, and it runs until it parks (at one of the driver's
// waits, through simrt.Runtime, or in the simulated catalog, WAL or
// callbacks, which park for their I/O) or ends. The world's random source
// picks which parked goroutine goes on next, among those ready to, so a
// seed decides every interleaving between callers, the loop and workers,
// and replays exactly. A crash kills a broadcaster's goroutines where they
// park.

// sched runs the simulated goroutines one at a time.
type sched struct {
	w  *world
	gs []*gor // not ended, in creation order
	// running is the goroutine that holds the baton (nil: the simulator's
	// own goroutine); back is where the baton comes back.
	running *gor
	back    chan struct{}
	n       int
	// watchdog catches a goroutine that blocks outside the scheduler (a
	// wait the driver does not route through its runtime): it would hang
	// the run.
	watchdog *time.Timer
	// panicked is a goroutine's panic, with its stack.
	panicked string
	// idle are carriers, goroutines whose simulated goroutine ended, that
	// wait for another to run: a carrier keeps the stack its last one
	// grew, which a new goroutine would grow again (the driver's calls go
	// deep).
	idle []chan *gor
}

// gor is one simulated goroutine.
type gor struct {
	id     int
	name   string
	rt     *drt
	fn     func()
	resume chan bool // false: die (a crash)
	// started says its goroutine exists; ready, while it parks, says when
	// it may go on; io is set while it parks in a write or an append,
	// which a crash may land (land).
	started bool
	ready   func() bool
	land    func()
	ended   bool
	// exit runs on the simulator's goroutine once it ended: killed says a
	// crash killed it.
	exit func(killed bool)
	// cancelled is set when its caller's context ended (a give-up).
	cancelled bool
}

const watchdogAfter = 2 * time.Minute

func newSched(w *world) *sched {
	return &sched{w: w, back: make(chan struct{}), watchdog: time.NewTimer(time.Hour)}
}

// spawn makes a goroutine of rt that runs fn once scheduled; exit (if not
// nil) runs once it ended.
func (s *sched) spawn(rt *drt, name string, fn func(), exit func(killed bool)) *gor {
	s.n++
	g := &gor{id: s.n, name: name, rt: rt, fn: fn, exit: exit, resume: make(chan bool)}
	s.gs = append(s.gs, g)
	return g
}

// runnable reports whether g may be resumed now.
func (g *gor) runnable() bool { return !g.started || g.ready != nil && g.ready() }

// park blocks the running goroutine until ready reports true and the
// scheduler picks it; yield parks even if ready already does (an I/O:
// the seed decides when it completes).
func (s *sched) park(ready func() bool, yield bool) {
	g := s.running
	if !yield && ready() {
		return
	}
	if g == nil {
		panic("sim: the simulator's own goroutine would wait")
	}
	if g.rt != nil && g.rt.dead {
		runtime.Goexit()
	}
	g.ready = ready
	s.running = nil
	s.back <- struct{}{}
	if !<-g.resume {
		runtime.Goexit()
	}
}

// inFlight parks the running goroutine in an I/O the seed completes when
// it picks it; a crash meanwhile runs land (the I/O landed) or not.
func (s *sched) inFlight(land func()) {
	g := s.running
	if g != nil {
		g.land = land
	}
	s.park(always, true)
	if g != nil {
		g.land = nil
	}
}

// resume runs g until it parks again or ends.
func (s *sched) resume(g *gor, live bool) {
	s.running = g
	g.ready = nil
	if !g.started {
		g.started = true
		if n := len(s.idle); n > 0 {
			next := s.idle[n-1]
			s.idle = s.idle[:n-1]
			next <- g
		} else {
			go s.carry(g)
		}
	} else {
		g.resume <- live
	}
	s.watchdog.Reset(watchdogAfter)
	select {
	case <-s.back:
	case <-s.watchdog.C:
		buf := make([]byte, 1<<20)
		panic(fmt.Sprintf("sim: goroutine %s blocked outside the simulator's runtime\n%s", g.name, buf[:runtime.Stack(buf, true)]))
	}
	s.watchdog.Stop()
	s.running = nil
	if g.ended {
		s.remove(g)
		if g.exit != nil {
			g.exit(!live || g.rt != nil && g.rt.dead)
		}
	}
}

// carry runs g, then every goroutine the scheduler hands it, until it is
// killed (runtime.Goexit ends the carrier too) or the run ends (stop).
func (s *sched) carry(g *gor) {
	next := make(chan *gor)
	for g != nil {
		s.body(g, next)
		g = <-next
	}
}

// body runs g on the calling carrier; if g ends rather than being killed,
// the carrier is idle (next) before it hands the baton back.
func (s *sched) body(g *gor, next chan *gor) {
	returned := false
	defer func() {
		if p := recover(); p != nil {
			returned = true
			if s.panicked == "" {
				s.panicked = fmt.Sprintf("goroutine %s panicked: %v\n%s", g.name, p, debug.Stack())
			}
		}
		g.ended = true
		if returned {
			s.idle = append(s.idle, next)
		}
		s.back <- struct{}{}
	}()
	g.fn()
	returned = true
}

// stop ends the idle carriers (the run is over).
func (s *sched) stop() {
	for _, next := range s.idle {
		close(next)
	}
	s.idle = nil
}

func (s *sched) remove(g *gor) {
	for i, x := range s.gs {
		if x == g {
			s.gs = append(s.gs[:i], s.gs[i+1:]...)
			return
		}
	}
}

// kill ends every goroutine of rt where it parks, running its deferred
// calls (a crash): its writes and appends in flight land or not first.
func (s *sched) kill(rt *drt) {
	rt.dead = true
	for _, g := range s.gs {
		if g.rt == rt && g.land != nil && s.w.rng.IntN(2) == 0 {
			g.land() // landed; nobody hears
		}
	}
	for {
		var g *gor
		for _, x := range s.gs {
			if x.rt == rt {
				g = x
				break
			}
		}
		if g == nil {
			return
		}
		if !g.started {
			s.remove(g)
			if g.exit != nil {
				g.exit(true)
			}
			continue
		}
		s.resume(g, false)
	}
}

// moves lists the goroutines that may go on, in creation order.
func (s *sched) moves(ms []move) []move {
	for _, g := range s.gs {
		if g.rt.dead || !g.runnable() {
			continue
		}
		ms = append(ms, move{weight: 8, kind: moveResume, g: g})
	}
	return ms
}

// goOn resumes g, one of the moves.
func (s *sched) goOn(g *gor) {
	s.w.mix(30, uint64(g.id))
	s.w.tracef("%s: %s goes on", g.rt.c.name, g.name)
	s.resume(g, true)
}

// busy reports whether a goroutine of rt may go on (a job's I/O, a caller
// answered, the loop woken).
func (s *sched) busy(rt *drt) bool {
	for _, g := range s.gs {
		if g.rt == rt && g.runnable() {
			return true
		}
	}
	return false
}

// waitsOnlyForTheCore checks (R11.5) that every caller whose context ended
// can go on, or waits only for the driver's loop to take its withdrawal
// (one step of the core), never for I/O or a timer.
func (s *sched) waitsOnlyForTheCore() {
	for _, g := range s.gs {
		if !g.cancelled || !g.started || g.rt.dead || g.runnable() {
			continue
		}
		if l := g.rt.loop; l == nil || !l.runnable() {
			s.w.fail("%s: %s waits with its context ended, and not for the loop (R11.5)", g.rt.c.name, g.name)
			return
		}
	}
}

// drt is one broadcaster's runtime (simrt.Runtime): a generation of a
// cluster's coordinator; dead once it crashed or stopped.
type drt struct {
	s    *sched
	c    *cluster
	dead bool
	bug  mutate.Bug
	loop *gor
}

func (r *drt) GoLoop(fn func()) {
	if !r.dead {
		r.loop = r.s.spawn(r, "loop", fn, nil)
	}
}

func (r *drt) Go(fn func()) {
	if !r.dead {
		r.s.spawn(r, "job", fn, nil)
	}
}

func (r *drt) Park(ready func() bool) { r.s.park(ready, false) }

func (r *drt) Yield() { r.s.park(always, true) }

// Fast: the seed decides whether the driver's mutex was free when a
// caller or worker tried to step the core itself.
func (r *drt) Fast() bool { return r.s.w.rng.IntN(4) != 0 }

func (r *drt) Mutation() mutate.Bug { return r.bug }
