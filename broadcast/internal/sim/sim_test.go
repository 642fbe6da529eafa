package sim

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast/internal/engine"
)

var (
	flagSeeds    = flag.Int("sim.seeds", 0, "seeds to simulate (default 2000, 300 under -race)")
	flagSeed     = flag.Uint64("sim.seed", 0, "replay one seed, with its trace on failure")
	flagFrom     = flag.Uint64("sim.from", 1, "first seed of the run")
	flagDuration = flag.Duration("sim.duration", 0, "soak: simulate seeds for this long, with progress lines")
	flagMutate   = flag.String("sim.mutate", "", "plant a known bug (see engine.Mutations) and expect a failure")
	flagTrace    = flag.String("sim.trace", "", "with -sim.seed: write the whole trace to this file")
)

// regressions are seeds that once failed; CI always runs them. Each is
// also a named test in regress_test.go.
var regressions = []uint64{
	6, 8, 11, 86, 129, 533, 1289, 1558, 1798, 2093, 2479, 5061, 5483, 5836,
}

func replayCommand(seed uint64, mutation string) string {
	cmd := fmt.Sprintf("go test ./broadcast/internal/sim -run TestSimulate -sim.seed=%d -v", seed)
	if mutation != "" {
		cmd += " -sim.mutate=" + mutation
	}
	return cmd
}

func report(t *testing.T, res Result, mutation string) {
	t.Helper()
	msg := fmt.Sprintf("sim: seed %d failed: %v\nreplay: %s", res.Seed, res.Err, replayCommand(res.Seed, mutation))
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
	if *flagSeed != 0 {
		res := Run(Config{Seed: *flagSeed, Mutation: *flagMutate, Trace: true})
		if *flagTrace != "" {
			if err := os.WriteFile(*flagTrace, []byte(strings.Join(res.Trace, "\n")+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("sim: seed %d: %d steps, %d broadcasts, %d duplicates, %d crashes, %d faults, promoted %v, hash %x",
			res.Seed, res.Steps, res.Broadcasts, res.Duplicates, res.Crashes, res.Faults, res.Promoted, res.Hash[:8])
		if res.Err != nil {
			report(t, res, *flagMutate)
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
	seeds := make(chan uint64)
	go func() {
		defer close(seeds)
		for _, s := range regressions {
			seeds <- s
		}
		for i := range n {
			if !deadline.IsZero() && time.Now().After(deadline) {
				return
			}
			seeds <- *flagFrom + uint64(i)
		}
	}()
	start := time.Now()
	var ran, failed, steps atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	progress := time.NewTicker(30 * time.Second)
	defer progress.Stop()
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for s := range seeds {
				res := Run(Config{Seed: s, Mutation: *flagMutate})
				ran.Add(1)
				steps.Add(int64(res.Steps))
				if res.Err != nil {
					failed.Add(1)
					res = Run(Config{Seed: s, Mutation: *flagMutate, Trace: true})
					mu.Lock()
					if failed.Load() <= 3 {
						report(t, res, *flagMutate)
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
	fmt.Printf("sim: %d seeds, %d failures (%d regression seeds; %.0f seeds/s on %d cores, %d steps)\n",
		ran.Load(), failed.Load(), len(regressions), float64(ran.Load())/el.Seconds(), runtime.GOMAXPROCS(0), steps.Load())
	if ran.Load() == 0 {
		t.Fatal("sim: no seed ran")
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
	if Run(Config{Seed: 1}).Hash == Run(Config{Seed: 2}).Hash {
		t.Fatal("seeds 1 and 2 ran the same trace: the seed decides nothing")
	}
}

// TestMutationsCaught plants each known bug in the core and checks the
// simulator catches it within a bounded number of seeds (R11.1: the
// simulator must be able to fail).
func TestMutationsCaught(t *testing.T) {
	const bound = 400
	for _, m := range engine.Mutations {
		t.Run(m, func(t *testing.T) {
			t.Parallel()
			for s := uint64(1); s <= bound; s++ {
				if res := Run(Config{Seed: s, Mutation: m}); res.Err != nil {
					t.Logf("caught at seed %d: %v", s, firstLine(res.Err.Error()))
					return
				}
			}
			t.Fatalf("mutation %s not caught in %d seeds", m, bound)
		})
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
