package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/client"
)

// Two-phase imports (walcast import commit|rollback) and shard splits
// (walcast collection split-shard), added to the meta commands by
// metaCmds.

// noWaitFlag declares --no-wait, which makes a collection's DDL fail at
// once, naming the holder, instead of waiting for a running import or
// another DDL.
func noWaitFlag(cmd *cobra.Command, noWait *bool) {
	cmd.Flags().BoolVar(noWait, "no-wait", false,
		"fail at once (naming the holder: a running import, another DDL) instead of waiting for the collection")
}

// importPhaseCmds are `walcast import commit` and `walcast import rollback`.
func importPhaseCmds(g *globals) []*cobra.Command {
	commit := &cobra.Command{
		Use: "commit ID", Short: "Commit a two-phase import job that is ready: its rows become visible", Args: cobra.ExactArgs(1),
		Long: `Commit a two-phase import job (started with --auto-commit=false) once it is ready: it read
every file and holds its collection, its rows staged. The commit completes the job; its rows
become visible (streaming nodes count them, walcast view shows imported rows) and the
collection is released (a drop, rename, index or split waiting for it runs). Repeating the
command is safe: it is answered by the first commit. A job that was rolled back cannot be
committed; one still reading its files is refused (follow it with walcast import wait ID).`,
		Example: "  walcast import start orders a.jsonl --db shop --auto-commit=false --wait\n  walcast import commit 42",
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseJobID(args[0])
			if err != nil {
				return err
			}
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (proto.Message, error) {
				return c.CommitImport(ctx, id)
			}, func(w io.Writer, m proto.Message) error {
				r := m.(*walcastv1.CommitImportResponse)
				j := r.GetJob()
				return ddlLine(w, r.GetResult(), "import job %d committed into %s.%s: %s, %d rows visible", j.GetId(), j.GetDatabase(),
					j.GetCollection(), jobState(j.GetState()), j.GetRows())
			})
		},
	}
	var reason string
	rollback := &cobra.Command{
		Use: "rollback ID", Short: "Roll back an unfinished import job: what it staged is discarded", Args: cobra.ExactArgs(1),
		Long: `Roll back an import job that has not ended — a two-phase job that is ready, or any job still
reading its files: it ends rolled back, its staged rows discarded, and its collection is
released. Repeating the command is safe: it is answered by the first rollback. A job that
completed or failed cannot be rolled back.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseJobID(args[0])
			if err != nil {
				return err
			}
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (proto.Message, error) {
				return c.RollbackImport(ctx, id, reason)
			}, func(w io.Writer, m proto.Message) error {
				r := m.(*walcastv1.RollbackImportResponse)
				j := r.GetJob()
				return ddlLine(w, r.GetResult(), "import job %d rolled back: %s", j.GetId(), j.GetReason())
			})
		},
	}
	rollback.Flags().StringVar(&reason, "reason", "", `why, kept as the job's reason (default "rolled back")`)
	return []*cobra.Command{commit, rollback}
}

// splitShardCmd is `walcast collection split-shard`.
func splitShardCmd(g *globals) *cobra.Command {
	var (
		db, key, vchannel string
		into              int32
		noWait            bool
	)
	cmd := &cobra.Command{
		Use: "split-shard NAME", Short: "Split one shard (vchannel) of a collection into new shards", Args: cobra.ExactArgs(1),
		Long: `Split one shard of a collection into --into new shards, with one broadcast whose copies differ
by vchannel: the source vchannel gets a fence, appended first and acked by its streaming node
before the new shards get their genesis (so no new shard starts before its source stopped).
The collection's shard list then names the new shards in the source's place; later DDL and
imports go to them. walcast view shows the fence on the source (fenced, split into, fenced
at) and the split on each new shard (split from). It waits for a running import of the
collection unless --no-wait.`,
		Example:           "  walcast collection split-shard orders --db shop --vchannel wal-1/c12v0 --into 2",
		ValidArgsFunction: completeCollectionArg(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDDL(g, cmd, &key, func(ctx context.Context, c *client.Client) (proto.Message, error) {
				return c.SplitShard(ctx, &walcastv1.SplitShardRequest{Database: db, Collection: args[0], Vchannel: vchannel, Into: into,
					IdempotencyKey: key, NoWait: noWait})
			}, func(w io.Writer, m proto.Message) error {
				r := m.(*walcastv1.SplitShardResponse)
				s := r.GetSplit()
				return ddlLine(w, r.GetResult(), "shard %s of %s.%s fenced at %d and split into %s; vchannels now %s", s.GetVchannel(), db,
					args[0], s.GetFencePosition(), strings.Join(s.GetSplitInto(), " "), strings.Join(r.GetCollection().GetVchannels(), " "))
			})
		},
	}
	dbFlag(cmd, &db)
	keyFlag(cmd, &key)
	noWaitFlag(cmd, &noWait)
	cmd.Flags().StringVar(&vchannel, "vchannel", "", "the shard to split, one of the collection's vchannels (required)")
	_ = cmd.MarkFlagRequired("vchannel")
	cmd.Flags().Int32Var(&into, "into", 2, "how many shards replace it, 2 to 16")
	return cmd
}

// splitRows are a view's rows about shard splits and committed rows.
func splitRows(tb *table, v *walcastv1.VChannelView) {
	if v.GetFenced() {
		tb.row("fenced", fmt.Sprintf("true, at %d, split into %s", v.GetFencedAt(), strings.Join(v.GetSplitInto(), " ")))
	}
	if v.GetSplitFrom() != "" {
		tb.row("split from", v.GetSplitFrom())
	}
	if v.GetCollectionId() != 0 {
		rolled := make([]string, len(v.GetRolledBackImportJobs()))
		for i, j := range v.GetRolledBackImportJobs() {
			rolled[i] = fmt.Sprint(j)
		}
		if len(rolled) > 0 {
			tb.row("rolled back jobs", strings.Join(rolled, " "))
		}
		tb.row("imported rows", fmt.Sprint(v.GetImportedRows()))
	}
}
