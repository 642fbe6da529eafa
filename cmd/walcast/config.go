package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/walcast/walcast/server"
)

// serverFlags are the settings server commands take as flags; each maps to a
// configuration key (flags beat environment beats the YAML file).
var serverFlags = map[string]string{
	"data-dir":                  "data_dir",
	"api-addr":                  "api.addr",
	"metrics-addr":              "metrics.addr",
	"pchannels":                 "wal.pchannels",
	"nodes":                     "nodes.count",
	"log-level":                 "log.level",
	"log-format":                "log.format",
	"etcd":                      "catalog.endpoints",
	"nats":                      "wal.nats.url",
	"kafka":                     "wal.kafka.brokers",
	"kafka-replication-factor":  "wal.kafka.replication_factor",
	"kafka-min-insync-replicas": "wal.kafka.min_insync_replicas",
	"kafka-topic-prefix":        "wal.kafka.topic_prefix",
	"nats-stream-prefix":        "wal.nats.stream_prefix",
	"wal":                       "wal.kind",
	"name":                      "nodes.name",
	"consume":                   "nodes.pchannels",
	"coordinators":              "nodes.coordinators",
	"advertise":                 "api.advertise",
	"cluster":                   "cluster.name",
	"api-tls-cert":              "api.tls.cert_file",
	"api-tls-key":               "api.tls.key_file",
	"api-client-ca":             "api.tls.client_ca_file",
	"api-token-file":            "api.auth.token_file",
	"insecure":                  "api.insecure",
	"secure":                    "api.secure",
	"audit-file":                "audit.file",
	"nats-monitor":              "wal.nats.monitor_urls",
	"allow-unsafe-durability":   "durability.allow_unsafe",
	"nats-addr":                 "standalone.nats_addr",
	"etcd-addr":                 "standalone.etcd_addr",
}

// addServerFlags declares the server flags on fs, with the defaults shown.
func addServerFlags(fs *pflag.FlagSet, configPath *string) {
	d := server.Default()
	fs.StringVarP(configPath, "config", "c", "", "YAML configuration file")
	fs.String("data-dir", d.DataDir, "directory for all standalone data")
	fs.String("cluster", d.Cluster.Name, "this cluster's name in replication topologies")
	fs.String("api-addr", d.API.Addr, "API listen address")
	fs.String("advertise", "", "API address others reach this process at (default --api-addr)")
	fs.String("metrics-addr", d.Metrics.Addr, "Prometheus /metrics listen address (empty: off)")
	fs.Int("pchannels", d.WAL.PChannels, "number of pchannels")
	fs.Int("nodes", d.Nodes.Count, "streaming nodes a standalone process runs")
	fs.String("log-level", d.Log.Level, "debug, info, warn or error")
	fs.String("log-format", d.Log.Format, "json or text")
	fs.StringSlice("etcd", nil, "external etcd endpoints (cluster mode)")
	fs.String("nats", "", "external NATS URL (cluster mode)")
	fs.StringSlice("kafka", nil, "Kafka brokers (cluster mode, with --wal kafka)")
	fs.Int("kafka-replication-factor", d.WAL.Kafka.ReplicationFactor, "replication factor of the Kafka topics walcast creates (1 on a one-broker development Kafka)")
	fs.Int("kafka-min-insync-replicas", d.WAL.Kafka.MinInsyncReplicas, "min.insync.replicas of the Kafka topics walcast creates (0: replication factor - 1, at least 1)")
	fs.String("kafka-topic-prefix", d.WAL.Kafka.TopicPrefix, "prefix of this cluster's Kafka topics (clusters sharing a Kafka need their own)")
	fs.String("nats-stream-prefix", d.WAL.NATS.StreamPrefix, "prefix of this cluster's JetStream streams (clusters sharing a NATS server need their own)")
	fs.String("wal", d.WAL.Kind, "WAL backend: nats or kafka")
	fs.String("name", "", "node name (walcast node)")
	fs.IntSlice("consume", nil, "pchannel indexes this node consumes (walcast node)")
	fs.StringSlice("coordinators", nil, "coordinator API addresses a node acks to (walcast node)")
	fs.String("api-tls-cert", "", "serve the API over TLS with this certificate (PEM; reloaded on change or SIGHUP)")
	fs.String("api-tls-key", "", "key of --api-tls-cert")
	fs.String("api-client-ca", "", "CA bundle client certificates are verified against (mTLS identities)")
	fs.String("api-token-file", "", "token file of the API's bearer tokens (walcast auth token create)")
	fs.Bool("insecure", false, "allow a non-loopback --api-addr without TLS and authentication")
	fs.Bool("secure", false, "standalone: make (once) a local CA, server certificate and admin token under --data-dir/secure and require TLS and credentials")
	fs.String("audit-file", d.Audit.File, `audit log: "stderr", "off" or a file`)
	fs.StringSlice("nats-monitor", nil, "external NATS servers' monitoring URLs (http://host:8222): coord checks there that each syncs every write")
	fs.Bool("allow-unsafe-durability", false, "coord: start even on backends that can lose a DDL reported done (see the durability report it prints)")
	fs.String("nats-addr", "", "standalone: the embedded NATS's client address, 127.0.0.1:<port> (default: --api-addr's port + 2)")
	fs.String("etcd-addr", "", "standalone: the embedded etcd's client address, 127.0.0.1:<port> (default: --api-addr's port + 3)")
}

// loadConfig loads the server configuration and shows its warnings (unknown
// WALCAST_* variables that are ignored) on stderr.
func loadConfig(fs *pflag.FlagSet, path string) (server.Config, error) {
	c, warnings, err := server.LoadWithWarnings(path, os.Environ(), fs, func(name string) string { return serverFlags[name] })
	for _, w := range warnings {
		fmt.Fprintln(os.Stderr, "walcast: warning:", w)
	}
	return c, err
}

func configCmd() *cobra.Command {
	var path string
	cmd := &cobra.Command{Use: "config", Short: "Inspect the configuration"}
	print := &cobra.Command{
		Use:   "print",
		Short: "Print the effective configuration (defaults < file < WALCAST_* environment < flags)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := loadConfig(cmd.Flags(), path)
			if err != nil {
				return err
			}
			y, err := c.YAML()
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(y)
			return err
		},
	}
	addServerFlags(print.Flags(), &path)
	cmd.AddCommand(print)
	return cmd
}

// envHelp documents the environment mapping in command help.
var envHelp = strings.TrimSpace(`
Every setting can also come from a YAML file (--config) or the environment:
WALCAST_<KEY>, the key's path upper-cased with "." as "_", e.g.
WALCAST_BROADCAST_TOMBSTONE_MAX_COUNT=10000. Flags beat the environment, which
beats the file. "walcast config print" shows the result.`)
