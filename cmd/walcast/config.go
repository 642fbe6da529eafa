package main

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	yaml "go.yaml.in/yaml/v3"

	"github.com/walcast/walcast/server"
)

// Server commands, by the flags they take.
const (
	modeStandalone = "standalone"
	modeCoord      = "coord"
	modeNode       = "node"
	modePrint      = "config print" // takes every server flag
)

// serverFlag is a setting a server command takes as a flag; it maps to a
// configuration key (flags beat environment beats the YAML file).
type serverFlag struct {
	name, key string
	modes     []string // the commands that take it
	define    func(fs *pflag.FlagSet, d server.Config)
}

var (
	all        = []string{modeStandalone, modeCoord, modeNode}
	apiServers = []string{modeStandalone, modeCoord}
	cluster    = []string{modeCoord, modeNode}
)

// serverFlags are every server flag: each command declares those of its
// mode, so that a flag that does not apply (--etcd for standalone, --nodes
// for coord) is refused as unknown instead of being ignored.
var serverFlags = []serverFlag{
	{"data-dir", "data_dir", all, func(fs *pflag.FlagSet, d server.Config) {
		fs.String("data-dir", d.DataDir, "directory for the process's data (standalone: everything; node: its state)")
	}},
	{"cluster", "cluster.name", all, func(fs *pflag.FlagSet, d server.Config) {
		fs.String("cluster", d.Cluster.Name, "this cluster's name in replication topologies")
	}},
	{"api-addr", "api.addr", apiServers, func(fs *pflag.FlagSet, d server.Config) {
		fs.String("api-addr", d.API.Addr, "API listen address")
	}},
	{"advertise", "api.advertise", []string{modeCoord}, func(fs *pflag.FlagSet, _ server.Config) {
		fs.String("advertise", "", "API address others reach this coordinator at (default --api-addr)")
	}},
	{"metrics-addr", "metrics.addr", all, func(fs *pflag.FlagSet, d server.Config) {
		fs.String("metrics-addr", d.Metrics.Addr, "Prometheus /metrics (and /healthz, /readyz) listen address (empty: off)")
	}},
	{"pchannels", "wal.pchannels", all, func(fs *pflag.FlagSet, d server.Config) {
		fs.Int("pchannels", d.WAL.PChannels, "number of pchannels")
	}},
	{"nodes", "nodes.count", []string{modeStandalone}, func(fs *pflag.FlagSet, d server.Config) {
		fs.Int("nodes", d.Nodes.Count, "streaming nodes standalone runs")
	}},
	{"log-level", "log.level", all, func(fs *pflag.FlagSet, d server.Config) {
		fs.String("log-level", d.Log.Level, "debug, info, warn or error")
	}},
	{"log-format", "log.format", all, func(fs *pflag.FlagSet, d server.Config) {
		fs.String("log-format", d.Log.Format, "json or text")
	}},
	{"etcd", "catalog.endpoints", []string{modeCoord}, func(fs *pflag.FlagSet, _ server.Config) {
		fs.StringSlice("etcd", nil, "the etcd cluster's endpoints")
	}},
	{"nats", "wal.nats.url", cluster, func(fs *pflag.FlagSet, _ server.Config) {
		fs.String("nats", "", "the NATS server's URL (with --wal nats)")
	}},
	{"kafka", "wal.kafka.brokers", cluster, func(fs *pflag.FlagSet, _ server.Config) {
		fs.StringSlice("kafka", nil, "Kafka brokers (with --wal kafka)")
	}},
	{"wal", "wal.kind", cluster, func(fs *pflag.FlagSet, d server.Config) {
		fs.String("wal", d.WAL.Kind, "WAL backend: nats or kafka")
	}},
	{"kafka-replication-factor", "wal.kafka.replication_factor", cluster, func(fs *pflag.FlagSet, d server.Config) {
		fs.Int("kafka-replication-factor", d.WAL.Kafka.ReplicationFactor, "replication factor of the Kafka topics walcast creates (1 on a one-broker development Kafka)")
	}},
	{"kafka-min-insync-replicas", "wal.kafka.min_insync_replicas", cluster, func(fs *pflag.FlagSet, d server.Config) {
		fs.Int("kafka-min-insync-replicas", d.WAL.Kafka.MinInsyncReplicas, "min.insync.replicas of the Kafka topics walcast creates (0: replication factor - 1, at least 1)")
	}},
	{"kafka-topic-prefix", "wal.kafka.topic_prefix", cluster, func(fs *pflag.FlagSet, d server.Config) {
		fs.String("kafka-topic-prefix", d.WAL.Kafka.TopicPrefix, "prefix of this cluster's Kafka topics (clusters sharing a Kafka need their own)")
	}},
	{"nats-stream-prefix", "wal.nats.stream_prefix", all, func(fs *pflag.FlagSet, d server.Config) {
		fs.String("nats-stream-prefix", d.WAL.NATS.StreamPrefix, "prefix of this cluster's JetStream streams (clusters sharing a NATS server need their own)")
	}},
	{"nats-monitor", "wal.nats.monitor_urls", []string{modeCoord}, func(fs *pflag.FlagSet, _ server.Config) {
		fs.StringSlice("nats-monitor", nil, "external NATS servers' monitoring URLs (http://host:8222): coord checks there that each syncs every write")
	}},
	{"allow-unsafe-durability", "durability.allow_unsafe", []string{modeCoord}, func(fs *pflag.FlagSet, _ server.Config) {
		fs.Bool("allow-unsafe-durability", false, "start even on backends that can lose a DDL reported done (see the durability report it prints)")
	}},
	{"name", "nodes.name", []string{modeNode}, func(fs *pflag.FlagSet, _ server.Config) {
		fs.String("name", "", "the node's name (its state lives in --data-dir/nodes/<name>)")
	}},
	{"consume", "nodes.pchannels", []string{modeNode}, func(fs *pflag.FlagSet, _ server.Config) {
		fs.IntSlice("consume", nil, "pchannel indexes the node consumes")
	}},
	{"group-size", "nodes.group_size", []string{modeNode}, func(fs *pflag.FlagSet, _ server.Config) {
		fs.Int("group-size", 0, "instead of --consume: one of N nodes named <x>-0 ... <x>-(N-1) (a StatefulSet), consuming the pchannels whose index mod N is its name's ordinal")
	}},
	{"coordinators", "nodes.coordinators", []string{modeNode}, func(fs *pflag.FlagSet, _ server.Config) {
		fs.StringSlice("coordinators", nil, "coordinator API addresses the node acks to")
	}},
	{"api-tls-cert", "api.tls.cert_file", apiServers, func(fs *pflag.FlagSet, _ server.Config) {
		fs.String("api-tls-cert", "", "serve the API over TLS with this certificate (PEM; reloaded on change or SIGHUP)")
	}},
	{"api-tls-key", "api.tls.key_file", apiServers, func(fs *pflag.FlagSet, _ server.Config) {
		fs.String("api-tls-key", "", "key of --api-tls-cert")
	}},
	{"api-client-ca", "api.tls.client_ca_file", apiServers, func(fs *pflag.FlagSet, _ server.Config) {
		fs.String("api-client-ca", "", "CA bundle client certificates are verified against (mTLS identities)")
	}},
	{"api-token-file", "api.auth.token_file", apiServers, func(fs *pflag.FlagSet, _ server.Config) {
		fs.String("api-token-file", "", "token file of the API's bearer tokens (walcast auth token create)")
	}},
	{"insecure", "api.insecure", apiServers, func(fs *pflag.FlagSet, _ server.Config) {
		fs.Bool("insecure", false, "allow a non-loopback --api-addr without TLS and authentication")
	}},
	{"secure", "api.secure", []string{modeStandalone}, func(fs *pflag.FlagSet, _ server.Config) {
		fs.Bool("secure", false, "make (once) a local CA, server certificate and admin token under --data-dir/secure and require TLS and credentials")
	}},
	{"audit-file", "audit.file", apiServers, func(fs *pflag.FlagSet, d server.Config) {
		fs.String("audit-file", d.Audit.File, `audit log: "stderr", "off" or a file`)
	}},
	{"nats-addr", "standalone.nats_addr", []string{modeStandalone}, func(fs *pflag.FlagSet, _ server.Config) {
		fs.String("nats-addr", "", "the embedded NATS's client address, 127.0.0.1:<port> (default: --api-addr's port + 2)")
	}},
	{"etcd-addr", "standalone.etcd_addr", []string{modeStandalone}, func(fs *pflag.FlagSet, _ server.Config) {
		fs.String("etcd-addr", "", "the embedded etcd's client address, 127.0.0.1:<port> (default: --api-addr's port + 3)")
	}},
}

