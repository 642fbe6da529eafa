package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/client"
)

// ScaleConfig sizes `walcast bench --scale` (SPEC B12, B13): the metadata
// service driven up to a count of collections, measured step by step.
type ScaleConfig struct {
	// Collections is the count to create (default 1,000,000), spread
	// evenly over Databases databases (default 1,000).
	Collections, Databases int
	// Clients create collections concurrently, each with a connection of
	// its own (default 16).
	Clients int
	// Steps is how many steps the count is measured in (default 50: a
	// point every 2%). B12 compares the first and the last tenth of them.
	Steps int
	// Shards of every collection (default 1).
	Shards int
	// Samples are the DescribeCollection and ListCollections calls after
	// each step, one at a time (default 20 each); PageSize is the page
	// ListCollections asks for (default 100).
	Samples, PageSize int
	// APIAddrs, if set, are coordinators to drive instead of a standalone
	// started here; the server's memory and disk are then not measured,
	// nor its recovery.
	APIAddrs []string
	// Command runs a standalone: "--config <file>" is appended, the file
	// naming its data directory, a random API port and the settings below.
	// Default: this executable's "standalone".
	Command []string
	// Settings are YAML lines added to the standalone's configuration
	// (e.g. "broadcast:\n  tombstone:\n    max_count: 16384").
	Settings string
	// Dir holds the standalone's data; default a temporary directory,
	// removed at the end. A given Dir is kept.
	Dir string
	// NoRecovery skips the kill -9 and restart at the end.
	NoRecovery bool
	// RatiosOnly judges only B12's ratios (the last tenth against the
	// first): the other targets are bounds in absolute time and memory,
	// which a small count on another machine does not test (the CI
	// variant). They are still reported.
	RatiosOnly bool
	// Interleaved measures B12's ratios a second way, immune to load that
	// drifts over the run: once the count is reached, a fresh standalone
	// starts beside the full one, and bursts of CreateCollection alternate
	// between the two (interleave). With RatiosOnly, these ratios are the
	// judged ones and the first and last tenth are reported.
	Interleaved bool
	// Progress, if set, is told what runs.
	Progress func(Event)
}

// DefaultScale returns the run of issue 36: a million collections in a
// thousand databases from 16 clients.
func DefaultScale() ScaleConfig {
	return ScaleConfig{Collections: 1_000_000, Databases: 1000, Clients: 16, Steps: 50, Shards: 1, Samples: 20, PageSize: 100}
}

// ScaleStep is what one step of a scale run measured.
type ScaleStep struct {
	// Collections is the count at the end of the step.
	Collections int `json:"collections"`
	// Rate is CreateCollection per second within the step; P50, P99 and
	// Max their latency (ms).
	Rate float64 `json:"create_per_second"`
	P50  float64 `json:"create_p50_ms"`
	P99  float64 `json:"create_p99_ms"`
	Max  float64 `json:"create_max_ms"`
	// Describe and List are the p50 and p99 latencies (ms) of a
	// DescribeCollection of a random collection and of a first page of
	// ListCollections of a random database, after the step.
	DescribeP50 float64 `json:"describe_p50_ms"`
	DescribeP99 float64 `json:"describe_p99_ms"`
	ListP50     float64 `json:"list_p50_ms"`
	ListP99     float64 `json:"list_p99_ms"`
	// The server's resident memory, and its data on disk: the catalog
	// (embedded etcd's directory), the WAL (embedded NATS'), the
	// streaming nodes' state, and etcd's database file (its size and
	// the part in use), and the server's CPU per CreateCollection of the
	// step (µs). 0 when not measured (APIAddrs).
	RSS int64 `json:"rss_bytes"`
	// RSSFile is the part of RSS that is files mapped (etcd's database,
	// read through mmap), which the kernel may reclaim; the rest is the
	// process's own memory (its heap).
	RSSFile    int64   `json:"rss_file_bytes"`
	Catalog    int64   `json:"catalog_bytes"`
	WAL        int64   `json:"wal_bytes"`
	Nodes      int64   `json:"nodes_bytes"`
	EtcdDB     int64   `json:"etcd_db_bytes"`
	EtcdDBUsed int64   `json:"etcd_db_in_use_bytes"`
	CPU        float64 `json:"server_cpu_us_per_create"`
	// GC is the part of CPU the server's garbage collector took, as the
	// Go runtime estimates it (its mark work on otherwise idle CPUs left
	// out), per CreateCollection of the step (µs; 0: not measured).
	GC float64 `json:"server_gc_cpu_us_per_create"`
	// Elapsed is the run's time at the end of the step.
	Elapsed time.Duration `json:"elapsed"`
}

