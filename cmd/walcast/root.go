package main

import (
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/walcast/walcast/internal/editdist"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// globals are the flags client commands share: every client command
// declares them itself (addClientFlags), bound to the same variables; the
// server commands have none of them.
type globals struct {
	conn    connFlags
	json    bool
	output  string
	timeout string
}

// format is the output format the flags ask for.
func (g *globals) format() (format, error) {
	switch f := format(g.output); {
	case g.json && f != "" && f != formatJSON:
		return "", usageError{fmt.Errorf("--json and -o %s: give one", f)}
	case g.json:
		return formatJSON, nil
	case f == "":
		return formatTable, nil
	case f == formatTable || f == formatWide || f == formatJSON || f == formatYAML:
		return f, nil
	}
	return "", usageError{fmt.Errorf("-o %q is not table, wide, json or yaml", g.output)}
}

// machine reports whether the output is JSON or YAML (a malformed -o is
// reported by format).
func (g *globals) machine() bool {
	f, err := g.format()
	return err == nil && f.machine()
}

// addTemplateFuncs registers the help templates' functions in cobra's
// global table once (newRoot runs concurrently in tests).
var addTemplateFuncs sync.Once

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "walcast",
		Short: "Atomic broadcast of control messages across WAL channels",
		Long: `walcast broadcasts DDL/DCL control messages atomically across many write-ahead-log
channels, runs their callbacks in log order, serialises conflicting operations with
resource-key locks and deduplicates client retries with scoped idempotency keys.

Start everything on one machine with "walcast standalone"; talk to it with the
client commands below. They find the server at --addr, WALCAST_ADDR, or the
current context of ~/.config/walcast/config.yaml ("walcast context"), else
127.0.0.1:7070.

Exit codes: 0 success, 1 the command failed (the server refused or failed, it could
not be reached, a job it waited for failed, a benchmark missed its target), 2 usage
error (unknown command or flag, bad value). See docs/cli.md.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.CompletionOptions.HiddenDefaultCmd = false
	root.AddCommand(versionCmd(g), configCmd(g), benchCmd(g), authCmd(g), contextCmd(g), probeCmd())
	root.AddCommand(serverCmds(g)...)
	root.AddCommand(devClusterCmd())
	clients := append(clientCmds(g), metaCmds(g)...)
	root.AddCommand(clients...)
	for _, c := range clients {
		walk(c, func(c *cobra.Command) {
			if c.Runnable() {
				addClientFlags(c, g)
			}
		})
	}
	root.InitDefaultHelpCmd()
	for _, c := range root.Commands() {
		if c.Name() == "help" {
			c.Run, c.RunE = nil, helpRun
		}
	}
	finish(root)
	// pflag shows a bool flag as --json[=true|false]; say --json, keeping
	// the help's columns.
	addTemplateFuncs.Do(func() {
		cobra.AddTemplateFunc("plainBools", func(s string) string { return strings.ReplaceAll(s, "[=true|false]", "             ") })
	})
	root.SetUsageTemplate(strings.ReplaceAll(root.UsageTemplate(), ".FlagUsages | trimTrailingWhitespaces", ".FlagUsages | plainBools | trimTrailingWhitespaces"))
	return root
}

// addOutputFlags declares -o and --json on c.
func addOutputFlags(c *cobra.Command, g *globals) {
	c.Flags().StringVarP(&g.output, "output", "o", "", "output format: table (default), wide, json or yaml")
	c.Flags().BoolVar(&g.json, "json", false, "print JSON (-o json)")
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "wide", "json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
}

// addClientFlags declares the flags of a command that talks to a server:
// connection (connflags.go), deadline and output.
func addClientFlags(c *cobra.Command, g *globals) {
	addConnFlags(c.Flags(), &g.conn)
	c.Flags().StringVar(&g.timeout, "timeout", "", "overall deadline of the command (default 30s, or the context's)")
	addOutputFlags(c, g)
}

// walk calls fn on c and every command below it.
func walk(c *cobra.Command, fn func(*cobra.Command)) {
	fn(c)
	for _, sub := range c.Commands() {
		walk(sub, fn)
	}
}

// finish makes every command of the tree a good citizen of scripts: flag
// and argument mistakes are usage errors (exit 2), an unknown subcommand is
// refused with suggestions instead of printing help and succeeding, and
// errors of a command's own work are told apart from usage errors.
func finish(root *cobra.Command) {
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		msg := err.Error()
		if name, ok := strings.CutPrefix(msg, "unknown flag: --"); ok {
			if s := suggestFlag(c, name); s != "" {
				msg += "\n\nDid you mean this?\n\t--" + s
			} else if c.HasSubCommands() && subcommandHasFlag(c, name) {
				msg += fmt.Sprintf("\n--%s is a flag of the commands below %q: put it after the command (walcast tasks list --%s)", name, c.CommandPath(), name)
			}
		}
		return usageError{fmt.Errorf("%s\nRun '%s --help' for usage", msg, c.CommandPath())}
	})
	walk(root, func(c *cobra.Command) {
		if c.Name() == cobra.ShellCompRequestCmd || c.Name() == cobra.ShellCompNoDescRequestCmd {
			return
		}
		if c.HasSubCommands() && c.RunE == nil && c.Run == nil {
			c.Args = cobra.ArbitraryArgs
			c.RunE = func(c *cobra.Command, args []string) error {
				if len(args) == 0 {
					return c.Help()
				}
				return unknownCommand(c, args[0])
			}
		}
		if args := c.Args; args != nil {
			c.Args = func(c *cobra.Command, a []string) error {
				if err := args(c, a); err != nil {
					if c.HasSubCommands() && len(a) > 0 {
						return unknownCommand(c, a[0])
					}
					return usageError{fmt.Errorf("%w\nRun '%s --help' for usage", err, c.CommandPath())}
				}
				return nil
			}
		}
		if run := c.RunE; run != nil {
			c.RunE = func(c *cobra.Command, args []string) error {
				err := run(c, args)
				var ue usageError
				if err == nil || errors.As(err, &ue) {
					return err
				}
				return runError{err}
			}
		}
	})
}

// helpRun is the help command's: the help of the command its arguments
// name, or a usage error with suggestions for a command that does not
// exist (cobra's prints the root's help and succeeds).
func helpRun(c *cobra.Command, args []string) error {
	cmd, rest, err := c.Root().Find(args)
	switch {
	case err != nil || cmd == nil:
		return unknownCommand(c.Root(), args[0])
	case len(rest) > 0:
		return unknownCommand(cmd, rest[0])
	}
	cmd.InitDefaultHelpFlag()
	return cmd.Help()
}

// unknownCommand is the usage error of an unknown subcommand of c, with
// suggestions.
func unknownCommand(c *cobra.Command, name string) error {
	msg := fmt.Sprintf("unknown command %q for %q", name, c.CommandPath())
	if c.SuggestionsMinimumDistance <= 0 {
		c.SuggestionsMinimumDistance = 2
	}
	if s := c.SuggestionsFor(name); len(s) > 0 {
		msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
	}
	return usageError{fmt.Errorf("%s\nRun '%s --help' for usage", msg, c.CommandPath())}
}

// subcommandHasFlag reports whether a command below c has the flag name.
func subcommandHasFlag(c *cobra.Command, name string) bool {
	found := false
	walk(c, func(sub *cobra.Command) { found = found || sub != c && sub.Flags().Lookup(name) != nil })
	return found
}

// suggestFlag returns the flag of c closest to name, "" if none is close.
func suggestFlag(c *cobra.Command, name string) string {
	best, dist := "", 3
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		if d := editdist.Levenshtein(name, f.Name); d < dist || strings.HasPrefix(f.Name, name) && d <= len(f.Name)/2 && best == "" {
			best, dist = f.Name, d
		}
	})
	return best
}

func versionCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the walcast version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			goVersion := "unknown"
			if bi, ok := debug.ReadBuildInfo(); ok {
				goVersion = bi.GoVersion
			}
			f, err := g.format()
			if err != nil {
				return err
			}
			if f.machine() {
				return emit(cmd.OutOrStdout(), f, object{"version": version, "go": goVersion})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "walcast %s (%s)\n", version, goVersion)
			return nil
		},
	}
	addOutputFlags(cmd, g)
	return cmd
}
