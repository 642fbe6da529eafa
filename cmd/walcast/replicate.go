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

// parseTopology reads --primary and repeated --secondary name=source
// (follow needs every source: the secondaries read the primary's WAL
// there; configure may leave one out).
func parseTopology(primary string, secondaries []string, needSource bool) (*walcastv1.Topology, error) {
	if primary == "" {
		return nil, usageError{errors.New("--primary is required")}
	}
	t := &walcastv1.Topology{Primary: primary}
	for _, s := range secondaries {
		name, source, _ := strings.Cut(s, "=")
		switch {
		case name == "":
			return nil, usageError{fmt.Errorf("--secondary %q is not <name>=<source url>", s)}
		case needSource && strings.TrimSpace(source) == "":
			return nil, usageError{fmt.Errorf("--secondary %q: the source URL (the primary's WAL, e.g. nats://10.0.0.5:4222 or kafka://10.0.0.7:9092) is empty", s)}
		}
		t.Secondaries = append(t.Secondaries, &walcastv1.SecondaryCluster{Name: name, Source: source})
	}
	return t, nil
}

// reasonNotSecondary is the server's reason for a promote of a cluster that
// is not a secondary (server.ReasonNotSecondary).
const reasonNotSecondary = "NOT_SECONDARY"

func replicateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "replicate", Short: "Primary/secondary replication: follow, configure, status, promote, salvage"}
	var primary, primaryAddr string
	var secondaries []string
	var allowUnreachable bool
	topo := func(c *cobra.Command) {
		c.Flags().StringVar(&primary, "primary", "", "name of the primary cluster")
		c.Flags().StringArrayVar(&secondaries, "secondary", nil, "a secondary: <name>=<primary WAL URL it reads: nats://... or kafka://...> (repeat)")
	}
	follow := &cobra.Command{
		Use:   "follow",
		Short: "Make this (empty) cluster a secondary: it refuses DDL and replicates the primary's WAL",
		Long: `Make the (empty) cluster at --addr a secondary of --primary: it refuses DDL from then on
and its replicator copies the primary's WAL. Nothing changes unless every check passes:
the topology lists this cluster (its cluster.name) as a secondary, every secondary has a
source URL, and this cluster's source (the primary's WAL) is reachable and holds the WAL
streams or topics of this cluster's layout (--allow-unreachable skips that check). A source
names the primary WAL's kind and addresses: nats://host:4222[,host:4222...] or
kafka://host:9092[,host:9092...], with ?stream_prefix=P or ?topic_prefix=P when the
primary does not use the default prefix; it is read with this cluster's wal.nats or
wal.kafka TLS and credentials. With
--primary-addr (the primary's API) the command also checks there that the primary has
that name, is primary, and has the same pchannels and lanes.`,
		Example: `  walcast replicate follow --addr 127.0.0.1:7080 --primary east --secondary west=nats://127.0.0.1:7072 \
      --primary-addr 127.0.0.1:7070
  (run against the secondary "west"; the URL is the primary's NATS, printed as wal=... by its standalone)
  walcast replicate follow --addr 10.0.1.11:7070 --primary east --secondary west=kafka://10.0.0.7:9092,10.0.0.8:9092?topic_prefix=east-`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := parseTopology(primary, secondaries, true)
			if err != nil {
				return err
			}
			return runOK(g, cmd, func(ctx context.Context, c *client.Client) (string, error) {
				if primaryAddr != "" {
					if err := checkPrimary(ctx, cmd, g, c, primaryAddr, primary); err != nil {
						return "", err
					}
				}
				if err := c.FollowWith(ctx, t, allowUnreachable); err != nil {
					return "", err
				}
				return "following " + primary, nil
			})
		},
	}
	topo(follow)
	follow.Flags().BoolVar(&allowUnreachable, "allow-unreachable", false, "follow even if the primary's WAL cannot be reached now")
	follow.Flags().StringVar(&primaryAddr, "primary-addr", "", "the primary's API address: check its name, role, pchannels and lanes there first")
	configure := &cobra.Command{
		Use:   "configure",
		Short: "Broadcast a topology change on the primary (its secondaries follow it)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := parseTopology(primary, secondaries, false)
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
		Short: "Show the role, the topology, whether the primary is reachable, lag per pchannel and incomplete tasks",
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
becomes primary. Running it again, or after a crash midway, never appends a copy twice: a
promote repeated after an unclear failure (a lost answer, a killed client or coordinator)
reports "already promoted" and succeeds.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runOK(g, cmd, func(ctx context.Context, c *client.Client) (string, error) {
				stop := g.progress(cmd, func(pctx context.Context) string {
					st, err := c.ReplicationStatus(pctx)
					switch {
					case err != nil:
						return ""
					case st.GetPromoting():
						return fmt.Sprintf("still waiting for the force promote: %d incomplete tasks", len(st.GetIncomplete()))
					}
					return ""
				})
				id, err := c.ForcePromote(ctx)
				stop()
				var ce *client.Error
				if errors.As(err, &ce) && ce.Reason == reasonNotSecondary {
					// A promote that already made this cluster primary
					// (the answer of an earlier attempt was lost) is done.
					if st, serr := c.ReplicationStatus(ctx); serr == nil && st.GetPromoteBroadcastId() != 0 && st.GetRole() == "primary" {
						return fmt.Sprintf("already promoted (by the promote of %s, broadcast %d): this cluster is primary",
							ts(st.GetPromotedAt()), st.GetPromoteBroadcastId()), nil
					}
				}
				return fmt.Sprintf("promoted to primary (broadcast %d)", id), err
			})
		},
	}
	cmd.AddCommand(follow, configure, status, promote, salvageCmd(g))
	return cmd
}

