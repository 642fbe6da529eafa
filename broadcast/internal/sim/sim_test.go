package sim

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast/internal/mutate"
)

var (
	flagSeeds    = flag.Int("sim.seeds", 0, "seeds to simulate (default 2000, 300 under -race)")
	flagSeed     = flag.Uint64("sim.seed", 0, "replay one seed, with its trace on failure")
	flagFrom     = flag.Uint64("sim.from", 1, "first seed of the run")
	flagDuration = flag.Duration("sim.duration", 0, "soak: simulate seeds for this long, with progress lines")
	flagMutate   = flag.String("sim.mutate", "", "plant a known bug (package mutate; build with -tags walcast_mutate) and expect a failure")
	flagTrace    = flag.String("sim.trace", "", "with -sim.seed: write the whole trace to this file")
	flagDriver   = flag.Bool("sim.driver", false, "with -sim.seed: run the seed through the real driver")
)

// TestMain paces the garbage collector for the simulator (unless GOGC is
// set): a seed's live heap is a few megabytes, which the default pace
// collects every few hundred thousand allocations and whose goroutine
// stacks it shrinks each time, only for the driver's to grow them again.
// At 400 the seeds cost about a tenth fewer instructions (B11) for twice
// the memory.
func TestMain(m *testing.M) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	os.Exit(m.Run())
}

// regressions are seeds that once failed; CI always runs them. Each is
// also a named test in regress_test.go. driverRegressions are seeds run
// through the real driver (Config.Driver) that once failed.
var (
	regressions = []uint64{
		6, 8, 11, 86, 129, 533, 1289, 1558, 1798, 2093, 2479, 5061, 5483, 5836, 9332,
	}
	driverRegressions = []uint64{383, 721, 1425, 2087, 5887}
)

// replayCommand is the command that replays seed (with mutation planted,
// through the real driver if driven).
func replayCommand(seed uint64, mutation mutate.Bug, driven ...bool) string {
	extra := ""
	if len(driven) > 0 && driven[0] {
		extra = " -sim.driver"
	}
	if mutation != mutate.None {
		return fmt.Sprintf("go test -tags walcast_mutate ./broadcast/internal/sim -run TestSimulate -sim.seed=%d -sim.mutate=%s%s -v", seed, mutation, extra)
	}
	return fmt.Sprintf("go test ./broadcast/internal/sim -run TestSimulate -sim.seed=%d%s -v", seed, extra)
}

// flagMutation is the bug -sim.mutate names (None if none).
func flagMutation(t *testing.T) mutate.Bug {
	t.Helper()
	b, err := mutate.Parse(*flagMutate)
	if err != nil {
		t.Fatal(err)
	}
	if b != mutate.None && !mutate.Enabled {
		t.Fatalf("-sim.mutate=%s needs a build with -tags walcast_mutate", b)
	}
	return b
}

func report(t *testing.T, res Result, mutation mutate.Bug) {
	t.Helper()
	msg := fmt.Sprintf("sim: seed %d failed: %v\nreplay: %s", res.Seed, res.Err, replayCommand(res.Seed, mutation, res.Driver))
	if len(res.Trace) > 0 {
		tail := res.Trace
		if len(tail) > 300 {
			tail = tail[len(tail)-300:]
		}
		msg += "\ntrace (last lines):\n" + strings.Join(tail, "\n")
	}
	t.Error(msg)
}

