package server

import (
	"errors"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"strconv"
	"time"

	yamlv3 "go.yaml.in/yaml/v3"
)

// Config is every setting of a walcast process (R9.7 of docs/spec.md), one
// named type per section of keys (api, catalog, wal, broadcast, ...), each
// with its defaults and its Validate. Settings come, in increasing
// priority, from the defaults (Default), a YAML file, environment variables
// WALCAST_<KEY> (the key's path with "." as "_", upper case, e.g.
// WALCAST_BROADCAST_TOMBSTONE_MAX_COUNT), and command-line flags (Load).
// docs/configuration.md lists every key, generated from these types.
type Config struct {
	// DataDir holds everything a standalone process stores: the embedded
	// etcd, the embedded NATS store and the nodes' state. A coordinator
	// (standalone's too) locks it and records its election lease there,
	// so that restarted after a crash it takes over at once: every
	// coordinator needs its own.
	DataDir     string            `yaml:"data_dir"`
	Cluster     ClusterConfig     `yaml:"cluster"`
	API         APIConfig         `yaml:"api"`
	Standalone  StandaloneConfig  `yaml:"standalone"`
	Disk        DiskConfig        `yaml:"disk"`
	Metrics     MetricsConfig     `yaml:"metrics"`
	Audit       AuditConfig       `yaml:"audit"`
	Log         LogConfig         `yaml:"log"`
	Catalog     CatalogConfig     `yaml:"catalog"`
	WAL         WALConfig         `yaml:"wal"`
	Broadcast   BroadcastConfig   `yaml:"broadcast"`
	Replication ReplicationConfig `yaml:"replication"`
	Nodes       NodesConfig       `yaml:"nodes"`
	Election    ElectionConfig    `yaml:"election"`
	Durability  DurabilityConfig  `yaml:"durability"`
	Tracing     TracingConfig     `yaml:"tracing"`
	Console     ConsoleConfig     `yaml:"console"`
	Meta        MetaConfig        `yaml:"meta"`
}

// Default returns the configuration with every default of docs/spec.md.
func Default() Config {
	return Config{
		DataDir:     "./walcast-data",
		Cluster:     ClusterConfig{Name: "walcast"},
		API:         defaultAPIConfig(),
		Standalone:  defaultStandaloneConfig(),
		Disk:        defaultDiskConfig(),
		Metrics:     defaultMetricsConfig(),
		Audit:       defaultAuditConfig(),
		Log:         defaultLogConfig(),
		Catalog:     defaultCatalogConfig(),
		WAL:         defaultWALConfig(),
		Broadcast:   defaultBroadcastConfig(),
		Nodes:       NodesConfig{Count: 2},
		Election:    ElectionConfig{TTL: Duration(10 * time.Second)},
		Tracing:     defaultTracingConfig(),
		Console:     defaultConsoleConfig(),
		Meta:        defaultMetaConfig(),
		Replication: ReplicationConfig{UnreachableSecondaries: RefuseUnconfirmed},
	}
}

// ErrConfig reports an invalid setting; the message names it.
var ErrConfig = errors.New("invalid configuration")

// badSetting is the error of an invalid setting: ErrConfig, the key, and
// what is wrong with it.
func badSetting(key, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrConfig, key, fmt.Sprintf(format, args...))
}

// Validate checks every section, then the couplings between sections; an
// error names the setting.
func (c Config) Validate() error {
	if c.DataDir == "" {
		return badSetting("data_dir", "must not be empty")
	}
	for _, s := range []interface{ Validate() error }{c.Cluster, c.API, c.Log, c.Catalog, c.Standalone, c.Disk,
		c.WAL, c.Broadcast, c.Nodes, c.Election, c.Tracing, c.Console, c.Meta, c.Replication, c.Audit} {
		if err := s.Validate(); err != nil {
			return err
		}
	}
	return c.validateCouplings()
}

// validateCouplings checks the settings that bound each other across
// sections.
func (c Config) validateCouplings() error {
	b := c.Broadcast
	switch {
	case b.Txn.MaxMembers != 0 && (b.Txn.MaxMembers < 2 || b.Txn.MaxMembers > c.Catalog.MaxTxnOps-2):
		return badSetting("broadcast.txn.max_members", "%d: need 0 (the default) or 2 to %d (catalog.max_txn_ops less two)", b.Txn.MaxMembers, c.Catalog.MaxTxnOps-2)
	case b.MaxMessageBytes+64<<10 > c.Catalog.MaxTxnBytes:
		return badSetting("broadcast.max_message_bytes", "%d plus 64 KiB of record overhead exceeds catalog.max_txn_bytes (%d)", b.MaxMessageBytes, c.Catalog.MaxTxnBytes)
	case c.API.MaxRequestBytes < b.MaxMessageBytes:
		return badSetting("api.max_request_bytes", "%d is below broadcast.max_message_bytes (%d)", c.API.MaxRequestBytes, b.MaxMessageBytes)
	case c.Standalone.WALRetention < c.WAL.NATS.DedupWindow:
		return badSetting("standalone.wal_retention", "%v is below wal.nats.dedup_window (%v): a retried append must still meet its original",
			c.Standalone.WALRetention.D(), c.WAL.NATS.DedupWindow.D())
	case c.Metrics.TLS && c.API.TLS.CertFile == "":
		return badSetting("metrics.tls", "serves with api.tls's certificate: set api.tls.cert_file and api.tls.key_file")
	}
	for _, p := range c.Nodes.PChannels {
		if p < 0 || p >= c.WAL.PChannels {
			return badSetting("nodes.pchannels", "pchannel index %d is outside 0..%d", p, c.WAL.PChannels-1)
		}
	}
	if g := c.Nodes.GroupSize; g > c.WAL.PChannels {
		return badSetting("nodes.group_size", "%d nodes share %d pchannels: some would consume none", g, c.WAL.PChannels)
	}
	if _, _, err := c.EmbeddedPorts(); err != nil {
		return err
	}
	return c.validateImportWindow()
}

