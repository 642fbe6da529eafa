package main

import (
	"fmt"

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
--secure); their floor is the plain one.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !g.json {
				cfg.Progress = func(s string) { fmt.Fprintln(cmd.ErrOrStderr(), "==>", s) }
			}
			res, err := bench.Run(cmd.Context(), cfg)
			if g.json {
				if perr := printJSON(cmd.OutOrStdout(), res); perr != nil {
					return perr
				}
				return err
			}
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
			return err
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Etcd, "etcd", nil, "external etcd endpoints (default: an embedded etcd in a temp dir)")
	f.StringVar(&cfg.NATS, "nats", "", "external NATS URL (default: an embedded server syncing every write)")
	f.IntVar(&cfg.Samples, "samples", cfg.Samples, "sequential operations per latency benchmark")
	f.IntVar(&cfg.Clients, "clients", cfg.Clients, "concurrent clients of B2")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "duration of B2 (each of the raw and the walcast phase)")
	f.IntVar(&cfg.Tombstones, "tombstones", cfg.Tombstones, "tombstones B6 recovers")
	f.IntVar(&cfg.Pending, "pending", cfg.Pending, "pending tasks B6 recovers")
	f.StringSliceVar(&cfg.Only, "only", nil, "run only these (B1,B2,...,S1,S2)")
	f.IntVar(&cfg.Lanes, "lanes", cfg.Lanes, "WAL lanes the pchannels are folded into (0: one per pchannel)")
	return cmd
}