// TestSimulate runs seeds (R11.1, R11.2) and says how many ran, so that a
// run that silently simulated nothing is visible.
func TestSimulate(t *testing.T) {
	mutation := flagMutation(t)
	if *flagSeed != 0 {
		var driver *bool
		if *flagDriver {
			driver = flagDriver
		}
		res := Run(Config{Seed: *flagSeed, Mutation: mutation, Trace: true, Driver: driver})
		if *flagTrace != "" {
			if err := os.WriteFile(*flagTrace, []byte(strings.Join(res.Trace, "\n")+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("sim: seed %d: %d steps, %d broadcasts, %d duplicates, %d crashes, %d faults, promoted %v, driver %v, quiesced %v, hash %x",
			res.Seed, res.Steps, res.Broadcasts, res.Duplicates, res.Crashes, res.Faults, res.Promoted, res.Driver, res.Quiesced, res.Hash[:8])
		if res.Err != nil {
			report(t, res, mutation)
		}
		return
	}
	n := *flagSeeds
	if n == 0 {
		n = 2000
		if raceEnabled {
			n = 300
		}
	}
	var deadline time.Time
	if *flagDuration > 0 {
		deadline = time.Now().Add(*flagDuration)
		n = int(^uint(0) >> 1)
	}
	// A seed's top bit asks for a driven run (driverRegressions).
	const driven = 1 << 63
	seeds := make(chan uint64)
	go func() {
		defer close(seeds)
		for _, s := range regressions {
			seeds <- s
		}
		for _, s := range driverRegressions {
			seeds <- s | driven
		}
		for i := range n {
			if !deadline.IsZero() && time.Now().After(deadline) {
				return
			}
			seeds <- *flagFrom + uint64(i)
		}
	}()
	start := time.Now()
	var ran, failed, steps, quiesced, passed, drivenRuns atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	progress := time.NewTicker(30 * time.Second)
	defer progress.Stop()
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for s := range seeds {
				var driver *bool
				if s&driven != 0 {
					yes := true
					s, driver = s&^driven, &yes
				}
				res := Run(Config{Seed: s, Mutation: mutation, Driver: driver})
				ran.Add(1)
				steps.Add(int64(res.Steps))
				if res.Driver {
					drivenRuns.Add(1)
				}
				if res.Quiesced {
					quiesced.Add(1)
					if res.Err == nil {
						passed.Add(1)
					}
				}
				if res.Err != nil {
					failed.Add(1)
					res = Run(Config{Seed: s, Mutation: mutation, Driver: driver, Trace: true})
					mu.Lock()
					if failed.Load() <= 3 {
						report(t, res, mutation)
					}
					mu.Unlock()
				}
				select {
				case <-progress.C:
					fmt.Fprintf(os.Stderr, "sim: %d seeds in %s, %d failures\n", ran.Load(), time.Since(start).Round(time.Second), failed.Load())
				default:
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	fmt.Printf("sim: %d seeds (%d through the real driver), %d failures; %d reached quiescence, %d passed it (R11.3) (%d regression seeds; %.0f seeds/s on %d cores, %d steps)\n",
		ran.Load(), drivenRuns.Load(), failed.Load(), quiesced.Load(), passed.Load(), len(regressions)+len(driverRegressions), float64(ran.Load())/el.Seconds(), runtime.GOMAXPROCS(0), steps.Load())
	switch {
	case ran.Load() == 0:
		t.Fatal("sim: no seed ran")
	case passed.Load() != ran.Load():
		t.Fatalf("sim: %d of %d seeds did not reach or pass their quiescent phase (R11.3)", ran.Load()-passed.Load(), ran.Load())
	}
}

// TestSameSeedSameTrace: a seed replays exactly (R11.1).
func TestSameSeedSameTrace(t *testing.T) {
	for s := uint64(1); s <= 20; s++ {
		a, b := Run(Config{Seed: s}), Run(Config{Seed: s})
		if a.Hash != b.Hash || a.Steps != b.Steps {
			t.Fatalf("seed %d: two runs differ (%x, %d steps vs %x, %d steps)", s, a.Hash[:8], a.Steps, b.Hash[:8], b.Steps)
		}
	}
	// Through the real driver: its closes, promotes, ack waits and AckAlls
	// replay too.
	yes := true
	for s := uint64(1); s <= 10; s++ {
		a, b := Run(Config{Seed: s, Driver: &yes}), Run(Config{Seed: s, Driver: &yes})
		if a.Hash != b.Hash || a.Steps != b.Steps {
			t.Fatalf("driven seed %d: two runs differ (%x, %d steps vs %x, %d steps)", s, a.Hash[:8], a.Steps, b.Hash[:8], b.Steps)
		}
	}
	if Run(Config{Seed: 1}).Hash == Run(Config{Seed: 2}).Hash {
		t.Fatal("seeds 1 and 2 ran the same trace: the seed decides nothing")
	}
}

// TestMutationsCaught plants each known bug (package mutate) and checks
// the simulator catches it within a bounded number of seeds, by the rule
// the bug breaks (R11.4: the checkers can fail, each for its own rule). It
// reports the seed, the step and the time that caught each. It needs a
// build with -tags walcast_mutate (.ci/run runs it).
func TestMutationsCaught(t *testing.T) {
	if !mutate.Enabled {
		t.Skip("planted bugs are compiled in only with -tags walcast_mutate")
	}
	bugs := mutate.All()
	if *flagMutate != "" {
		bugs = []mutate.Bug{flagMutation(t)}
	}
	type catch struct {
		seed  uint64
		step  int
		took  time.Duration
		first string
		// other is the first failure by another rule, if one came first.
		other string
	}
	got := make([]catch, len(bugs))
	t.Run("bugs", func(t *testing.T) {
		for i, b := range bugs {
			t.Run(b.String(), func(t *testing.T) {
				t.Parallel()
				start := time.Now()
				if b.Info().Latency {
					with, without, err := poisonLatency(100, b)
					if err != nil || with <= 2*without {
						t.Fatalf("planted bug %s not caught by the latency of broadcasts on other keys (R11.6): p99 %s with a poisoned callback, %s without (%v)",
							b, with, without, err)
					}
					got[i] = catch{seed: 100, took: time.Since(start), first: fmt.Sprintf("p99 %s with a poisoned callback, %s without, over seeds 1-100 (R11.6)", with, without)}
					return
				}
				other := ""
				var driver *bool
				if b.Info().Driver {
					yes := true
					driver = &yes // a driver's bug: only driven runs reach it
				}
				for s := uint64(1); s <= mutationSeeds; s++ {
					res := Run(Config{Seed: s, Mutation: b, Driver: driver})
					if res.Err == nil {
						continue
					}
					msg := firstLine(res.Err.Error())
					if !strings.Contains(res.Err.Error(), b.Info().Rule) {
						// A consequence caught by another rule: the bug's own
						// rule must still catch it.
						if other == "" {
							other = fmt.Sprintf("seed %d: %s", s, msg)
						}
						continue
					}
					got[i] = catch{seed: s, step: res.Steps, took: time.Since(start), first: msg, other: other}
					return
				}
				t.Fatalf("planted bug %s not caught by the rule it breaks (%s) in %d seeds (first other failure: %s)",
					b, b.Info().Rule, mutationSeeds, other)
			})
		}
	})
	for i, b := range bugs {
		if c := got[i]; c.seed != 0 {
			t.Logf("%-28s %-16s caught at seed %4d step %5d in %6s: %s", b, b.Info().Rule, c.seed, c.step, c.took.Round(time.Millisecond), c.first)
			if c.other != "" {
				t.Logf("%-28s %-16s (first failed by another rule at %s)", "", "", c.other)
			}
		}
	}
}

// mutationSeeds bounds the seeds a planted bug may survive: about twice
// the latest catch (wait-deaf-to-close at seed 137 on 2026-12-07, which
// needs a caller's send to land while a Close's loop ends; group-unordered
// at 96; the supplement appended twice at 59, 328 before its crashes were
// weighted).
const mutationSeeds = 300

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// TestPanickingSeedReported: a seed that panics, on the simulator's
// goroutine or on one of a driven broadcaster's, fails with the panic and
// its stack instead of killing the test binary, so that its seed and the
// command that replays it are printed (report).
func TestPanickingSeedReported(t *testing.T) {
	for _, driver := range []bool{false, true} {
		res := Run(Config{Seed: 3, Driver: &driver, panicAt: 40})
		if res.Err == nil || !strings.Contains(res.Err.Error(), "planted panic") || !strings.Contains(res.Err.Error(), "goroutine") {
			t.Fatalf("driver %v: a panicking seed reported %v", driver, res.Err)
		}
	}
}