// validateImportWindow checks that an import key's window cannot end before
// its import: the import job must be kept at least twice as long as the key
// (a retry inside the window must find its job), and the key's class must
// hold at least as many tombstones as imports may be unfinished at once (a
// burst of imports up to the admission limit must not evict the key of one
// still running).
func (c Config) validateImportWindow() error {
	life, count, setting := c.Broadcast.Tombstone.importWindow()
	switch {
	case c.Meta.ImportJobRetention < 2*life:
		// An idempotency key lives as long as its tombstone; the job it
		// names must outlive it, or a retry inside the window finds the
		// job gone (the reference system documented this coupling only).
		return badSetting("meta.import_job_retention", "%v is shorter than twice %s.max_lifetime (%v): retries inside the idempotency window could find their import job deleted",
			c.Meta.ImportJobRetention.D(), setting, life.D())
	case count < c.Meta.MaxImportJobNum:
		return badSetting(setting+".max_count", "%d is below meta.max_import_job_num (%d): a burst of imports could evict the key of one still running, and its retry would start a second import",
			count, c.Meta.MaxImportJobNum)
	}
	return nil
}

// Duration is a time.Duration written as "24h" or "10ms" in YAML,
// environment variables and flags.
type Duration time.Duration

// MarshalText writes the duration as Go writes it ("1h30m0s").
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// ImportRoot is the directory the metadata service reads import files
// from: meta.import_root, or "<data_dir>/imports" if it is empty.
func (c Config) ImportRoot() string {
	if c.Meta.ImportRoot != "" {
		return c.Meta.ImportRoot
	}
	return filepath.Join(c.DataDir, "imports")
}

// AuthOn reports whether the API authenticates callers: with a token file
// or a client CA bundle.
func (c Config) AuthOn() bool { return c.API.authOn() }

// YAML returns the configuration as a YAML document, as `walcast config
// print` shows it.
func (c Config) YAML() ([]byte, error) { return yamlv3.Marshal(c) }

// EmbeddedPorts returns the ports standalone's embedded NATS and etcd
// listen on (standalone.nats_addr and etcd_addr, or next to api.addr's
// port); 0 means a random free port.
func (c Config) EmbeddedPorts() (natsPort, etcdPort int, err error) {
	_, api, _ := net.SplitHostPort(c.API.Addr)
	apiPort, _ := strconv.Atoi(api)
	port := func(key, addr string, offset int) (int, error) {
		if addr == "" {
			if apiPort == 0 {
				return 0, nil
			}
			if apiPort+offset > math.MaxUint16 {
				return 0, fmt.Errorf("%w: %s: api.addr's port %d + %d is not a port: set %s", ErrConfig, key, apiPort, offset, key)
			}
			return apiPort + offset, nil
		}
		host, p, err := net.SplitHostPort(addr)
		n, perr := strconv.Atoi(p)
		if err != nil || perr != nil || n < 0 || n > math.MaxUint16 {
			return 0, fmt.Errorf("%w: %s: %q is not <host>:<port>", ErrConfig, key, addr)
		}
		if host != "" && host != "localhost" && !loopback(addr) {
			return 0, fmt.Errorf("%w: %s: %q: the embedded server listens on 127.0.0.1 only", ErrConfig, key, addr)
		}
		return n, nil
	}
	if natsPort, err = port("standalone.nats_addr", c.Standalone.NATSAddr, 2); err != nil {
		return 0, 0, err
	}
	if etcdPort, err = port("standalone.etcd_addr", c.Standalone.EtcdAddr, 3); err != nil {
		return 0, 0, err
	}
	if natsPort != 0 && natsPort == etcdPort {
		return 0, 0, fmt.Errorf("%w: standalone.nats_addr and standalone.etcd_addr are both port %d", ErrConfig, natsPort)
	}
	return natsPort, etcdPort, nil
}

// loopback reports whether a listen address binds to loopback only:
// 127.0.0.0/8, ::1 or localhost. An empty host (every interface) is not.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// KafkaMinInsync is the min.insync.replicas walcast gives the topics it
// creates: wal.kafka.min_insync_replicas, by default replication_factor - 1
// (at least 1); 0 (the brokers' default) when both are 0.
func (c Config) KafkaMinInsync() int {
	k := c.WAL.Kafka
	switch {
	case k.MinInsyncReplicas > 0:
		return k.MinInsyncReplicas
	case k.ReplicationFactor > 0:
		return max(1, k.ReplicationFactor-1)
	}
	return 0
}
