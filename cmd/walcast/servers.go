package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/node"
	"github.com/walcast/walcast/server"
)

func serverCmds(g *globals) []*cobra.Command {
	return []*cobra.Command{standaloneCmd(), coordCmd(), nodeCmd(g)}
}

// Server commands take their own flags only (addServerFlags): none of the
// client commands' (--addr, --json, --timeout), and only the settings of
// their mode.

// serve runs a started process until the command's context ends (Ctrl-C) or
// a part fails, then stops it. It prints the ready line (and tells systemd
// READY=1) only once the process's /readyz passes; until then it says what
// it waits for. SIGHUP reloads the API's certificates and token file.
func serve(ctx context.Context, cmd *cobra.Command, p *server.Process, mode string) error {
	if d, ok := p.Durability(); ok {
		fmt.Fprintln(cmd.OutOrStdout(), d)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	err := waitReady(ctx, cmd.OutOrStdout(), p, mode, readyPoll)
	if err == nil {
		fmt.Fprintln(cmd.OutOrStdout(), p.ReadyLine(mode))
		sdNotify("READY=1\nSTATUS=" + firstLine(p.ReadyLine(mode)))
	wait:
		for {
			select {
			case <-ctx.Done():
				break wait
			case err = <-p.Err():
				break wait
			case <-hup:
				if rerr := p.Reload(); rerr != nil {
					fmt.Fprintln(cmd.ErrOrStderr(), "walcast: reload on SIGHUP:", rerr)
				}
			}
		}
	} else if ctx.Err() != nil {
		err = nil // stopped (Ctrl-C) before it was ready
	}
	sdNotify("STOPPING=1")
	if errors.Is(err, server.ErrStorage) {
		// A failed embedded server may never answer again: stop what
		// can be stopped within a bound, then exit with the cause.
		closed := make(chan struct{})
		go func() { defer close(closed); _ = p.Close() }()
		select {
		case <-closed:
		case <-time.After(storageCloseTimeout):
			fmt.Fprintln(cmd.ErrOrStderr(), "walcast: stopping after the storage failure took too long; exiting")
		}
		return err
	}
	if cerr := p.Close(); err == nil {
		err = cerr
	}
	return err
}

// readyPoll is how often a starting process probes its readiness.
const readyPoll = 500 * time.Millisecond

// readiness is what waitReady needs of a process.
type readiness interface {
	Ready(ctx context.Context) server.Readiness
	Err() <-chan error
	Addresses() string
}

// waitReady probes p every poll until its readiness (what /readyz answers)
// passes. Each time the reason it is not ready changes, it prints what the
// process waits for ("walcast coordinator waiting: leader: no leader is
// known; serving meanwhile at api=... metrics=...") and tells systemd the
// same as STATUS. It returns nil once ready,
// the process's fatal error, or ctx's error.
func waitReady(ctx context.Context, out io.Writer, p readiness, mode string, poll time.Duration) error {
	last := ""
	for {
		r := p.Ready(ctx)
		if r.Ready {
			return nil
		}
		if why := r.Reason(); why != last && ctx.Err() == nil {
			last = why
			line := fmt.Sprintf("walcast %s waiting: %s", mode, why)
			// Where it serves meanwhile (its /readyz, its metrics), last
			// on the line.
			fmt.Fprintf(out, "%s; serving meanwhile at %s\n", line, p.Addresses())
			sdNotify("STATUS=" + line)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-p.Err():
			return err
		case <-time.After(poll):
		}
	}
}

// firstLine is s up to its first newline.
func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// storageCloseTimeout bounds the stop of a process whose embedded server
// failed.
const storageCloseTimeout = 5 * time.Second

func standaloneCmd() *cobra.Command {
	return serverCmd("standalone", "standalone", modeStandalone,
		"Run everything on this machine: embedded etcd and NATS, coordinator, API, streaming nodes",
		`Run walcast on one machine with embedded defaults: an embedded etcd (the catalog), an
embedded NATS JetStream server (the WAL, fsync on every write), the coordinator with its
API on 127.0.0.1, and streaming nodes. All data lives under --data-dir; starting again on
the same directory recovers every task. Ctrl-C stops everything cleanly.`,
		server.StartStandalone)
}

func coordCmd() *cobra.Command {
	return serverCmd("coord", "coordinator", modeCoord,
		"Run a coordinator against an external etcd and NATS (or Kafka)",
		`Run a cluster-mode coordinator. Several coordinators against one etcd elect one leader;
the others stand by, answer API calls with the leader's address, and take over when it
dies. A deposed leader's catalog writes are fenced.`,
		server.StartCoordinator)
}

// serverCmd is a command that loads the configuration, starts a process of
// the application with start, and serves it as mode until Ctrl-C.
func serverCmd(use, mode, flags, short, long string, start func(context.Context, server.Config, app.App) (*server.Process, error)) *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long + "\n\n" + envHelp,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadServerConfig(cmd.Flags(), path)
			if err != nil {
				return err
			}
			a, err := newApp(cfg)
			if err != nil {
				return err
			}
			started := func() {}
			if mode == modeStandalone {
				// A standalone holds the catalog's and the nodes' state
				// in this one process: bound its heap (B13).
				if limit, from := cfg.Standalone.ApplyMemoryLimit(); from != "" {
					cfg.Logger().Info("soft memory limit", "bytes", limit, "from", from)
					// Starting builds the live heap from nothing (etcd's
					// key index, the nodes' views): at GOGC the collector
					// runs at every doubling, marking what was built so
					// far, a quarter of the start's CPU at 200,000
					// collections. Under a limit it can wait for the
					// limit instead, until the process started; then
					// what the start left over goes back to the system.
					gc := debug.SetGCPercent(-1)
					started = func() {
						debug.SetGCPercent(gc)
						go debug.FreeOSMemory()
					}
				}
			}
			p, err := start(cmd.Context(), cfg, a)
			started()
			if err != nil {
				return err
			}
			return serve(cmd.Context(), cmd, p, mode)
		},
	}
	addServerFlags(cmd.Flags(), &path, flags)
	return cmd
}

