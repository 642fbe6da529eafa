package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/walcast/walcast/cmd/walcast/internal/bench"
	"github.com/walcast/walcast/cmd/walcast/internal/bench/plot"
)

func benchCmd(g *globals) *cobra.Command {
	cfg := bench.Defaults()
	sw := bench.DefaultSweep()
	sc := bench.DefaultScale()
	var sweep, scale bool
	plots := "docs/bench"
	var profiles string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure walcast against SPEC §12 (B1-B9) with the raw backend floors of the same run, and the cost of TLS + auth (S1, S2)",
		Long: `Run the performance benchmarks of SPEC §12 on a fresh embedded etcd and NATS JetStream
(syncing every write), or on external ones (--etcd, --nats), and print each result with
the raw backend's figure measured in the same run and the ratio. B1, B2 (with B2r, its
batched floor, reported: its target is retired) and B4 also run on Kafka (franz-go against kfake, or --kafka brokers).
Machines are noisy: compare ratios, not absolute numbers, across runs. B10 measures the
engine alone on in-memory backends (its CPU and allocations per broadcast, the same body as
go test's BenchmarkBroadcast); --only B10 starts no etcd or NATS.

--api adds B8 and B9 through the Connect API of a standalone process started here on
its own embedded backends (or of the coordinators at --api-addr): B8 is B2's throughput
from 64 client connections against in-process B2 measured in turns with it (on the same
standalone's broadcaster, or on one of the bench's own with --api-addr), B9 is
CreateCollection per second from 16 clients. S1 and S2 measure what TLS and a bearer
token cost through the API: B1's latency and B2's throughput through the Go client
against two standalone processes, one plain and one with TLS and a token (as --secure).

--scale measures the metadata service up to a count of collections instead (B12, B13;
default a million in 1,000 databases from --meta-clients 16: 15-40 minutes here): it
starts a standalone process (this executable's standalone command) on a data directory
of its own, or drives --api-addr, and after each of --scale-steps steps reports
CreateCollection/s, its p50, p99 and longest, the server's CPU per CreateCollection and
the part its garbage collector took (from its /metrics), DescribeCollection and a page of ListCollections, the server's RSS, catalog, WAL and
nodes' bytes on disk and etcd's database; then it kills the standalone with SIGKILL,
starts it again and times its readiness and first DDL. Curves go to --plots.

--sweep measures growth curves instead (minutes: 16k vchannels, 1M tombstones): broadcast
latency vs target vchannels on 4, 64 and 256 pchannels, throughput vs clients beside the
batched floor, the callback scheduler with N queued conflicting tasks, recovery time,
memory and duplicate-hit latency vs tombstones. Each prints as a table with the growth
measured (O(1), O(log n), O(n)), and is drawn as PNG and SVG into --plots.

Progress goes to stderr: a status line on a terminal, plain lines otherwise, JSON lines
with -o json or yaml (the results then print in that format on stdout). The results end
with the machine they were measured on: when, how many CPUs, the load average at the
start and the end, the Go version and the commit ("machine" in -o json).

It exits 1 when a result misses its target (the results are printed first), and 2
when --only names no benchmark.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := g.format()
			if err != nil {
				return err
			}
			for i, id := range cfg.Only {
				known := ""
				for _, k := range bench.IDs {
					if strings.EqualFold(k, strings.TrimSpace(id)) {
						known = k
					}
				}
				if known == "" {
					return usageError{fmt.Errorf("--only %q is no benchmark: they are %s", id, strings.Join(bench.IDs, ", "))}
				}
				cfg.Only[i] = known
			}
			cfg.Progress = progressPrinter(cmd.ErrOrStderr(), f.machine())
			if profiles != "" {
				if err := os.MkdirAll(profiles, 0o755); err != nil {
					return err
				}
				var stop func()
				cfg.Progress, stop = profileSteps(profiles, cfg.Progress, cmd.ErrOrStderr())
				defer stop()
			}
			m := bench.StartMachine()
			if sweep {
				return runSweep(cmd, f, cfg, sw, plots, m)
			}
			if scale {
				sc.Progress, sc.APIAddrs, sc.Clients = cfg.Progress, cfg.APIAddrs, cfg.MetaClients
				return runScale(cmd, f, sc, plots, m)
			}
			res, err := bench.Run(cmd.Context(), cfg)
			m.Finish()
			finishProgress(cmd.ErrOrStderr(), f.machine())
			var missed []string
			for _, r := range res {
				if !r.Pass {
					missed = append(missed, r.ID)
				}
			}
			if f.machine() {
				rows := make([]any, len(res))
				for i, r := range res {
					rows[i] = object{"id": r.ID, "backend": r.Backend, "what": r.What, "value": r.Value, "unit": r.Unit, "floor": r.Floor,
						"ratio": r.Ratio, "target": r.Target, "pass": r.Pass, "note": r.Note}
				}
				if perr := emit(cmd.OutOrStdout(), f, object{"results": rows, "missed": missed, "machine": machineObject(m)}); perr != nil {
					return perr
				}
			} else {
				if ferr := printResults(cmd.OutOrStdout(), res); ferr != nil {
					return ferr
				}
				fmt.Fprintf(cmd.OutOrStdout(), "machine: %s\n", m)
			}
			if err != nil {
				return err
			}
			if len(missed) > 0 {
				return kindError{"target_missed", fmt.Errorf("bench: %s missed %s target", strings.Join(missed, ", "), plural(len(missed), "its", "their"))}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringSliceVar(&cfg.Etcd, "etcd", nil, "external etcd endpoints (default: an embedded etcd in a temp dir)")
	fl.StringVar(&cfg.NATS, "nats", "", "external NATS URL (default: an embedded server syncing every write)")
	fl.IntVar(&cfg.Replicas, "nats-replicas", 1, "replicas of the JetStream streams the benchmarks create (3 on a NATS cluster, e.g. walcast dev-cluster's)")
	fl.StringSliceVar(&cfg.Kafka, "kafka", nil, "external Kafka brokers (default: kfake, franz-go's in-memory Kafka, in process)")
	fl.StringSliceVar(&cfg.Backends, "backends", nil, "WALs B1, B2 and B4 run on: nats, kafka (default both)")
	fl.IntVar(&cfg.Samples, "samples", cfg.Samples, "sequential operations per latency benchmark")
	fl.IntVar(&cfg.Clients, "clients", cfg.Clients, "concurrent clients of B2")
	fl.DurationVar(&cfg.Duration, "duration", cfg.Duration, "duration of each throughput benchmark (B2's phases together, B8's, B9's)")
	fl.IntVar(&cfg.Tombstones, "tombstones", cfg.Tombstones, "tombstones B6 recovers")
	fl.IntVar(&cfg.Pending, "pending", cfg.Pending, "pending tasks B6 recovers")
	fl.StringSliceVar(&cfg.Only, "only", nil, "run only these ("+strings.Join(bench.IDs, ",")+")")
	fl.IntVar(&cfg.Lanes, "lanes", cfg.Lanes, "WAL lanes the pchannels are folded into (0: one per pchannel)")
	fl.BoolVar(&cfg.API, "api", false, "also run B8 and B9 through the Connect API")
	fl.StringSliceVar(&cfg.APIAddrs, "api-addr", nil, "with --api: coordinators to drive instead of a standalone started here")
	fl.IntVar(&cfg.APIClients, "api-clients", cfg.APIClients, "client connections of B8")
	fl.IntVar(&cfg.MetaClients, "meta-clients", cfg.MetaClients, "client connections of B9")
	fl.BoolVar(&sweep, "sweep", false, "measure the growth curves instead of the targets")
	fl.BoolVar(&scale, "scale", false, "measure the metadata service up to a count of collections instead (B12, B13; --meta-clients clients)")
	fl.IntVar(&sc.Collections, "collections", sc.Collections, "with --scale: collections to create")
	fl.IntVar(&sc.Databases, "databases", sc.Databases, "with --scale: databases the collections are spread over")
	fl.IntVar(&sc.Steps, "scale-steps", sc.Steps, "with --scale: steps the count is measured in (B12 compares the first and last tenth)")
	fl.IntVar(&sc.Shards, "scale-shards", sc.Shards, "with --scale: shards per collection")
	fl.IntVar(&sc.Samples, "scale-samples", sc.Samples, "with --scale: DescribeCollection and ListCollections calls after each step")
	fl.StringVar(&sc.Dir, "scale-dir", "", "with --scale: the standalone's data directory, kept (default: a temporary one, removed)")
	fl.StringVar(&sc.Settings, "scale-settings", "", "with --scale: YAML added to the standalone's configuration")
	fl.BoolVar(&sc.NoRecovery, "scale-no-recovery", false, "with --scale: skip the kill -9 and restart at the end")
	fl.BoolVar(&sc.RatiosOnly, "scale-ratios-only", false, "with --scale: judge only B12's ratios, the last tenth against the first (the CI variant; the rest is reported)")
	fl.BoolVar(&sc.Interleaved, "scale-interleaved", false, "with --scale: also measure B12's ratios against a fresh standalone started beside the full one, bursts of creates in turns (load moves both alike); with --scale-ratios-only, those are the ratios judged")
	fl.StringVar(&plots, "plots", plots, "with --sweep: directory the PNG and SVG plots go to (empty: none)")
	fl.StringVar(&profiles, "profiles", "", "write a CPU profile of each measured step into this directory (NN-step.pprof; profiling costs a few percent)")
	fl.IntSliceVar(&sw.VChannels, "sweep-vchannels", sw.VChannels, "with --sweep: target vchannels of the latency curve")
	fl.IntSliceVar(&sw.PChannels, "sweep-pchannels", sw.PChannels, "with --sweep: pchannel counts of the latency curve")
	fl.IntSliceVar(&sw.Clients, "sweep-clients", sw.Clients, "with --sweep: client counts of the throughput curve")
	fl.IntSliceVar(&sw.Queued, "sweep-queued", sw.Queued, "with --sweep: queued conflicting tasks of the scheduler curve")
	fl.IntSliceVar(&sw.Tombstones, "sweep-tombstones", sw.Tombstones, "with --sweep: tombstone counts of the recovery curves")
	fl.DurationVar(&sw.Duration, "sweep-duration", sw.Duration, "with --sweep: duration of each throughput point (walcast and floor each)")
	fl.IntVar(&sw.Samples, "sweep-samples", sw.Samples, "with --sweep: broadcasts per latency point (fewer above 256 vchannels)")
	fl.StringSliceVar(&sw.Only, "sweep-only", nil, "with --sweep: only these curves (vchannels, clients, scheduler, tombstones)")
	_ = cmd.RegisterFlagCompletionFunc("only", cobra.FixedCompletions(bench.IDs, cobra.ShellCompDirectiveNoFileComp))
	addOutputFlags(cmd, g)
	return cmd
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// runSweep measures the growth curves, prints them and draws them.
func runSweep(cmd *cobra.Command, f format, cfg bench.Config, sw bench.SweepConfig, dir string, m *bench.Machine) error {
	curves, err := bench.Sweep(cmd.Context(), cfg, sw)
	m.Finish()
	finishProgress(cmd.ErrOrStderr(), f.machine())
	if dir != "" {
		for _, c := range curves {
			if _, perr := plot.Write(dir, c); perr != nil {
				return errors.Join(err, fmt.Errorf("plot %s: %w", c.Name, perr))
			}
		}
	}
	if f.machine() {
		rows := make([]any, len(curves))
		for i, c := range curves {
			raw, jerr := json.Marshal(c)
			var o object
			if jerr == nil {
				jerr = json.Unmarshal(raw, &o)
			}
			if jerr != nil {
				return errors.Join(err, jerr)
			}
			rows[i] = o
		}
		return errors.Join(err, emit(cmd.OutOrStdout(), f, object{"curves": rows, "machine": machineObject(m)}))
	}
	w := cmd.OutOrStdout()
	for _, c := range curves {
		fmt.Fprintf(w, "\n%s (%s)\n", c.Title, c.YLabel)
		header := []string{c.XLabel}
		for _, s := range c.Series {
			header = append(header, s.Name)
		}
		tb := newTable(w, header...)
		for i, p := range c.Series[0].Points {
			row := []string{fmt.Sprintf("%g", p.X)}
			for _, s := range c.Series {
				if i < len(s.Points) {
					row = append(row, fmt.Sprintf("%.4g", s.Points[i].Y))
				} else {
					row = append(row, "-")
				}
			}
			tb.row(row...)
		}
		if ferr := tb.flush(); ferr != nil {
			return errors.Join(err, ferr)
		}
		fmt.Fprintf(w, "growth: %s\n", c.Complexity)
		if c.Note != "" {
			fmt.Fprintf(w, "setup: %s\n", c.Note)
		}
		if dir != "" {
			fmt.Fprintf(w, "plots: %s.png, %s.svg\n", filepath.Join(dir, c.Name), filepath.Join(dir, c.Name))
		}
	}
	fmt.Fprintf(w, "\nmachine: %s\n", m)
	return err
}

// runScale runs a scale run, prints its steps and results, and draws its
// curves.
func runScale(cmd *cobra.Command, f format, sc bench.ScaleConfig, dir string, m *bench.Machine) error {
	rep, err := bench.Scale(cmd.Context(), sc)
	m.Finish()
	finishProgress(cmd.ErrOrStderr(), f.machine())
	if rep == nil {
		return err
	}
	if dir != "" {
		for _, c := range rep.Curves {
			if _, perr := plot.Write(dir, c); perr != nil {
				return errors.Join(err, fmt.Errorf("plot %s: %w", c.Name, perr))
			}
		}
	}
	var missed []string
	for _, r := range rep.Results {
		if !r.Pass {
			missed = append(missed, r.ID)
		}
	}
	if f.machine() {
		raw, jerr := json.Marshal(rep)
		var o object
		if jerr == nil {
			jerr = json.Unmarshal(raw, &o)
		}
		if jerr != nil {
			return errors.Join(err, jerr)
		}
		o["missed"], o["machine"] = missed, machineObject(m)
		if perr := emit(cmd.OutOrStdout(), f, o); perr != nil {
			return errors.Join(err, perr)
		}
	} else {
		w := cmd.OutOrStdout()
		mib := func(b int64) string {
			if b == 0 {
				return "-"
			}
			return fmt.Sprintf("%.0f", float64(b)/(1<<20))
		}
		tb := newTable(w, "COLLECTIONS", "CREATE/S", "P50 MS", "P99 MS", "MAX MS", "CPU US", "GC US", "DESCRIBE P50", "LIST P50", "RSS MIB", "ETCD DB MIB",
			"CATALOG MIB", "WAL MIB", "NODES MIB")
		for _, s := range rep.Steps {
			tb.row(fmt.Sprint(s.Collections), fmt.Sprintf("%.0f", s.Rate), fmt.Sprintf("%.2f", s.P50), fmt.Sprintf("%.2f", s.P99), fmt.Sprintf("%.1f", s.Max),
				fmt.Sprintf("%.0f", s.CPU), fmt.Sprintf("%.0f", s.GC), fmt.Sprintf("%.2f", s.DescribeP50), fmt.Sprintf("%.2f", s.ListP50), mib(s.RSS), mib(s.EtcdDB), mib(s.Catalog),
				mib(s.WAL), mib(s.Nodes))
		}
		if ferr := tb.flush(); ferr != nil {
			return errors.Join(err, ferr)
		}
		fmt.Fprintln(w)
		if ferr := printResults(w, rep.Results); ferr != nil {
			return errors.Join(err, ferr)
		}
		for _, c := range rep.Curves {
			fmt.Fprintf(w, "%s: %s\n", c.Title, c.Complexity)
		}
		fmt.Fprintf(w, "machine: %s\n", m)
	}
	if err != nil {
		return err
	}
	if len(missed) > 0 {
		return kindError{"target_missed", fmt.Errorf("bench: %s missed %s target", strings.Join(missed, ", "), plural(len(missed), "its", "their"))}
	}
	return nil
}

// profileSteps wraps a progress function so that each step of the run is
// CPU-profiled into dir, one file per step ("03-b2-nats-walcast-64-clients-for-2.5s.pprof",
// numbered in the run's order): a step that begins while another is
// profiled is part of that one's profile. stop ends a profile left open
// (a run that failed mid-step).
func profileSteps(dir string, next func(bench.Event), errw io.Writer) (progress func(bench.Event), stop func()) {
	var (
		mu     sync.Mutex
		n      int
		active string
		file   *os.File
	)
	end := func() {
		pprof.StopCPUProfile()
		if err := file.Close(); err != nil {
			fmt.Fprintf(errw, "walcast: profile %s: %v\n", file.Name(), err)
		}
		active, file = "", nil
	}
	progress = func(e bench.Event) {
		mu.Lock()
		switch {
		case e.Kind == "begin" && file == nil:
			n++
			name := filepath.Join(dir, fmt.Sprintf("%02d-%s.pprof", n, slug(e.Step)))
			f, err := os.Create(name)
			if err == nil {
				if err = pprof.StartCPUProfile(f); err != nil {
					_ = f.Close()
				}
			}
			if err != nil {
				fmt.Fprintf(errw, "walcast: profile %s: %v\n", name, err)
			} else {
				active, file = e.Step, f
			}
		case e.Kind == "end" && file != nil && e.Step == active:
			end()
		}
		mu.Unlock()
		if next != nil {
			next(e)
		}
	}
	stop = func() {
		mu.Lock()
		defer mu.Unlock()
		if file != nil {
			end()
		}
	}
	return progress, stop
}

// slug is a step's name as part of a file name: lower case, runs of
// anything but letters, digits and '.' as one '-', at most 60 bytes.
func slug(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	out := strings.TrimRight(b.String(), "-")
	if len(out) > 60 {
		out = strings.TrimRight(out[:60], "-")
	}
	return out
}

// machineObject is where and when a run measured, for machine output; the
// load averages (1, 5, 15 minutes) are null where they cannot be read.
func machineObject(m *bench.Machine) object {
	o := object{"start": goTime(m.Start), "end": goTime(m.End), "cpus": m.CPUs, "go": m.GoVersion, "commit": m.Commit,
		"load_average_start": nil, "load_average_end": nil}
	if m.HasLoad {
		o["load_average_start"], o["load_average_end"] = m.LoadStart[:], m.LoadEnd[:]
	}
	return o
}

// printResults writes results as a table.
func printResults(w io.Writer, res []bench.Result) error {
	tb := newTable(w, "ID", "WAL", "WHAT", "VALUE", "FLOOR", "RATIO", "TARGET", "OK", "NOTE")
	for _, r := range res {
		floor, ratio := "-", "-"
		if r.Floor > 0 {
			floor, ratio = fmt.Sprintf("%.3g %s", r.Floor, r.Unit), fmt.Sprintf("%.2f", r.Ratio)
		}
		ok := "yes"
		if !r.Pass {
			ok = "NO"
		}
		be := r.Backend
		if be == "" {
			be = "-"
		}
		tb.row(r.ID, be, r.What, fmt.Sprintf("%.4g %s", r.Value, r.Unit), floor, ratio, r.Target, ok, r.Note)
	}
	return tb.flush()
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressState is what the terminal's status line shows now.
var progressState struct {
	sync.Mutex
	line bool // a status line is drawn and not yet ended
}

// progressPrinter renders a run's events on w: JSON lines with asJSON (a
// machine format); on a
// terminal, one status line redrawn in place (what runs, its elapsed and
// remaining time, the run's total), each step left as a line once done;
// otherwise plain lines: one when a step begins, and one every 10 s while
// it runs.
func progressPrinter(w io.Writer, asJSON bool) func(bench.Event) {
	if asJSON {
		enc := json.NewEncoder(w)
		var mu sync.Mutex
		return func(e bench.Event) {
			mu.Lock()
			defer mu.Unlock()
			_ = enc.Encode(e) // durations as Go duration strings (bench.Event.MarshalJSON)
		}
	}
	if !isTerminal(w) {
		var mu sync.Mutex
		last := map[string]time.Duration{}
		return func(e bench.Event) {
			mu.Lock()
			defer mu.Unlock()
			switch e.Kind {
			case "note", "begin":
				fmt.Fprintf(w, "==> %s%s\n", e.Step, left(e.Remaining))
			case "progress":
				if e.Elapsed-last[e.Step] >= 10*time.Second {
					last[e.Step] = e.Elapsed
					fmt.Fprintf(w, "    %s elapsed%s\n", round(e.Elapsed), left(e.Remaining))
				}
			case "end":
				delete(last, e.Step)
			}
		}
	}
	return func(e bench.Event) {
		progressState.Lock()
		defer progressState.Unlock()
		switch e.Kind {
		case "note":
			fmt.Fprintf(w, "\r\033[K==> %s\n", e.Step)
			progressState.line = false
		case "begin", "progress":
			fmt.Fprintf(w, "\r\033[K==> %s  [%s%s; run %s]", e.Step, round(e.Elapsed), left(e.Remaining), round(e.Total))
			progressState.line = true
		case "end":
			fmt.Fprintf(w, "\r\033[K==> %s  [%s]\n", e.Step, round(e.Elapsed))
			progressState.line = false
		}
	}
}

// finishProgress ends a status line left open (a run that failed mid-step).
func finishProgress(w io.Writer, asJSON bool) {
	progressState.Lock()
	defer progressState.Unlock()
	if !asJSON && progressState.line {
		fmt.Fprintln(w)
		progressState.line = false
	}
}

func left(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return ", ~" + round(d) + " left"
}

func round(d time.Duration) string {
	if d >= time.Minute {
		return d.Round(time.Second).String()
	}
	return d.Round(100 * time.Millisecond).String()
}