// addServerFlags declares the server flags of mode on fs, with the
// defaults shown.
func addServerFlags(fs *pflag.FlagSet, configPath *string, mode string) {
	d := server.Default()
	fs.StringVarP(configPath, "config", "c", "", "YAML configuration file")
	for _, f := range serverFlags {
		if mode == modePrint || slices.Contains(f.modes, mode) {
			f.define(fs, d)
		}
	}
}

// flagKey is the configuration key of a server flag, "" for other flags.
func flagKey(name string) string {
	for _, f := range serverFlags {
		if f.name == name {
			return f.key
		}
	}
	return ""
}

// loadConfig loads the server configuration and shows its warnings (unknown
// WALCAST_* variables that are ignored) on stderr.
// loadServerConfig is loadConfig for a server command: once the
// configuration loads, its logger becomes the one destination of every log
// line of the process (server.RouteLogs), the configuration's warnings
// included.
func loadServerConfig(fs *pflag.FlagSet, path string) (server.Config, error) {
	c, warnings, err := server.LoadWithWarnings(path, os.Environ(), fs, flagKey)
	if err != nil {
		for _, w := range warnings {
			fmt.Fprintln(os.Stderr, "walcast: warning:", w)
		}
		return c, err
	}
	log := c.Logger()
	server.RouteLogs(log)
	for _, w := range warnings {
		log.Warn("configuration: " + w)
	}
	return c, nil
}

