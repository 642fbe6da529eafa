package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// globals are the flags every client command shares.
type globals struct {
	conn    connFlags
	json    bool
	timeout string
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "walcast",
		Short: "Atomic broadcast of control messages across WAL channels",
		Long: `walcast broadcasts DDL/DCL control messages atomically across many write-ahead-log
channels, runs their callbacks in log order, serialises conflicting operations with
resource-key locks and deduplicates client retries with scoped idempotency keys.

Start everything on one machine with "walcast standalone"; talk to it with the
client commands below (they use --addr, default 127.0.0.1:7070).`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	addConnFlags(root.PersistentFlags(), &g.conn)
	root.PersistentFlags().BoolVar(&g.json, "json", false, "print machine-readable JSON")
	root.PersistentFlags().StringVar(&g.timeout, "timeout", "30s", "overall deadline of a client command")
	root.AddCommand(versionCmd(g), configCmd(), benchCmd(g), authCmd(g))
	root.AddCommand(serverCmds(g)...)
	root.AddCommand(clientCmds(g)...)
	root.AddCommand(metaCmds(g)...)
	return root
}

func versionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the walcast version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			goVersion := "unknown"
			if bi, ok := debug.ReadBuildInfo(); ok {
				goVersion = bi.GoVersion
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), map[string]string{"version": version, "go": goVersion})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "walcast %s (%s)\n", version, goVersion)
			return nil
		},
	}
}
