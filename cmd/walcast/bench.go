package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/walcast/walcast/internal/bench"
)

func benchCmd(g *globals) *cobra.Command {
	cfg := bench.Defaults()
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure walcast against SPEC §12 (B1-B6) with the raw backend floor of the same run, and the cost of TLS + auth (S1, S2)",
		Long: `Run the performance benchmarks of SPEC §12 on a fresh embedded etcd and NATS JetStream
(syncing every write), or on external ones (--etcd, --nats), and print each result with
the raw backend's figure measured in the same run and the ratio. Machines are noisy:
compare ratios, not absolute numbers, across runs. S1 and S2 measure the API itself:
B1's latency and B2's throughput through the Go client against two standalone
processes on embedded backends, one plain and one with TLS and a bearer token (as
--secure); their floor is the plain one.

It exits 1 when a result misses its target (the results are printed first), and 2
when --only names no benchmark.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := g.format()
			if err != nil {
				return err
			}
			for i, id := range cfg.Only {
				up := strings.ToUpper(strings.TrimSpace(id))
				if !slices.Contains(bench.IDs, up) {
					return usageError{fmt.Errorf("--only %q is no benchmark: they are %s", id, strings.Join(bench.IDs, ", "))}
				}
				cfg.Only[i] = up
			}
			if !f.machine() {
				cfg.Progress = func(s string) { fmt.Fprintln(cmd.ErrOrStderr(), "==>", s) }
			}
			res, err := bench.Run(cmd.Context(), cfg)
			var missed []string
			for _, r := range res {
				if !r.Pass {
					missed = append(missed, r.ID)
				}
			}
			if f.machine() {
				rows := make([]any, len(res))
				for i, r := range res {
					rows[i] = object{"id": r.ID, "what": r.What, "value": r.Value, "unit": r.Unit, "floor": r.Floor, "ratio": r.Ratio,
						"target": r.Target, "pass": r.Pass, "note": r.Note}
				}
				if perr := emit(cmd.OutOrStdout(), f, object{"results": rows, "missed": missed}); perr != nil {
					return perr
				}
			} else {
				tb := newTable(cmd.OutOrStdout(), "ID", "WHAT", "VALUE", "FLOOR", "RATIO", "TARGET", "OK", "NOTE")
				for _, r := range res {
					floor, ratio := "-", "-"
					if r.Floor > 0 {
						floor, ratio = fmt.Sprintf("%.3g %s", r.Floor, r.Unit), fmt.Sprintf("%.2f", r.Ratio)
					}
					ok := "yes"
					if !r.Pass {
						ok = "NO"
					}
					tb.row(r.ID, r.What, fmt.Sprintf("%.4g %s", r.Value, r.Unit), floor, ratio, r.Target, ok, r.Note)
				}
				if ferr := tb.flush(); ferr != nil {
					return ferr
				}
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
	fl.IntVar(&cfg.Samples, "samples", cfg.Samples, "sequential operations per latency benchmark")
	fl.IntVar(&cfg.Clients, "clients", cfg.Clients, "concurrent clients of B2")
	fl.DurationVar(&cfg.Duration, "duration", cfg.Duration, "duration of B2 (each of the raw and the walcast phase)")
	fl.IntVar(&cfg.Tombstones, "tombstones", cfg.Tombstones, "tombstones B6 recovers")
	fl.IntVar(&cfg.Pending, "pending", cfg.Pending, "pending tasks B6 recovers")
	fl.StringSliceVar(&cfg.Only, "only", nil, "run only these ("+strings.Join(bench.IDs, ",")+")")
	fl.IntVar(&cfg.Lanes, "lanes", cfg.Lanes, "WAL lanes the pchannels are folded into (0: one per pchannel)")
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