func loadConfig(fs *pflag.FlagSet, path string) (server.Config, error) {
	c, warnings, err := server.LoadWithWarnings(path, os.Environ(), fs, flagKey)
	for _, w := range warnings {
		fmt.Fprintln(os.Stderr, "walcast: warning:", w)
	}
	return c, err
}

func configCmd(g *globals) *cobra.Command {
	var path string
	cmd := &cobra.Command{Use: "config", Short: "Inspect the server configuration"}
	print := &cobra.Command{
		Use:   "print",
		Short: "Print the effective configuration (defaults < file < WALCAST_* environment < flags)",
		Long: `Print the effective server configuration: the defaults, overridden by the YAML file
(--config), the WALCAST_* environment and the flags (every server flag is accepted). The
output is YAML that --config reads back; -o json prints the same as JSON (durations as
Go duration strings, e.g. "24h0m0s").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := g.format()
			if err != nil {
				return err
			}
			c, err := loadConfig(cmd.Flags(), path)
			if err != nil {
				return err
			}
			y, err := c.YAML()
			if err != nil {
				return err
			}
			if f != formatJSON {
				_, err = cmd.OutOrStdout().Write(y)
				return err
			}
			var v map[string]any
			if err := yaml.Unmarshal(y, &v); err != nil {
				return err
			}
			return emit(cmd.OutOrStdout(), formatJSON, v)
		},
	}
	addServerFlags(print.Flags(), &path, modePrint)
	addOutputFlags(print, g)
	cmd.AddCommand(print)
	return cmd
}

// envHelp documents the environment mapping in command help.
var envHelp = strings.TrimSpace(`
Every setting can also come from a YAML file (--config) or the environment:
WALCAST_<KEY>, the key's path upper-cased with "." as "_", e.g.
WALCAST_BROADCAST_TOMBSTONE_MAX_COUNT=10000. Flags beat the environment, which
beats the file. "walcast config print" shows the result.`)