// ScaleReport is a scale run: its steps, the recovery after a kill -9,
// the results against B12 and B13, and the curves.
type ScaleReport struct {
	Steps []ScaleStep `json:"steps"`
	// Ready is how long the restarted standalone took to answer /readyz
	// 200, FirstDDL to create a collection, both from its start.
	Ready    time.Duration `json:"ready"`
	FirstDDL time.Duration `json:"first_ddl"`
	// Quota is the embedded etcd's quota (0: unknown).
	Quota   int64    `json:"etcd_quota_bytes"`
	Results []Result `json:"results"`
	Curves  []Curve  `json:"curves"`
}

// Scale targets (SPEC §12).
const (
	// B12: the last tenth of the count within these factors of the first.
	scaleRateFactor = 1.5
	scaleP99Factor  = 2.0
	scaleMaxCall    = time.Second
	// B13.
	scaleMaxRSS      = 2 << 30
	scaleReady       = 10 * time.Second
	scaleFirstDDL    = 15 * time.Second
	scaleQuotaShare  = 0.5
	defaultEtcdQuota = 2 << 30
)

func (c *ScaleConfig) fill() error {
	d := DefaultScale()
	for _, f := range []struct {
		v    *int
		def  int
		name string
	}{{&c.Collections, d.Collections, "collections"}, {&c.Databases, d.Databases, "databases"}, {&c.Clients, d.Clients, "clients"},
		{&c.Steps, d.Steps, "steps"}, {&c.Shards, d.Shards, "shards"}, {&c.Samples, d.Samples, "samples"}, {&c.PageSize, d.PageSize, "page size"}} {
		if *f.v < 0 {
			return fmt.Errorf("bench: scale %s %d is negative", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if c.Steps > c.Collections {
		c.Steps = c.Collections
	}
	if c.Databases > c.Collections {
		c.Databases = c.Collections
	}
	return nil
}

// Scale runs `walcast bench --scale`: it starts a standalone (or drives
// cfg.APIAddrs), creates cfg.Databases databases and then cfg.Collections
// collections from cfg.Clients clients, and after each step measures
// DescribeCollection and ListCollections and the server's memory and disk;
// then it kills the standalone with SIGKILL, starts it again on its data
// and times its readiness and its first DDL.
func Scale(ctx context.Context, cfg ScaleConfig) (*ScaleReport, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	t := newTracker(cfg.Progress)
	rep := &ScaleReport{}
	addrs := cfg.APIAddrs
	var srv *scaleServer
	if len(addrs) == 0 {
		var err error
		if srv, err = newScaleServer(cfg); err != nil {
			return nil, err
		}
		defer srv.cleanup()
		t.say("starting a standalone in " + srv.dir)
		if _, err := srv.start(ctx); err != nil {
			return nil, err
		}
		defer srv.kill()
		addrs = []string{srv.api}
		rep.Quota = srv.quota
	}
	cs, closeAll, err := clients(addrs, cfg.Clients)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	// Names unique to the run, so that a run against coordinators
	// elsewhere finds its names free.
	run := fmt.Sprintf("s%d", time.Now().UnixNano()%1e9)
	dbName := func(i int) string { return fmt.Sprintf("%s_db%d", run, i) }
	st := t.counted(fmt.Sprintf("scale: %d databases", cfg.Databases), cfg.Databases)
	var next atomic.Int64
	err = eachClient(ctx, cs, func(ctx context.Context, c *client.Client) error {
		for {
			i := int(next.Add(1)) - 1
			if i >= cfg.Databases {
				return nil
			}
			if _, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: dbName(i)}); err != nil {
				return fmt.Errorf("create database %s: %w", dbName(i), err)
			}
			st.add(1)
		}
	})
	st.end()
	if err != nil {
		return nil, err
	}
	create := func(ctx context.Context, c *client.Client, i int) error {
		_, err := c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: dbName(i % cfg.Databases),
			Name: fmt.Sprintf("c%d", i), Shards: int32(cfg.Shards)})
		return err
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 36))
	window := max(1, cfg.Steps/10)
	var first, last []time.Duration // latencies of the first and last window
	var firstDur, lastDur time.Duration
	var firstN, lastN int
	var maxCall time.Duration
	begin := time.Now()
	next.Store(0)
	all := t.counted(fmt.Sprintf("scale: %d collections from %d clients", cfg.Collections, cfg.Clients), cfg.Collections)
	for s := range cfg.Steps {
		upTo := int64(cfg.Collections) * int64(s+1) / int64(cfg.Steps)
		from := next.Load()
		var mu sync.Mutex
		lat := make([]time.Duration, 0, upTo-from)
		cpu0, gc0 := srv.cpu(), srv.gcCPU(ctx)
		start := time.Now()
		err := eachClient(ctx, cs, func(ctx context.Context, c *client.Client) error {
			var mine []time.Duration
			defer func() {
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			}()
			for {
				i := next.Add(1) - 1
				if i >= upTo {
					next.Add(-1) // the next step takes it
					return nil
				}
				t0 := time.Now()
				if err := create(ctx, c, int(i)); err != nil {
					return fmt.Errorf("create collection %d: %w", i, err)
				}
				mine = append(mine, time.Since(t0))
				all.add(1)
			}
		})
		took := time.Since(start)
		cpu, gc := srv.cpu()-cpu0, srv.gcCPU(ctx)-gc0
		if err != nil {
			all.end()
			return rep, err
		}
		next.Store(upTo)
		step := ScaleStep{Collections: int(upTo), Rate: float64(len(lat)) / took.Seconds(),
			P50: ms(Median(lat)), P99: ms(Quantile(lat, 0.99)), Max: ms(slices.Max(lat))}
		maxCall = max(maxCall, slices.Max(lat))
		if cpu > 0 {
			step.CPU = float64(cpu) / float64(len(lat)) / float64(time.Microsecond)
		}
		if gc > 0 {
			step.GC = float64(gc) / float64(len(lat)) / float64(time.Microsecond)
		}
		switch {
		case s < window:
			first, firstDur, firstN = append(first, lat...), firstDur+took, firstN+len(lat)
		case s >= cfg.Steps-window:
			last, lastDur, lastN = append(last, lat...), lastDur+took, lastN+len(lat)
		}
		// Reads, one at a time, between the steps.
		var desc, list []time.Duration
		for range cfg.Samples {
			i := rng.IntN(int(upTo))
			t0 := time.Now()
			if _, err := cs[0].DescribeCollection(ctx, dbName(i%cfg.Databases), fmt.Sprintf("c%d", i)); err != nil {
				all.end()
				return rep, fmt.Errorf("describe collection %d: %w", i, err)
			}
			desc = append(desc, time.Since(t0))
			t0 = time.Now()
			if _, err := cs[0].ListCollectionsPage(ctx, &walcastv1.ListCollectionsRequest{Database: dbName(rng.IntN(cfg.Databases)),
				Limit: int32(cfg.PageSize)}); err != nil {
				all.end()
				return rep, fmt.Errorf("list collections: %w", err)
			}
			list = append(list, time.Since(t0))
		}
		step.DescribeP50, step.DescribeP99 = ms(Median(desc)), ms(Quantile(desc, 0.99))
		step.ListP50, step.ListP99 = ms(Median(list)), ms(Quantile(list, 0.99))
		if srv != nil {
			srv.measure(ctx, &step)
		}
		step.Elapsed = time.Since(begin)
		rep.Steps = append(rep.Steps, step)
		// Each step is reported as it ends, so that a run stopped before
		// its end still leaves its curve so far.
		t.say(stepLine(s+1, cfg.Steps, step))
	}
	all.end()
	rep.Results = append(rep.Results, scaleResults(cfg, rep, first, last, firstN, lastN, firstDur, lastDur, maxCall)...)
	if cfg.Interleaved && srv != nil {
		st := t.timed("scale: a fresh standalone beside the full one, bursts of creates in turns", 0)
		res, err := interleave(ctx, cfg, cs, dbName, create)
		st.end()
		if err != nil {
			return rep, err
		}
		rep.Results = append(rep.Results, res...)
	}
	if srv != nil && !cfg.NoRecovery {
		st := t.timed("scale: kill -9, restart, first DDL", 0)
		err := srv.recover(ctx, rep, func(ctx context.Context, c *client.Client) error {
			return create(ctx, c, cfg.Collections)
		})
		st.end()
		if err != nil {
			return rep, err
		}
		rep.Results = append(rep.Results,
			Result{ID: "B13", Backend: NATS, What: fmt.Sprintf("kill -9 at %d collections: ready again", cfg.Collections),
				Value: rep.Ready.Seconds(), Unit: "s", Target: fmt.Sprintf("<= %v", scaleReady), Pass: rep.Ready <= scaleReady,
				Note: "from the restart of the process to /readyz answering 200"},
			Result{ID: "B13", Backend: NATS, What: "kill -9: first DDL", Value: rep.FirstDDL.Seconds(), Unit: "s",
				Target: fmt.Sprintf("<= %v", scaleFirstDDL), Pass: rep.FirstDDL <= scaleFirstDDL,
				Note: "from the restart of the process to a CreateCollection answered"})
	}
	if cfg.RatiosOnly {
		for i := range rep.Results {
			r := &rep.Results[i]
			judged := ratioTarget(*r) && (!cfg.Interleaved || srv == nil || interleaved(*r))
			if !judged && r.Target != "report" {
				r.Target, r.Pass = r.Target+" (not judged)", true
			}
		}
	}
	rep.Curves = scaleCurves(cfg, rep)
	return rep, nil
}

