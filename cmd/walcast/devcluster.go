package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/walcast/walcast/internal/devcluster"
	"github.com/walcast/walcast/internal/embedetcd"
	"github.com/walcast/walcast/internal/embednats"
)

func devClusterCmd() *cobra.Command {
	var cfg devcluster.Config
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "dev-cluster",
		Short: "Run a whole cluster on this machine: 3 etcd, 3 NATS (or Kafka), 2 coordinators, 2 nodes",
		Long: `Run a walcast cluster on this machine, each part its own process: three etcd members,
three NATS servers clustered over routes with JetStream (streams at three replicas, every
write synced), or with --wal kafka one process of three kfake brokers (replication
factor 3, min.insync.replicas 2), two coordinators and two streaming nodes. Everything
listens on 127.0.0.1 on 100 fixed ports from --base-port; data, configuration files and
logs live under --dir. Starting again on the same --dir resumes the cluster.

While it runs, commands on standard input act on the members (by name, as "status"
lists them): kill NAME (SIGKILL), start NAME, stop NAME (SIGTERM), pause NAME (SIGSTOP:
a zombie), resume NAME (SIGCONT), leaders, status, quit. Ctrl-C (or quit) stops
everything; so does the end of this process, however it ends.`,
		Example: `  walcast dev-cluster --dir ./walcast-dev
  walcast tasks list --addr 127.0.0.1:27060     # the API of coord-0 (standbys name the leader)
  walcast dev-cluster --dir ./dev-kafka --wal kafka --base-port 27100`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bin, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.Binary, cfg.ElectionTTL = bin, ttl
			ctx := cmd.Context()
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "starting a %s cluster in %s (ports %d-%d) ...\n", cfg.WAL, cfg.Dir, cfg.BasePort, cfg.BasePort+99)
			c, err := devcluster.Start(ctx, cfg)
			if err != nil {
				return err
			}
			defer func() {
				fmt.Fprintln(out, "stopping the cluster ...")
				if err := c.Close(); err != nil {
					fmt.Fprintln(cmd.ErrOrStderr(), "walcast:", err)
				}
			}()
			printCluster(ctx, out, c)
			fmt.Fprintf(out, "walcast dev-cluster ready: api=%s (Ctrl-C stops it; type \"help\" for commands)\n", strings.Join(c.APIAddrs(), ","))
			lines := make(chan string)
			go func() {
				sc := bufio.NewScanner(cmd.InOrStdin())
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
			}()
			for {
				select {
				case <-ctx.Done():
					return nil
				case line, ok := <-lines:
					if !ok {
						lines = nil // no more input: run until Ctrl-C
						continue
					}
					if devClusterCommand(ctx, out, c, line) {
						return nil
					}
				}
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Dir, "dir", "./walcast-dev", "directory for every member's data, configuration and log")
	f.IntVar(&cfg.BasePort, "base-port", devcluster.DefaultBasePort, "first of the 100 ports the cluster uses on 127.0.0.1")
	f.StringVar(&cfg.WAL, "wal", devcluster.NATS, "WAL backend: nats or kafka")
	f.IntVar(&cfg.PChannels, "pchannels", devcluster.DefaultPChannels, "number of pchannels")
	f.DurationVar(&ttl, "election-ttl", devcluster.DefaultElectionTTL, "the coordinators' lease: a dead leader is replaced after it")
	cmd.AddCommand(devMemberCmd())
	return cmd
}

func printCluster(ctx context.Context, out io.Writer, c *devcluster.Cluster) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tPID\tSTATE\tADDRESS\tMETRICS\tLOG")
	for _, m := range c.Members() {
		state := "running"
		switch {
		case !m.Running():
			state = "stopped"
		case m.Paused():
			state = "paused"
		}
		metrics := m.Metrics
		if metrics == "" {
			metrics = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", m.Name, m.PID(), state, m.Addr, metrics, m.Log())
	}
	_ = tw.Flush()
	printLeaders(ctx, out, c)
}

func printLeaders(ctx context.Context, out io.Writer, c *devcluster.Cluster) {
	name := func(m *devcluster.Member, err error) string {
		if err != nil {
			return "none (" + err.Error() + ")"
		}
		return m.Name
	}
	fmt.Fprintf(out, "leaders: coordinator %s, etcd %s", name(c.CoordLeader(ctx)), name(c.EtcdLeader(ctx)))
	if c.WAL() == devcluster.NATS {
		fmt.Fprintf(out, ", stream WALCAST_lane-0 %s", name(c.StreamLeader(ctx, "WALCAST_lane-0")))
	}
	fmt.Fprintln(out)
}

// devClusterCommand runs one line of input; it reports whether to quit.
func devClusterCommand(ctx context.Context, out io.Writer, c *devcluster.Cluster, line string) bool {
	f := strings.Fields(line)
	if len(f) == 0 {
		return false
	}
	if f[0] == "quit" || f[0] == "exit" {
		return true
	}
	switch f[0] {
	case "status":
		printCluster(ctx, out, c)
		return false
	case "leaders":
		printLeaders(ctx, out, c)
		return false
	case "kill", "start", "stop", "pause", "resume":
	default:
		fmt.Fprintln(out, "commands: status, leaders, kill NAME, start NAME, stop NAME, pause NAME, resume NAME, quit")
		return false
	}
	if len(f) != 2 || c.Member(f[1]) == nil {
		fmt.Fprintf(out, "%s: name one member (see status)\n", f[0])
		return false
	}
	m := c.Member(f[1])
	var err error
	switch f[0] {
	case "kill":
		m.Kill()
	case "start":
		err = m.Start(ctx)
	case "stop":
		err = m.Stop(20 * time.Second)
	case "pause":
		err = m.Pause()
	case "resume":
		err = m.Resume()
	}
	if err != nil {
		fmt.Fprintln(out, err)
	} else {
		fmt.Fprintf(out, "%s %s: done\n", f[0], m.Name)
	}
	return false
}

