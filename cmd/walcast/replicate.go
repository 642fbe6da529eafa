package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/client"
)

// parseTopology reads --primary and repeated --secondary name=source.
func parseTopology(primary string, secondaries []string) (*walcastv1.Topology, error) {
	if primary == "" {
		return nil, usageError{errors.New("--primary is required")}
	}
	t := &walcastv1.Topology{Primary: primary}
	for _, s := range secondaries {
		name, source, _ := strings.Cut(s, "=")
		if name == "" {
			return nil, usageError{fmt.Errorf("--secondary %q is not <name>=<source url>", s)}
		}
		t.Secondaries = append(t.Secondaries, &walcastv1.SecondaryCluster{Name: name, Source: source})
	}
	return t, nil
}

func replicateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "replicate", Short: "Primary/secondary replication: follow, configure, status, promote"}
	var primary string
	var secondaries []string
	topo := func(c *cobra.Command) {
		c.Flags().StringVar(&primary, "primary", "", "name of the primary cluster")
		c.Flags().StringArrayVar(&secondaries, "secondary", nil, "a secondary: <name>=<primary WAL URL it reads> (repeat)")
	}
	follow := &cobra.Command{
		Use:   "follow",
		Short: "Make this (empty) cluster a secondary: it refuses DDL and replicates the primary's WAL",
		Example: `  walcast replicate follow --addr 127.0.0.1:7080 --primary east --secondary west=nats://127.0.0.1:4222
  (run against the secondary "west"; the URL is the primary's NATS, printed as wal=... by its standalone)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := parseTopology(primary, secondaries)
			if err != nil {
				return err
			}
			return runOK(g, cmd, func(ctx context.Context, c *client.Client) (string, error) {
				return "following " + primary, c.Follow(ctx, t)
			})
		},
	}
	topo(follow)
	configure := &cobra.Command{
		Use:   "configure",
		Short: "Broadcast a topology change on the primary (its secondaries follow it)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := parseTopology(primary, secondaries)
			if err != nil {
				return err
			}
			return runOK(g, cmd, func(ctx context.Context, c *client.Client) (string, error) {
				id, err := c.Configure(ctx, t)
				return fmt.Sprintf("topology configured by broadcast %d", id), err
			})
		},
	}
	topo(configure)
	status := &cobra.Command{
		Use:   "status",
		Short: "Show the role, the topology, replication lag per pchannel and incomplete tasks",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (*walcastv1.ReplicationStatusResponse, error) {
				return c.ReplicationStatus(ctx)
			}, printReplicationStatus)
		},
	}
	promote := &cobra.Command{
		Use:   "promote",
		Short: "Force-promote this secondary to primary after its primary was lost",
		Long: `Force-promote this secondary: replication stops, a force-promote message goes to every
pchannel and, once every streaming node has consumed it, every incomplete replicated task is
finished in broadcast-id order (missing copies appended, callbacks run) before the cluster
becomes primary. Running it again, or after a crash midway, never appends a copy twice.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runOK(g, cmd, func(ctx context.Context, c *client.Client) (string, error) {
				stop := progress(cmd, g, "the force promote")
				id, err := c.ForcePromote(ctx)
				stop()
				return fmt.Sprintf("promoted to primary (broadcast %d)", id), err
			})
		},
	}
	cmd.AddCommand(follow, configure, status, promote)
	return cmd
}

// printReplicationStatus prints the role, the topology, the replicator's lag
// per pchannel and the incomplete tasks.
func printReplicationStatus(w io.Writer, s *walcastv1.ReplicationStatusResponse) error {
	fmt.Fprintf(w, "cluster    %s\nrole       %s\nprimary    %s\npromoting  %v\nreplicating %v\n", s.GetCluster(), s.GetRole(),
		s.GetTopology().GetPrimary(), s.GetPromoting(), s.GetReplicating())
	for _, sec := range s.GetTopology().GetSecondaries() {
		fmt.Fprintf(w, "secondary  %s (reads %s)\n", sec.GetName(), sec.GetSource())
	}
	if len(s.GetPchannels()) > 0 {
		fmt.Fprintln(w)
		tb := newTable(w, "PCHANNEL", "NEXT", "SOURCE END", "LAG", "COPIED", "LAST COPY", "LAST ERROR")
		for _, p := range s.GetPchannels() {
			tb.row(p.GetPchannel(), fmt.Sprint(p.GetNext()), fmt.Sprint(p.GetSourceEnd()), fmt.Sprint(p.GetLag()),
				fmt.Sprint(p.GetCopied()), ts(p.GetLastCopy()), p.GetLastError())
		}
		if err := tb.flush(); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "\n%d incomplete tasks\n", len(s.GetIncomplete()))
	if len(s.GetIncomplete()) > 0 {
		tb := newTable(w, "ID", "TYPE", "STATE", "ACKED")
		for _, t := range s.GetIncomplete() {
			tb.row(fmt.Sprint(t.GetId()), t.GetType(), t.GetState(), fmt.Sprintf("%d/%d", t.GetAcked(), t.GetVchannels()))
		}
		return tb.flush()
	}
	return nil
}
