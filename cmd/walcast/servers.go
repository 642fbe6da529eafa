package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/walcast/walcast/server"
)

func serverCmds() []*cobra.Command {
	return []*cobra.Command{standaloneCmd(), coordCmd()}
}

// serve runs a started process until the command's context ends (Ctrl-C) or
// a part fails, then stops it.
func serve(ctx context.Context, cmd *cobra.Command, p *server.Process, mode string) error {
	fmt.Fprintln(cmd.OutOrStdout(), p.ReadyLine(mode))
	var err error
	select {
	case <-ctx.Done():
	case err = <-p.Err():
	}
	if cerr := p.Close(); err == nil {
		err = cerr
	}
	return err
}

func standaloneCmd() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "standalone",
		Short: "Run everything on this machine: embedded etcd and NATS, coordinator, API, streaming nodes",
		Long: `Run walcast on one machine with embedded defaults: an embedded etcd (the catalog), an
embedded NATS JetStream server (the WAL, fsync on every write), the coordinator with its
API on 127.0.0.1, and streaming nodes. All data lives under --data-dir; starting again on
the same directory recovers every task. Ctrl-C stops everything cleanly.

` + envHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd.Flags(), path)
			if err != nil {
				return err
			}
			p, err := server.StartStandalone(cmd.Context(), cfg, app())
			if err != nil {
				return err
			}
			return serve(cmd.Context(), cmd, p, "standalone")
		},
	}
	addServerFlags(cmd.Flags(), &path)
	return cmd
}

func coordCmd() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "coord",
		Short: "Run a coordinator against an external etcd and NATS (or Kafka)",
		Long: `Run a cluster-mode coordinator. Several coordinators against one etcd elect one leader;
the others stand by, answer API calls with the leader's address, and take over when it
dies. A deposed leader's catalog writes are fenced.

` + envHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd.Flags(), path)
			if err != nil {
				return err
			}
			p, err := server.StartCoordinator(cmd.Context(), cfg, app())
			if err != nil {
				return err
			}
			return serve(cmd.Context(), cmd, p, "coordinator")
		},
	}
	addServerFlags(cmd.Flags(), &path)
	return cmd
}