// devMemberCmd runs one backend member of a dev cluster (hidden: the
// harness runs it).
func devMemberCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "member", Short: "Run one backend member of a dev cluster (used by dev-cluster)", Hidden: true}
	cmd.AddCommand(etcdMemberCmd(), natsMemberCmd(), kafkaMemberCmd())
	return cmd
}

func etcdMemberCmd() *cobra.Command {
	var cfg embedetcd.Config
	cmd := &cobra.Command{
		Use:  "etcd",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// etcd's own limits, as an external cluster has them.
			cfg.MaxTxnOps, cfg.MaxRequestBytes = 128, 1536<<10
			// The coordinators ping every second (the dev cluster's
			// election TTL is short).
			cfg.KeepaliveMinTime = time.Second
			s, err := embedetcd.Start(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "walcast dev-cluster member etcd %s ready: %s\n", cfg.Name, strings.Join(s.Endpoints(), ","))
			<-cmd.Context().Done()
			return s.Close()
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Name, "name", "", "member name")
	f.StringVar(&cfg.Dir, "dir", "", "data directory")
	f.IntVar(&cfg.ClientPort, "client-port", 0, "client port")
	f.IntVar(&cfg.PeerPort, "peer-port", 0, "peer port")
	f.StringVar(&cfg.Host, "host", "", "address to listen on and advertise (default 127.0.0.1)")
	f.StringVar(&cfg.InitialCluster, "initial-cluster", "", "name=peer URL of every member")
	return cmd
}

func natsMemberCmd() *cobra.Command {
	var cfg embednats.Config
	var cl embednats.Cluster
	var routes string
	cmd := &cobra.Command{
		Use:  "nats",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl.Name, cl.Routes = "walcast-dev", strings.Split(routes, ",")
			cfg.Cluster, cfg.SyncAlways, cfg.Monitor = &cl, true, true
			s, err := embednats.Start(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "walcast dev-cluster member nats %s ready: %s monitor=%s\n", cfg.Name, s.ClientURL(), s.MonitorURL())
			<-cmd.Context().Done()
			s.Close()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Name, "name", "", "server name")
	f.StringVar(&cfg.Dir, "dir", "", "JetStream store directory")
	f.IntVar(&cfg.Port, "port", 0, "client port")
	f.IntVar(&cl.Port, "cluster-port", 0, "route port")
	f.IntVar(&cfg.MonitorPort, "monitor-port", 0, "monitoring port")
	f.StringVar(&cfg.Host, "host", "", "address to listen on (default 127.0.0.1)")
	f.StringVar(&routes, "routes", "", "every member's route URL, comma separated")
	return cmd
}

func kafkaMemberCmd() *cobra.Command {
	var dir, ports string
	var control int
	cmd := &cobra.Command{
		Use:  "kafka",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var ps []int
			for _, p := range strings.Split(ports, ",") {
				n, err := strconv.Atoi(p)
				if err != nil {
					return usageError{fmt.Errorf("--ports: %q", p)}
				}
				ps = append(ps, n)
			}
			kc, err := kfake.NewCluster(kfake.NumBrokers(len(ps)), kfake.Ports(ps...), kfake.DataDir(dir), kfake.SyncWrites(),
				kfake.BrokerConfigs(map[string]string{"default.replication.factor": "3", "min.insync.replicas": "2"}))
			if err != nil {
				return err
			}
			defer kc.Close()
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", control))
			if err != nil {
				return err
			}
			srv := &http.Server{Handler: kafkaControl(kc), ReadHeaderTimeout: 5 * time.Second}
			go func() { _ = srv.Serve(ln) }()
			defer srv.Close()
			fmt.Fprintf(cmd.OutOrStdout(), "walcast dev-cluster member kafka ready: %s control=http://%s\n", strings.Join(kc.ListenAddrs(), ","), ln.Addr())
			<-cmd.Context().Done()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "data directory")
	f.StringVar(&ports, "ports", "", "broker ports, comma separated")
	f.IntVar(&control, "control-port", 0, "port of the fault control endpoint")
	return cmd
}

// kafkaControl serves the faults a kfake cluster can have: a partition
// leader election (POST /shuffle-leaders), a broker removed (POST
// /remove?node=N) or added back (POST /add?node=N&port=P), and who leads a
// topic (GET /leader?topic=T).
func kafkaControl(kc *kfake.Cluster) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /shuffle-leaders", func(w http.ResponseWriter, _ *http.Request) {
		kc.ShufflePartitionLeaders()
		fmt.Fprintln(w, "ok")
	})
	node := func(r *http.Request) (int32, error) {
		n, err := strconv.ParseInt(r.URL.Query().Get("node"), 10, 32)
		return int32(n), err
	}
	mux.HandleFunc("POST /remove", func(w http.ResponseWriter, r *http.Request) {
		n, err := node(r)
		if err == nil {
			err = kc.RemoveNode(n)
		}
		reply(w, err)
	})
	mux.HandleFunc("POST /add", func(w http.ResponseWriter, r *http.Request) {
		n, err := node(r)
		port, perr := strconv.Atoi(r.URL.Query().Get("port"))
		if err == nil {
			err = perr
		}
		if err == nil {
			_, _, err = kc.AddNode(n, port)
		}
		reply(w, err)
	})
	mux.HandleFunc("GET /leader", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, kc.LeaderFor(r.URL.Query().Get("topic"), 0))
	})
	return mux
}

func reply(w http.ResponseWriter, err error) {
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	fmt.Fprintln(w, "ok")
}