func nodeCmd(g *globals) *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run a streaming node: consume pchannels, apply every copy once per vchannel, ack to the coordinators",
		Long: `Run a cluster-mode streaming node. It reads the pchannels given by --consume (indexes)
from the WAL, applies each broadcast copy once per vchannel (deduplicated by broadcast id,
across re-deliveries and restarts; state under --data-dir/nodes/<name>), and acks every
copy to the coordinators given by --coordinators, following the leader. With
authentication on, it authenticates as a token or certificate of role node
(nodes.token_file, nodes.tls.*, or the --token-file/--tls-* flags).

` + envHelp,
		Example: "  walcast node --name n1 --consume 0,2 --nats nats://10.0.0.5:4222 --coordinators 10.0.0.1:7070,10.0.0.2:7070",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadServerConfig(cmd.Flags(), path)
			if err != nil {
				return err
			}
			if len(cfg.Nodes.Coordinators) == 0 {
				return usageError{errors.New("--coordinators: a node acks to the coordinators' API addresses")}
			}
			a, err := newApp(cfg)
			if err != nil {
				return err
			}
			opts, err := nodeClientOptions(cfg, &g.conn, cmd.Flags())
			if err != nil {
				return err
			}
			c, err := client.New(cfg.Nodes.Coordinators, opts...)
			if err != nil {
				return err
			}
			defer c.Close()
			p, err := server.StartNode(cmd.Context(), cfg, a, clientAcker{c: c, node: cfg.Nodes.Name})
			if err != nil {
				return err
			}
			return serve(cmd.Context(), cmd, p, "node "+cfg.Nodes.Name)
		},
	}
	addServerFlags(cmd.Flags(), &path, modeNode)
	addCredentialFlags(cmd.Flags(), &g.conn)
	cmd.AddCommand(nodeResyncCmd())
	return cmd
}