// checkPrimary checks, at the primary's API (addr), that it is the primary
// named name with the layout of the cluster c talks to.
func checkPrimary(ctx context.Context, cmd *cobra.Command, g *globals, c *client.Client, addr, name string) error {
	r, err := g.resolve(cmd)
	if err != nil {
		return err
	}
	opts, err := r.options()
	if err != nil {
		return err
	}
	pc, err := client.New([]string{withDefaultPort(addr)}, append(opts, client.WithUnreachable(unreachableAfter))...)
	if err != nil {
		return usageError{fmt.Errorf("--primary-addr: %w", err)}
	}
	defer pc.Close()
	ps, err := pc.ReplicationStatus(ctx)
	if err != nil {
		return fmt.Errorf("the primary at --primary-addr %s: %w", addr, err)
	}
	me, err := c.ReplicationStatus(ctx)
	if err != nil {
		return err
	}
	switch {
	case ps.GetCluster() != name:
		return usageError{fmt.Errorf("the cluster at --primary-addr %s is named %q, not %q (--primary)", addr, ps.GetCluster(), name)}
	case ps.GetRole() != "primary":
		return usageError{fmt.Errorf("the cluster %q at --primary-addr %s is %s, not primary", name, addr, ps.GetRole())}
	case ps.GetPchannelCount() != me.GetPchannelCount() || ps.GetLanes() != me.GetLanes():
		return usageError{fmt.Errorf("the primary %q has %d pchannels in %d lanes, this cluster %q %d in %d: replicated clusters need the same wal.pchannels and wal.lanes",
			name, ps.GetPchannelCount(), ps.GetLanes(), me.GetCluster(), me.GetPchannelCount(), me.GetLanes())}
	}
	return nil
}

// printReplicationStatus prints the role, the topology, whether the primary
// is reachable, the replicator's lag per pchannel and the incomplete tasks.
func printReplicationStatus(w io.Writer, s *walcastv1.ReplicationStatusResponse) error {
	fmt.Fprintf(w, "cluster     %s\nrole        %s\n", s.GetCluster(), s.GetRole())
	if p := s.GetTopology().GetPrimary(); p != "" {
		fmt.Fprintf(w, "primary     %s\n", p)
	}
	for _, sec := range s.GetTopology().GetSecondaries() {
		fmt.Fprintf(w, "secondary   %s (reads %s)\n", sec.GetName(), sec.GetSource())
	}
	fmt.Fprintf(w, "layout      %d pchannels, %d lanes\n", s.GetPchannelCount(), s.GetLanes())
	if s.GetPromoting() {
		fmt.Fprintf(w, "promoting   yes: a force promote is under way\n")
	}
	if id := s.GetPromoteBroadcastId(); id != 0 {
		fmt.Fprintf(w, "promoted    %s (broadcast %d)\n", ts(s.GetPromotedAt()), id)
	}
	gen := fmt.Sprint(s.GetGeneration())
	if r := s.GetReplaced(); r != "" {
		gen += " (its promote replaced " + r + ")"
	}
	fmt.Fprintf(w, "generation  %s\n", gen)
	if sup := s.GetSuperseded(); sup != nil {
		fmt.Fprintf(w, "SUPERSEDED  by %s's promote at %s (generation %d), learned via %s at %s: this cluster refuses DDL; follow %s or reset\n",
			sup.GetBy(), ts(sup.GetPromotedAt()), sup.GetGeneration(), sup.GetVia(), ts(sup.GetLearnedAt()), sup.GetBy())
	}
	if pc := s.GetPrimaryCheck(); pc != nil {
		state := "confirmed"
		if !pc.GetConfirmed() {
			state = "UNCONFIRMED (refuses DDL)"
		}
		fmt.Fprintf(w, "fencing     %s: %s", state, pc.GetDetail())
		if len(pc.GetSecondaries()) > 0 {
			fmt.Fprintf(w, " [secondaries %s]", strings.Join(pc.GetSecondaries(), ", "))
		}
		fmt.Fprintf(w, " (replication.unreachable_secondaries: %s)\n", pc.GetPolicy())
	}
	if pr := s.GetPromotion(); pr != nil {
		marked := "not yet (retried until its WAL answers)"
		if pr.GetMarkedAt() != nil {
			marked = ts(pr.GetMarkedAt())
		}
		fmt.Fprintf(w, "replaced    %s, whose WAL %s was replicated to the positions recorded at %s (walcast replicate salvage); marked superseded: %s\n",
			pr.GetReplaced(), pr.GetSource(), ts(pr.GetRecordedAt()), marked)
	}
	fmt.Fprintf(w, "replicating %v\n", s.GetReplicating())
	if src := s.GetSource(); src != nil {
		if src.GetReachable() {
			fmt.Fprintf(w, "source      %s reachable, last read %s\n", src.GetUrl(), ts(src.GetLastContact()))
		} else {
			fmt.Fprintf(w, "source      %s UNREACHABLE since %s (%s ago): %s\n", src.GetUrl(), ts(src.GetUnreachableSince()),
				age(src.GetUnreachableSince()), src.GetLastError())
		}
	}
	if len(s.GetPchannels()) > 0 {
		fmt.Fprintln(w)
		tb := newTable(w, "PCHANNEL", "NEXT", "SOURCE END", "LAG", "COPIED", "LAST COPY", "LAST ERROR")
		for _, p := range s.GetPchannels() {
			end, lag := "?", "unknown"
			if p.GetLagKnown() {
				end, lag = fmt.Sprint(p.GetSourceEnd()), fmt.Sprint(p.GetLag())
			}
			last := p.GetLastError()
			if last == "" {
				last = "-"
			}
			tb.row(p.GetPchannel(), fmt.Sprint(p.GetNext()), end, lag, fmt.Sprint(p.GetCopied()), ts(p.GetLastCopy()), last)
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