// interleave measures B12's two ratios with the load of the machine the
// same on both sides: a fresh standalone starts beside the full one (whose
// clients are full), gets the same databases, and then bursts of
// CreateCollection alternate between the two, ten each. Throughput and
// p99 of the full one's bursts are compared with the fresh one's, so a
// load that comes or goes during the run moves both. The full one's
// collections are named past cfg.Collections (and past the recovery's
// first DDL, which creates number cfg.Collections).
func interleave(ctx context.Context, cfg ScaleConfig, full []*client.Client, dbName func(int) string,
	create func(context.Context, *client.Client, int) error) ([]Result, error) {
	fcfg := cfg
	fcfg.Dir = ""
	fresh, err := newScaleServer(fcfg)
	if err != nil {
		return nil, err
	}
	defer fresh.cleanup()
	if _, err := fresh.start(ctx); err != nil {
		return nil, err
	}
	cs, closeAll, err := clients([]string{fresh.api}, cfg.Clients)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	var next atomic.Int64
	if err := eachClient(ctx, cs, func(ctx context.Context, c *client.Client) error {
		for i := int(next.Add(1)) - 1; i < cfg.Databases; i = int(next.Add(1)) - 1 {
			if _, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: dbName(i)}); err != nil {
				return fmt.Errorf("fresh standalone: create database %s: %w", dbName(i), err)
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	// Ten rounds of small bursts: a spike of load lasting a second or so
	// lands on both sides' samples alike (four rounds of 500 let one
	// spike decide the full side's p99 under a CI machine's load).
	const rounds = 10
	size := max(50, cfg.Collections/cfg.Steps/5)
	var fullN, freshN int
	var fullDur, freshDur time.Duration
	var fullP99, freshP99 []time.Duration // each burst's
	for r := range rounds {
		for _, side := range []struct {
			cs   []*client.Client
			base int
			n    *int
			dur  *time.Duration
			p99  *[]time.Duration
		}{{cs, r * size, &freshN, &freshDur, &freshP99}, {full, cfg.Collections + 1 + r*size, &fullN, &fullDur, &fullP99}} {
			lat, took, err := createBurst(ctx, side.cs, side.base, size, create)
			if err != nil {
				return nil, err
			}
			*side.n, *side.dur, *side.p99 = *side.n+len(lat), *side.dur+took, append(*side.p99, Quantile(lat, 0.99))
		}
	}
	fullRate, freshRate := float64(fullN)/fullDur.Seconds(), float64(freshN)/freshDur.Seconds()
	// The p99 of each burst, and their median: a stall that lands in one
	// burst or two (the embedded etcd's compaction every minute, a
	// neighbour's spike) does not decide it; the run at a million reports
	// the longest call for those.
	p99Full, p99Fresh := Median(fullP99), Median(freshP99)
	note := fmt.Sprintf("%d bursts of %d creates each, in turns with a fresh standalone's; p99: the median of the bursts' p99", rounds, size)
	return []Result{
		{ID: "B12", Backend: NATS, What: fmt.Sprintf("CreateCollection/s at %d vs a fresh standalone, interleaved", cfg.Collections),
			Value: fullRate, Unit: "collections/s", Floor: freshRate, Ratio: fullRate / freshRate,
			Target: fmt.Sprintf(">= fresh / %.1f", scaleRateFactor), Pass: fullRate*scaleRateFactor >= freshRate, Note: note},
		{ID: "B12", Backend: NATS, What: "CreateCollection p99 vs a fresh standalone, interleaved",
			Value: ms(p99Full), Unit: "ms", Floor: ms(p99Fresh), Ratio: float64(p99Full) / float64(p99Fresh),
			Target: fmt.Sprintf("<= %.0f x fresh", scaleP99Factor), Pass: float64(p99Full) <= scaleP99Factor*float64(p99Fresh), Note: note},
	}, nil
}

// createBurst creates size collections numbered from base from every
// client of cs; it returns their latencies and how long the burst took.
func createBurst(ctx context.Context, cs []*client.Client, base, size int, create func(context.Context, *client.Client, int) error) ([]time.Duration, time.Duration, error) {
	var mu sync.Mutex
	var next atomic.Int64
	lat := make([]time.Duration, 0, size)
	start := time.Now()
	err := eachClient(ctx, cs, func(ctx context.Context, c *client.Client) error {
		for k := int(next.Add(1)) - 1; k < size; k = int(next.Add(1)) - 1 {
			i := base + k
			t0 := time.Now()
			if err := create(ctx, c, i); err != nil {
				return fmt.Errorf("create collection %d: %w", i, err)
			}
			d := time.Since(t0)
			mu.Lock()
			lat = append(lat, d)
			mu.Unlock()
		}
		return nil
	})
	return lat, time.Since(start), err
}

// stepLine is a step's figures on one line.
func stepLine(n, of int, s ScaleStep) string {
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	return fmt.Sprintf("scale: step %d/%d at %d collections (%v): %.0f CreateCollection/s, p50 %.1f ms, p99 %.1f ms, max %.1f ms, "+
		"server CPU %.0f µs per create (GC %.0f); describe p50 %.2f ms, list p50 %.2f ms; RSS %.0f MiB (files %.0f MiB), "+
		"catalog %.0f MiB, WAL %.0f MiB, nodes %.0f MiB, etcd db %.0f MiB (in use %.0f MiB)",
		n, of, s.Collections, s.Elapsed.Round(time.Second), s.Rate, s.P50, s.P99, s.Max, s.CPU, s.GC, s.DescribeP50, s.ListP50,
		mib(s.RSS), mib(s.RSSFile), mib(s.Catalog), mib(s.WAL), mib(s.Nodes), mib(s.EtcdDB), mib(s.EtcdDBUsed))
}

// interleaved reports whether r is one of interleave's ratios.
func interleaved(r Result) bool { return r.ID == "B12" && strings.HasSuffix(r.What, ", interleaved") }

// ratioTarget reports whether r is one of B12's ratios.
func ratioTarget(r Result) bool {
	return r.ID == "B12" && r.Floor > 0 && r.Target != "report"
}

// scaleResults judges the steps against B12 and B13.
func scaleResults(cfg ScaleConfig, rep *ScaleReport, first, last []time.Duration, firstN, lastN int, firstDur, lastDur, maxCall time.Duration) []Result {
	pct := fmt.Sprintf("the first and the last %d%% of %d collections", 100*max(1, cfg.Steps/10)/cfg.Steps, cfg.Collections)
	firstRate, lastRate := float64(firstN)/firstDur.Seconds(), float64(lastN)/lastDur.Seconds()
	p99First, p99Last := Quantile(first, 0.99), Quantile(last, 0.99)
	out := []Result{
		{ID: "B12", Backend: NATS, What: fmt.Sprintf("CreateCollection/s, last vs first 10%% (%d clients)", cfg.Clients),
			Value: lastRate, Unit: "collections/s", Floor: firstRate, Ratio: lastRate / firstRate,
			Target: fmt.Sprintf(">= first / %.1f", scaleRateFactor), Pass: lastRate*scaleRateFactor >= firstRate, Note: pct},
		{ID: "B12", Backend: NATS, What: "CreateCollection p99, last vs first 10%",
			Value: ms(p99Last), Unit: "ms", Floor: ms(p99First), Ratio: float64(p99Last) / float64(p99First),
			Target: fmt.Sprintf("<= %.0f x first", scaleP99Factor), Pass: float64(p99Last) <= scaleP99Factor*float64(p99First), Note: pct},
		{ID: "B12", Backend: NATS, What: "longest CreateCollection", Value: ms(maxCall), Unit: "ms",
			Target: fmt.Sprintf("<= %v", scaleMaxCall), Pass: maxCall <= scaleMaxCall, Note: fmt.Sprintf("of %d calls", cfg.Collections)},
	}
	if len(rep.Steps) == 0 || rep.Steps[len(rep.Steps)-1].RSS == 0 {
		return out
	}
	w := max(1, cfg.Steps/10)
	mean := func(steps []ScaleStep, f func(ScaleStep) float64) float64 {
		var sum float64
		for _, st := range steps {
			sum += f(st)
		}
		return sum / float64(len(steps))
	}
	cpu := func(s ScaleStep) float64 { return s.CPU }
	if first, last := mean(rep.Steps[:w], cpu), mean(rep.Steps[len(rep.Steps)-w:], cpu); first > 0 {
		out = append(out, Result{ID: "B12", Backend: NATS, What: "server CPU per CreateCollection, last vs first 10%", Value: last, Unit: "us",
			Floor: first, Ratio: last / first, Target: "report", Pass: true,
			Note: "the standalone process's CPU over each step per CreateCollection: the cost on a shared machine, whatever the others take"})
	}
	gc := func(s ScaleStep) float64 { return s.GC }
	if first, last := mean(rep.Steps[:w], gc), mean(rep.Steps[len(rep.Steps)-w:], gc); first > 0 {
		out = append(out, Result{ID: "B12", Backend: NATS, What: "server GC CPU per CreateCollection, last vs first 10%", Value: last, Unit: "us",
			Floor: first, Ratio: last / first, Target: "report", Pass: true,
			Note: fmt.Sprintf("the Go runtime's estimate of its collector's CPU (idle-time marking left out): %.0f%% of the CPU per create in the first 10%%, %.0f%% in the last",
				100*first/mean(rep.Steps[:w], cpu), 100*last/mean(rep.Steps[len(rep.Steps)-w:], cpu))})
	}
	end := rep.Steps[len(rep.Steps)-1]
	n := float64(end.Collections)
	quota := rep.Quota
	if quota == 0 {
		quota = defaultEtcdQuota
	}
	return append(out,
		Result{ID: "B13", Backend: NATS, What: fmt.Sprintf("standalone RSS at %d collections", end.Collections),
			Value: float64(end.RSS) / (1 << 20), Unit: "MiB", Target: fmt.Sprintf("<= %d MiB", scaleMaxRSS>>20), Pass: end.RSS <= scaleMaxRSS,
			Note: fmt.Sprintf("%.0f B per collection; %.0f MiB of it files mapped (etcd's database)", float64(end.RSS)/n, float64(end.RSSFile)/(1<<20))},
		Result{ID: "B13", Backend: NATS, What: "etcd database file", Value: float64(end.EtcdDB) / (1 << 20), Unit: "MiB",
			Floor: float64(quota) / (1 << 20), Ratio: float64(end.EtcdDB) / float64(quota),
			Target: fmt.Sprintf("<= %.0f%% of the quota", 100*scaleQuotaShare), Pass: float64(end.EtcdDB) <= scaleQuotaShare*float64(quota),
			Note: fmt.Sprintf("%.0f B per collection in use (%.0f MiB)", float64(end.EtcdDBUsed)/n, float64(end.EtcdDBUsed)/(1<<20))},
		Result{ID: "B13", Backend: NATS, What: "bytes per collection on disk and in memory", Value: float64(end.Catalog+end.WAL+end.Nodes) / n, Unit: "B",
			Target: "report", Pass: true,
			Note: fmt.Sprintf("catalog %.0f B, WAL %.0f B, nodes' state %.0f B, RSS %.0f B", float64(end.Catalog)/n, float64(end.WAL)/n,
				float64(end.Nodes)/n, float64(end.RSS)/n)})
}

// scaleCurves draws the steps: throughput, latencies, memory and disk
// against the count of collections.
func scaleCurves(cfg ScaleConfig, rep *ScaleReport) []Curve {
	series := func(name string, y func(ScaleStep) float64) Series {
		s := Series{Name: name}
		for _, st := range rep.Steps {
			s.Points = append(s.Points, Point{X: float64(st.Collections), Y: y(st)})
		}
		return s
	}
	note := fmt.Sprintf("%d clients, %d databases, %d shard(s) per collection; reads one at a time after each step", cfg.Clients, cfg.Databases, cfg.Shards)
	rate := Curve{Name: "scale-throughput", Title: "CreateCollection throughput vs collections", XLabel: "collections",
		YLabel: "collections/s", LinearX: true, Note: note,
		Series: []Series{series("CreateCollection/s", func(s ScaleStep) float64 { return s.Rate })}}
	lat := Curve{Name: "scale-latency", Title: "Metadata latency vs collections", XLabel: "collections", YLabel: "ms", LogY: true,
		LinearX: true, Note: note, Series: []Series{
			series("CreateCollection p50", func(s ScaleStep) float64 { return s.P50 }),
			series("CreateCollection p99", func(s ScaleStep) float64 { return s.P99 }),
			series("CreateCollection max", func(s ScaleStep) float64 { return s.Max }),
			series("DescribeCollection p50", func(s ScaleStep) float64 { return s.DescribeP50 }),
			series(fmt.Sprintf("ListCollections (page of %d) p50", cfg.PageSize), func(s ScaleStep) float64 { return s.ListP50 }),
		}}
	out := []Curve{rate, lat}
	if len(rep.Steps) > 0 && rep.Steps[0].CPU > 0 {
		out = append(out, Curve{Name: "scale-cpu", Title: "Standalone CPU per CreateCollection vs collections", XLabel: "collections",
			YLabel: "µs", LinearX: true, Note: note + "; the server process's user and system CPU over each step, and the part its garbage collector took",
			Series: []Series{series("CPU per CreateCollection", func(s ScaleStep) float64 { return s.CPU }),
				series("of it the garbage collector", func(s ScaleStep) float64 { return s.GC })}})
	}
	if len(rep.Steps) > 0 && rep.Steps[0].RSS > 0 {
		mib := func(b int64) float64 { return float64(b) / (1 << 20) }
		out = append(out, Curve{Name: "scale-memory", Title: "Standalone memory and disk vs collections", XLabel: "collections",
			YLabel: "MiB", LinearX: true, Note: note, Series: []Series{
				series("RSS", func(s ScaleStep) float64 { return mib(s.RSS) }),
				series("RSS of files mapped", func(s ScaleStep) float64 { return mib(s.RSSFile) }),
				series("etcd database file", func(s ScaleStep) float64 { return mib(s.EtcdDB) }),
				series("etcd database in use", func(s ScaleStep) float64 { return mib(s.EtcdDBUsed) }),
				series("catalog directory", func(s ScaleStep) float64 { return mib(s.Catalog) }),
				series("WAL directory", func(s ScaleStep) float64 { return mib(s.WAL) }),
				series("nodes' state", func(s ScaleStep) float64 { return mib(s.Nodes) }),
			}})
	}
	for i := range out {
		var parts []string
		for _, s := range out[i].Series {
			parts = append(parts, s.Name+": "+tenths(s.Points))
		}
		out[i].Complexity = strings.Join(parts, "; ")
	}
	return out
}

// tenths states a scale curve's growth from its first tenth of points to
// its last (their means): steps of a run are linear in the count, so the
// last three alone would span a few percent of it.
func tenths(ps []Point) string {
	if len(ps) < 2 {
		return "n/a"
	}
	w := max(1, len(ps)/10)
	mean := func(ps []Point) Point {
		var m Point
		for _, p := range ps {
			m.X, m.Y = m.X+p.X/float64(len(ps)), m.Y+p.Y/float64(len(ps))
		}
		return m
	}
	first, last := mean(ps[:w]), mean(ps[len(ps)-w:])
	k := 0.0
	if first.X > 0 && first.Y > 0 && last.Y > 0 && last.X != first.X {
		k = math.Log(last.Y/first.Y) / math.Log(last.X/first.X)
	}
	return classify(k, first, last)
}

// eachClient runs fn once per client, concurrently, and returns the first
// error (which cancels the others).
func eachClient(ctx context.Context, cs []*client.Client, fn func(ctx context.Context, c *client.Client) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for _, c := range cs {
		wg.Go(func() {
			if err := fn(ctx, c); err != nil {
				once.Do(func() { first = err; cancel() })
			}
		})
	}
	wg.Wait()
	return first
}

// scaleServer is the standalone of a scale run, a child process that the
// run kills with SIGKILL and starts again.
type scaleServer struct {
	command  []string
	dir      string // the data directory
	tmp      bool   // dir is the run's own: remove it at the end
	cfgPath  string
	cmd      *exec.Cmd
	exited   chan struct{}
	out      *tail
	api      string
	metrics  string // host:port of its /metrics ("": none)
	etcd     string
	quota    int64
	etcdCli  *clientv3.Client
	etcdAddr string // what etcdCli dials
}

func newScaleServer(cfg ScaleConfig) (*scaleServer, error) {
	s := &scaleServer{command: cfg.Command, dir: cfg.Dir}
	if len(s.command) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		s.command = []string{exe, "standalone"}
	}
	if s.dir == "" {
		dir, err := os.MkdirTemp("", "walcast-bench-scale-")
		if err != nil {
			return nil, err
		}
		s.dir, s.tmp = dir, true
	}
	if err := os.MkdirAll(s.dir, 0o750); err != nil {
		return nil, err
	}
	s.quota = defaultEtcdQuota
	s.cfgPath = filepath.Join(s.dir, "bench-scale.yaml")
	yaml := fmt.Sprintf("data_dir: %q\napi:\n  addr: 127.0.0.1:0\nmetrics:\n  addr: 127.0.0.1:0\nlog:\n  level: error\naudit:\n  file: \"off\"\n%s\n",
		filepath.Join(s.dir, "data"), cfg.Settings)
	if err := os.WriteFile(s.cfgPath, []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	return s, nil
}

// start runs the standalone and waits for its ready line; it returns
// when the process started.
func (s *scaleServer) start(ctx context.Context) (time.Time, error) {
	args := append(slices.Clone(s.command[1:]), "--config", s.cfgPath)
	cmd := exec.Command(s.command[0], args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return time.Time{}, err
	}
	s.out = &tail{}
	cmd.Stderr = s.out
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return began, err
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l := sc.Text()
			if strings.Contains(l, " ready: ") {
				select {
				case ready <- l:
				default:
				}
			}
			_, _ = s.out.Write([]byte(l + "\n"))
		}
		_ = cmd.Wait()
		close(s.exited)
	}()
	select {
	case l := <-ready:
		for _, f := range strings.Fields(l) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "api":
				s.api = strings.TrimPrefix(v, "http://")
			case "etcd":
				s.etcd = v
			case "metrics":
				s.metrics = strings.TrimSuffix(strings.TrimPrefix(v, "http://"), "/metrics")
			}
		}
		if s.api == "" {
			return began, fmt.Errorf("standalone's ready line names no api: %s", l)
		}
		return began, nil
	case <-s.exited:
		return began, fmt.Errorf("standalone exited before it was ready: %s", s.out)
	case <-ctx.Done():
		s.kill()
		return began, ctx.Err()
	case <-time.After(5 * time.Minute):
		s.kill()
		return began, fmt.Errorf("standalone not ready after 5 minutes: %s", s.out)
	}
}