// nodeResyncCmd re-syncs a stopped node's pchannels with a log that was
// recreated or lost entries (a halted pchannel).
func nodeResyncCmd() *cobra.Command {
	var path string
	var pchans []string
	cmd := &cobra.Command{
		Use:   "resync",
		Short: "Make a stopped node read its pchannels' logs again from the start (after a recreated stream or topic)",
		Long: `Make a stopped streaming node read its pchannels' logs again from their start. A node whose
log is not the one its saved position belongs to (the stream or topic was recreated, or the
broker lost entries: the log's identity changed, or it ends before the position) halts that
pchannel instead of skipping what the log holds now (walcast_node_halted, /readyz, its log).
Stop the node, run this with its --name and --data-dir (and --pchannel for
some pchannels only; default: every pchannel with a saved state), and start it again: it keeps
what it applied (its state and the broadcast ids applied per vchannel), applies the copies of
broadcasts it has not applied, and acks every copy again (acks of finished broadcasts change
nothing). The node must not be running.`,
		Example: "  walcast node resync --name n1 --data-dir /var/lib/walcast --pchannel wal-0",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd.Flags(), path)
			if err != nil {
				return err
			}
			if cfg.Nodes.Name == "" {
				return usageError{errors.New("--name: the node whose state to re-sync")}
			}
			dir := filepath.Join(cfg.DataDir, "nodes", cfg.Nodes.Name)
			targets := make([]message.PChannel, 0, len(pchans))
			for _, p := range pchans {
				targets = append(targets, message.PChannel(p))
			}
			if len(targets) == 0 {
				targets = cfg.PChannelNames()
			}
			done := 0
			for _, p := range targets {
				had, err := node.Resync(dir, cfg.Nodes.Name, p)
				if err != nil {
					return err
				}
				if had {
					done++
					fmt.Fprintf(cmd.OutOrStdout(), "%s: will read its log again from the start\n", p)
				} else if len(pchans) > 0 {
					fmt.Fprintf(cmd.OutOrStdout(), "%s: no saved state (it starts from the beginning of the log anyway)\n", p)
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "node %s: %d pchannel(s) re-synced in %s\n", cfg.Nodes.Name, done, dir)
			return nil
		},
	}
	addServerFlags(cmd.Flags(), &path, modeNode)
	cmd.Flags().StringArrayVar(&pchans, "pchannel", nil, "a pchannel to re-sync, by name (repeat; default: every pchannel with a saved state)")
	return cmd
}

// clientAcker acks through the API. Rejections the coordinator will repeat
// (the vchannel is not in the task, a malformed ack, an id no leader issued) are reported as the
// broadcast errors the node treats as permanent; everything else is retried
// by the node. Each ack names the node, for the leader's table of its
// nodes (the console's streaming-nodes panel).
type clientAcker struct {
	c    *client.Client
	node string
}

func (a clientAcker) Ack(ctx context.Context, ack broadcast.Ack) error {
	req := &walcastv1.AckRequest{BroadcastId: ack.BroadcastID, Vchannel: string(ack.VChannel), Node: a.node,
		Checkpoint: &walcastv1.Checkpoint{MessageId: ack.Checkpoint.MessageID, TimeTick: ack.Checkpoint.TimeTick, LastConfirmed: ack.Checkpoint.LastConfirmed}}
	// The coordinator uses the message only to create a replicated copy's
	// task on a secondary (broadcast.Ack): an ordinary ack, the hot path,
	// sends the id, vchannel and checkpoint alone.
	if ack.Message != nil && ack.Message.Replicate != nil {
		b, err := message.Marshal(ack.Message)
		if err != nil {
			return fmt.Errorf("%w: %w", broadcast.ErrInvalidArgument, err)
		}
		req.Message = b
	}
	err := a.c.Ack(ctx, req)
	// Not found: no leader issued the id (a newer leader's id is refused
	// as "not leader", and retried).
	if errors.Is(err, client.ErrInvalidArgument) || errors.Is(err, client.ErrNotFound) {
		return fmt.Errorf("%w: %w", broadcast.ErrInvalidArgument, err)
	}
	return err
}

// nodeClientOptions are the options of a node's client of the coordinators:
// nodes.token_file and nodes.tls, each overridden by the connection flags
// when given.
func nodeClientOptions(cfg server.Config, f *connFlags, fs *pflag.FlagSet) ([]client.Option, error) {
	set := func(name string, v string, into *string) {
		if fs.Changed(name) {
			*into = v
		}
	}
	tf, t := cfg.Nodes.TokenFile, cfg.Nodes.TLS
	set("token-file", f.tokenFile, &tf)
	set("tls-ca", f.tlsCA, &t.CAFile)
	set("tls-cert", f.tlsCert, &t.CertFile)
	set("tls-key", f.tlsKey, &t.KeyFile)
	set("tls-server-name", f.tlsServerName, &t.ServerName)
	var opts []client.Option
	switch {
	case f.token != "":
		opts = append(opts, client.WithToken(f.token))
	case tf != "":
		opts = append(opts, client.WithTokenFile(tf))
	}
	if t.On() {
		tc, err := client.TLSConfig(t.CAFile, t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("nodes.tls: %w", err)
		}
		tc.ServerName = t.ServerName
		opts = append(opts, client.WithTLS(tc))
	}
	return opts, nil
}
