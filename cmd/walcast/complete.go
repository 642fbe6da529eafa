package main

import (
	"context"
	"fmt"
	"iter"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/client"
)

// Shell completion (walcast completion bash|zsh|fish|powershell) completes
// commands and flags, and asks the server for the values that live there:
// task ids, message types, databases and collections. Each question has a
// short deadline; a server that cannot be reached completes nothing.

// completeTimeout bounds one completion's question to the server.
const completeTimeout = 3 * time.Second

// ask runs call against the command's server for a completion.
func (g *globals) ask(cmd *cobra.Command, call func(context.Context, *client.Client) ([]string, error)) ([]string, cobra.ShellCompDirective) {
	r, err := g.resolve(cmd)
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	opts, err := r.options()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	c, err := client.New(r.addrs(), append(opts, client.WithUnreachable(200*time.Millisecond), client.WithMaxAttempts(3))...)
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), completeTimeout)
	defer cancel()
	out, err := call(ctx, c)
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// completeTaskIDs completes a task id argument: live tasks first (all of
// them when live is set), then the newest tombstones, each with its type and
// state as the description.
func completeTaskIDs(g *globals, live bool) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return g.ask(cmd, func(ctx context.Context, c *client.Client) ([]string, error) {
			req := &walcastv1.ListTasksRequest{States: []string{"PENDING", "REPLICATED"}, Limit: 200}
			tasks, err := c.ListTasks(ctx, req)
			if err != nil {
				return nil, err
			}
			if !live {
				old, err := c.ListTasks(ctx, &walcastv1.ListTasksRequest{States: []string{"TOMBSTONE"}, Limit: 100})
				if err != nil {
					return nil, err
				}
				tasks = append(tasks, old...)
			}
			out := make([]string, len(tasks))
			for i, t := range tasks {
				out[i] = fmt.Sprintf("%d\t%s %s", t.GetId(), t.GetType(), t.GetState())
			}
			return out, nil
		})
	}
}

// completeUnacked completes flag's value with the copies of the command's
// task (its ID argument) that tasks ack can ack: appended, not acked, and
// not named by the flag already.
func completeUnacked(cmd *cobra.Command, flag string, g *globals) {
	_ = cmd.RegisterFlagCompletionFunc(flag, func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) == 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		id, err := parseID(args[0])
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		given, _ := cmd.Flags().GetStringArray(flag)
		return g.ask(cmd, func(ctx context.Context, c *client.Client) ([]string, error) {
			t, err := c.GetTask(ctx, id)
			if err != nil {
				return nil, err
			}
			var out []string
			for _, v := range t.GetVchannels() {
				if v.GetAppended() && !v.GetAcked() && !slices.Contains(given, v.GetVchannel()) {
					out = append(out, v.GetVchannel()+"\tnot acked")
				}
			}
			return out, nil
		})
	})
}

// completeTypes completes flag's value with the server's message types.
func completeTypes(cmd *cobra.Command, flag string, g *globals) {
	_ = cmd.RegisterFlagCompletionFunc(flag, func(cmd *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
		return g.ask(cmd, func(ctx context.Context, c *client.Client) ([]string, error) {
			ts, err := c.ListTypes(ctx)
			out := make([]string, len(ts))
			for i, t := range ts {
				out[i] = t.GetType()
			}
			return out, err
		})
	})
}

// completeDatabases completes flag's value with the server's databases.
func completeDatabases(cmd *cobra.Command, flag string, g *globals) {
	_ = cmd.RegisterFlagCompletionFunc(flag, func(cmd *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
		return g.ask(cmd, databaseNames)
	})
}

// maxCompletions bounds the names a completion offers, so that completing
// in a database of a million collections reads a page or so, not all.
const maxCompletions = 1000

func databaseNames(ctx context.Context, c *client.Client) ([]string, error) {
	return firstNames(c.Databases(ctx), (*walcastv1.Database).GetName)
}

// firstNames reads the names of a list's first maxCompletions items, page
// by page, and stops there.
func firstNames[T any](seq iter.Seq2[T, error], name func(T) string) ([]string, error) {
	var out []string
	for it, err := range seq {
		if err != nil {
			return out, err
		}
		if out = append(out, name(it)); len(out) == maxCompletions {
			break
		}
	}
	return out, nil
}

// collectionNames completes the collections of the database the command's
// dbFlag names (nothing before --db is given).
func collectionNames(g *globals, dbFlag string) func(*cobra.Command) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command) ([]string, cobra.ShellCompDirective) {
		db, _ := cmd.Flags().GetString(dbFlag)
		if db == "" {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return g.ask(cmd, func(ctx context.Context, c *client.Client) ([]string, error) {
			return firstNames(c.Collections(ctx, db), (*walcastv1.Collection).GetName)
		})
	}
}

// completeCollectionArg completes a command's first argument with the
// collections of its --db.
func completeCollectionArg(g *globals) cobra.CompletionFunc {
	names := collectionNames(g, "db")
	return func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveDefault // files, for import start
		}
		return names(cmd)
	}
}

// completeCollectionFlag completes flag's value with the collections of
// the command's --db.
func completeCollectionFlag(cmd *cobra.Command, flag string, g *globals) {
	names := collectionNames(g, "db")
	_ = cmd.RegisterFlagCompletionFunc(flag, func(cmd *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
		return names(cmd)
	})
}