// kill ends the process with SIGKILL and waits for it.
func (s *scaleServer) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
	s.cmd = nil
	if s.etcdCli != nil {
		_ = s.etcdCli.Close()
		s.etcdCli = nil
	}
}

func (s *scaleServer) cleanup() {
	s.kill()
	if s.tmp {
		_ = os.RemoveAll(s.dir)
	}
}

// cpu is the CPU time the server's process used so far (0 when there is
// none, or it cannot be read).
func (s *scaleServer) cpu() time.Duration {
	if s == nil || s.cmd == nil {
		return 0
	}
	return processCPU(s.cmd.Process.Pid)
}

// gcCPU is the CPU the server's garbage collector took so far, idle-time
// marking left out, as the runtime estimates it in the server's /metrics
// (go_cpu_classes_gc_total_cpu_seconds_total less
// go_cpu_classes_gc_mark_idle_cpu_seconds_total; 0 when there is no
// server or it does not say).
func (s *scaleServer) gcCPU(ctx context.Context) time.Duration {
	if s == nil || s.cmd == nil || s.metrics == "" {
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.metrics+"/metrics", nil)
	if err != nil {
		return 0
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != http.StatusOK {
		return 0
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(io.LimitReader(res.Body, 8<<20))
	if err != nil {
		return 0
	}
	counter := func(name string) float64 {
		if f := families[name]; f != nil && len(f.GetMetric()) == 1 {
			m := f.GetMetric()[0]
			return m.GetCounter().GetValue() + m.GetUntyped().GetValue() // one of them is set
		}
		return 0
	}
	total, idle := counter("go_cpu_classes_gc_total_cpu_seconds_total"), counter("go_cpu_classes_gc_mark_idle_cpu_seconds_total")
	return time.Duration((total - idle) * float64(time.Second))
}

// measure fills in the server's memory and disk.
func (s *scaleServer) measure(ctx context.Context, st *ScaleStep) {
	if s.cmd == nil {
		return
	}
	st.RSS, st.RSSFile = processRSS(s.cmd.Process.Pid)
	data := filepath.Join(s.dir, "data")
	st.Catalog = dirBytes(filepath.Join(data, "etcd"))
	st.WAL = dirBytes(filepath.Join(data, "nats"))
	st.Nodes = dirBytes(filepath.Join(data, "nodes"))
	if s.etcd == "" {
		return
	}
	if s.etcdCli == nil || s.etcdAddr != s.etcd {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.etcd}, DialTimeout: 5 * time.Second})
		if err != nil {
			return
		}
		s.etcdCli, s.etcdAddr = c, s.etcd
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if r, err := s.etcdCli.Status(sctx, s.etcd); err == nil {
		st.EtcdDB, st.EtcdDBUsed = r.DbSize, r.DbSizeInUse
	}
}

// recover kills the standalone with SIGKILL, starts it again on its data,
// and times its readiness and its first DDL (ddl) from the restart.
func (s *scaleServer) recover(ctx context.Context, rep *ScaleReport, ddl func(context.Context, *client.Client) error) error {
	s.kill()
	began, err := s.start(ctx)
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	for {
		resp, err := hc.Get("http://" + s.api + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Since(began) > 2*time.Minute {
			return fmt.Errorf("standalone not ready 2 minutes after its restart: %s", s.out)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.exited:
			return fmt.Errorf("restarted standalone exited: %s", s.out)
		case <-time.After(20 * time.Millisecond):
		}
	}
	rep.Ready = time.Since(began)
	c, err := client.New([]string{s.api})
	if err != nil {
		return err
	}
	defer c.Close()
	dctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := ddl(dctx, c); err != nil {
		return fmt.Errorf("first DDL after the restart: %w", err)
	}
	rep.FirstDDL = time.Since(began)
	return nil
}

// processRSS is a process's resident set size in bytes and the part of it
// that is files mapped, from /proc (0 where they cannot be read).
func processRSS(pid int) (rss, file int64) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(raw), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb << 10
		case "RssFile:":
			file = kb << 10
		}
	}
	return rss, file
}

// processCPU is a process's user and system CPU time, from /proc (0 where
// it cannot be read): fields 14 and 15 of its stat, in clock ticks of
// 1/100 s (Linux's USER_HZ).
func processCPU(pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(raw), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	sy, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+sy) * 10 * time.Millisecond
}

// dirBytes is the size of the files under dir (0 if it does not exist).
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// tail keeps the last lines a process wrote, for an error message.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

const tailBytes = 4 << 10

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*tailBytes {
		t.buf = slices.Clone(t.buf[len(t.buf)-tailBytes:])
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf
	if len(b) > tailBytes {
		b = b[len(b)-tailBytes:]
	}
	if len(b) == 0 {
		return "(no output)"
	}
	return strings.TrimSpace(string(b))
}
