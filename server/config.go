package server

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
	yamlv3 "go.yaml.in/yaml/v3"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/internal/embedetcd"
	"github.com/walcast/walcast/message"
	walkafka "github.com/walcast/walcast/wal/kafka"
	walnats "github.com/walcast/walcast/wal/nats"
)

// RetentionClass is a retention class of tombstones (R6.4): its types'
// tombstones are kept until older than MaxLifetime or beyond its newest
// MaxCount.
type RetentionClass struct {
	Name string `yaml:"name"`
	// Types are message types as "<name>.v<version>".
	Types       []string `yaml:"types"`
	MaxCount    int      `yaml:"max_count"`
	MaxLifetime Duration `yaml:"max_lifetime"`
}

// ImportClass is the default retention class of the metadata service's
// imports: an import key must outlive every other DDL's burst, or a retry
// starts a second import.
const ImportClass = "import"

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

// Config is every setting of a walcast process (R9.7 of docs/spec.md). Settings come, in
// increasing priority, from the defaults below, a YAML file, environment
// variables WALCAST_<KEY> (the key's path with "." as "_", upper case, e.g.
// WALCAST_BROADCAST_TOMBSTONE_MAX_COUNT), and command-line flags.
type Config struct {
	// DataDir holds everything a standalone process stores: the embedded
	// etcd, the embedded NATS store and the nodes' state. A coordinator
	// (standalone's too) locks it and records its election lease there,
	// so that restarted after a crash it takes over at once: every
	// coordinator needs its own.
	DataDir string `yaml:"data_dir"`
	Cluster struct {
		// Name names the cluster in replication topologies (SPEC §8).
		Name string `yaml:"name"`
	} `yaml:"cluster"`
	API struct {
		// Addr is the coordinator API's listen address (gRPC and HTTP/JSON).
		Addr string `yaml:"addr"`
		// Advertise is the address other processes and clients reach this
		// coordinator at; default Addr.
		Advertise string `yaml:"advertise"`
		// MaxRequestBytes bounds one API request.
		MaxRequestBytes int `yaml:"max_request_bytes"`
		// MaxInFlight bounds the API calls a coordinator serves at once
		// (node acks, health and reflection aside); 0 turns admission
		// off. MaxQueued more wait for a slot, each at most
		// QueueTimeout; calls beyond them are refused at once with
		// ResourceExhausted (QUOTA_EXCEEDED) and a retry hint
		// (google.rpc.RetryInfo, Retry-After), having done nothing.
		MaxInFlight  int      `yaml:"max_in_flight"`
		MaxQueued    int      `yaml:"max_queued"`
		QueueTimeout Duration `yaml:"queue_timeout"`
		// RetryAfter is the retry hint of a refused call: clients should
		// wait about that long (jittered) before retrying.
		RetryAfter Duration `yaml:"retry_after"`
		// Secure (standalone only) makes, once, a local CA, a server
		// certificate and an admin token under data_dir/secure, and
		// serves the API with them: TLS, tokens, and client
		// certificates of that CA (see SetupSecure).
		Secure bool `yaml:"secure"`
		// Insecure allows serving the API on a non-loopback address
		// without TLS and authentication (R9.8): by default that refuses
		// to start.
		Insecure bool `yaml:"insecure"`
		// TLS serves the API (gRPC, gRPC-Web, Connect) over TLS.
		TLS struct {
			// CertFile and KeyFile are the server's certificate (chain)
			// and key, PEM; reloaded when they change (ReloadInterval) or
			// on SIGHUP, without a restart.
			CertFile string `yaml:"cert_file"`
			KeyFile  string `yaml:"key_file"`
			// ClientCAFile is the CA bundle client certificates are
			// verified against (mTLS): a verified certificate
			// authenticates its subject CN with the role of its
			// "walcast:<role>" OU. Reloaded like the certificate.
			ClientCAFile string `yaml:"client_ca_file"`
			// RequireClientCert refuses connections without a client
			// certificate (tokens alone are then not enough).
			RequireClientCert bool `yaml:"require_client_cert"`
		} `yaml:"tls"`
		Auth struct {
			// TokenFile holds the bearer tokens (salted argon2id hashes)
			// that `walcast auth token` manages; reloaded when it
			// changes. Authentication is on when it or
			// api.tls.client_ca_file is set.
			TokenFile string `yaml:"token_file"`
		} `yaml:"auth"`
		// ReloadInterval is how often the TLS files and the token file
		// are checked for changes.
		ReloadInterval Duration `yaml:"reload_interval"`
	} `yaml:"api"`
	Standalone struct {
		// NATSAddr and EtcdAddr are where standalone's embedded NATS and
		// etcd listen for clients (127.0.0.1 only). Empty means next to
		// api.addr's port: port+2 for NATS, port+3 for etcd (a random
		// port if api.addr's port is 0). Fixed ports survive restarts, so
		// a secondary reading this cluster's NATS keeps reading it.
		NATSAddr string `yaml:"nats_addr"`
		EtcdAddr string `yaml:"etcd_addr"`
		// NATSMaxStore and NATSMaxMemory are the embedded JetStream's
		// limits on its file and memory storage, in bytes (not sized
		// from the disk space free at start, which a nearly full disk
		// would make too small for good). Appends beyond NATSMaxStore
		// fail with "insufficient resources".
		NATSMaxStore  int64 `yaml:"nats_max_store"`
		NATSMaxMemory int64 `yaml:"nats_max_memory"`
		// EtcdCompactionRetention is how long the embedded etcd keeps
		// revision history before compacting it: its memory and database
		// grow with the writes of that long. It must outlast the longest
		// catalog listing (a recovery's), which pins one revision.
		EtcdCompactionRetention Duration `yaml:"etcd_compaction_retention"`
		// EtcdQuotaBytes bounds the embedded etcd's database file (etcd's
		// quota-backend-bytes; etcd refuses every write once it is full).
		// Once the file passes half of it, history older than a minute is
		// compacted at once instead of after etcd_compaction_retention.
		EtcdQuotaBytes int64 `yaml:"etcd_quota_bytes"`
		// WALRetention is how long standalone's WAL entries are kept at
		// least: an entry older than this that every streaming node of
		// the process has saved a state past is dropped (checked every
		// tenth of it, at most every minute). At least
		// wal.nats.dedup_window. A cluster in a replication topology
		// keeps every entry: a secondary reads them at a position this
		// process does not know.
		WALRetention Duration `yaml:"wal_retention"`
	} `yaml:"standalone"`
	Disk struct {
		// ReserveBytes is the free space of data_dir's file system below
		// which standalone refuses catalog and WAL writes (a definite
		// error: nothing was written; the broadcast fails as not
		// created, or is retried until space is freed) and reports not
		// ready, while it keeps serving reads, so that its embedded etcd
		// never runs into a full disk (etcd cannot go on after a failed
		// write). Keep it above etcd's WAL segment (64 MiB) plus a
		// snapshot; 0 disables the check.
		ReserveBytes int64 `yaml:"reserve_bytes"`
		// WarnBytes is the free space below which every process warns
		// (log, /readyz detail, walcast_disk_level): at least
		// ReserveBytes.
		WarnBytes int64 `yaml:"warn_bytes"`
		// CheckInterval is how often the free space is sampled.
		CheckInterval Duration `yaml:"check_interval"`
	} `yaml:"disk"`
	Metrics struct {
		// Addr serves /metrics; empty disables it.
		Addr string `yaml:"addr"`
		// TLS serves /metrics over TLS with api.tls's certificate.
		TLS bool `yaml:"tls"`
	} `yaml:"metrics"`
	Audit struct {
		// File receives the audit log (JSON lines): "stderr", "off", or
		// a file path (appended to).
		File string `yaml:"file"`
	} `yaml:"audit"`
	Log struct {
		Level  string `yaml:"level"`  // debug, info, warn, error
		Format string `yaml:"format"` // json or text
	} `yaml:"log"`
	Catalog struct {
		// Endpoints of an external etcd cluster; empty runs an embedded
		// etcd in DataDir (standalone only).
		Endpoints []string `yaml:"endpoints"`
		// Prefix is prepended to every key walcast writes.
		Prefix string `yaml:"prefix"`
		// MaxTxnOps must not exceed the etcd server's --max-txn-ops.
		MaxTxnOps int `yaml:"max_txn_ops"`
		// MaxTxnBytes must not exceed the server's --max-request-bytes.
		MaxTxnBytes int      `yaml:"max_txn_bytes"`
		DialTimeout Duration `yaml:"dial_timeout"`
		// KeepaliveTime and KeepaliveTimeout are the client's gRPC
		// keepalive pings: a member that stops answering (a hung machine,
		// a partition) is given up after their sum and the client moves
		// to another endpoint. Keep the sum below election.ttl, so that a
		// leader's lease survives a member's loss; etcd refuses pings
		// more often than every 5s by default.
		KeepaliveTime    Duration `yaml:"keepalive_time"`
		KeepaliveTimeout Duration `yaml:"keepalive_timeout"`
		// AutoSyncInterval, if not zero, refreshes the client's endpoints
		// from the cluster's member list that often (members added or
		// replaced later are found); their advertised client URLs must
		// then be reachable from here.
		AutoSyncInterval Duration `yaml:"auto_sync_interval"`
		// CommitTimeout bounds one catalog transaction (each gets between
		// nine tenths of it and all of it); one that runs out is
		// ambiguous and retried with the same bytes. Below etcd's
		// own request timeout (7s with its default election timeout), a
		// write caught in an etcd leader change is retried sooner.
		CommitTimeout Duration `yaml:"commit_timeout"`
		// TLS of the connections to etcd (https:// endpoints).
		TLS ClientTLS `yaml:"tls"`
		// Username and PasswordFile authenticate to etcd (etcd auth);
		// the password is read from the file, never from the config.
		Username     string `yaml:"username"`
		PasswordFile string `yaml:"password_file"`
	} `yaml:"catalog"`
	WAL struct {
		// Kind is "nats" or "kafka".
		Kind string `yaml:"kind"`
		// PChannels is the number of pchannels, named <prefix>0 ...
		PChannels      int    `yaml:"pchannels"`
		PChannelPrefix string `yaml:"pchannel_prefix"`
		// Lanes is how many backend channels (JetStream streams, Kafka
		// topics) the pchannels are folded into; copies for the pchannels
		// of one lane share entries, so one durable write serves them all.
		// 0 gives every pchannel its own lane. Replicated clusters must use
		// the same pchannels and lanes.
		Lanes int `yaml:"lanes"`
		NATS  struct {
			// URL of an external NATS server; empty runs an embedded one
			// in DataDir (standalone only).
			URL string `yaml:"url"`
			// StreamPrefix names the cluster's JetStream streams
			// (<prefix>_<lane>) and subjects: clusters sharing a NATS
			// server need their own.
			StreamPrefix string `yaml:"stream_prefix"`
			// SyncAlways makes the embedded server (standalone) fsync every
			// write; turning it off risks DDLs reported done that a machine
			// crash loses. It has no effect on an external server (URL
			// set), whose own jetstream sync_interval decides: set it to
			// always there.
			SyncAlways  bool     `yaml:"sync_always"`
			Replicas    int      `yaml:"replicas"`
			DedupWindow Duration `yaml:"dedup_window"`
			// MonitorURLs are the external servers' monitoring
			// endpoints (http://host:8222): a coordinator reads /varz
			// there to check that every server syncs each write
			// (jetstream sync_interval: always), and refuses to start
			// when one does not, or none can be asked (see
			// durability.allow_unsafe).
			MonitorURLs []string `yaml:"monitor_urls"`
			// TLS of the connection to NATS.
			TLS ClientTLS `yaml:"tls"`
			// Credentials, at most one kind: a creds file (JWT and
			// nkey seed), an nkey seed file, or a user and password
			// file.
			CredsFile    string `yaml:"creds_file"`
			NKeyFile     string `yaml:"nkey_file"`
			User         string `yaml:"user"`
			PasswordFile string `yaml:"password_file"`
		} `yaml:"nats"`
		Kafka struct {
			Brokers []string `yaml:"brokers"`
			// TopicPrefix names the cluster's topics (<prefix><lane>):
			// clusters sharing a Kafka cluster need their own.
			TopicPrefix string `yaml:"topic_prefix"`
			// ReplicationFactor of the topics walcast creates: 3 for
			// production, 1 on a one-broker development Kafka; 0 takes
			// the brokers' default.replication.factor.
			ReplicationFactor int `yaml:"replication_factor"`
			// MinInsyncReplicas is the min.insync.replicas of the topics
			// walcast creates: how many replicas must have an entry
			// before its append succeeds. 0 means replication_factor - 1
			// (at least 1), or the brokers' default when
			// replication_factor is 0.
			MinInsyncReplicas int `yaml:"min_insync_replicas"`
			// TLS of the connections to the brokers.
			TLS  ClientTLS `yaml:"tls"`
			SASL struct {
				// Mechanism is "", PLAIN, SCRAM-SHA-256 or
				// SCRAM-SHA-512.
				Mechanism    string `yaml:"mechanism"`
				User         string `yaml:"user"`
				PasswordFile string `yaml:"password_file"`
			} `yaml:"sasl"`
		} `yaml:"kafka"`
	} `yaml:"wal"`
	Broadcast struct {
		// ConcurrencyRatio × CPUs bounds concurrent appends.
		ConcurrencyRatio float64 `yaml:"concurrency_ratio"`
		Backoff          struct {
			Initial    Duration `yaml:"initial"`
			Multiplier float64  `yaml:"multiplier"`
			Max        Duration `yaml:"max"`
		} `yaml:"backoff"`
		Tombstone struct {
			MaxLifetime   Duration `yaml:"max_lifetime"`
			MaxCount      int      `yaml:"max_count"`
			CheckInterval Duration `yaml:"check_interval"`
			// Classes are retention classes of their own for some message
			// types (R6.4): a burst of one class never evicts another's
			// tombstones. Types in none share the default class above. A
			// configured list replaces the default one (the metadata
			// service's import class) whole.
			Classes []RetentionClass `yaml:"classes"`
		} `yaml:"tombstone"`
		// MaxKeyLength bounds new client idempotency keys, in bytes.
		MaxKeyLength    int `yaml:"max_key_length"`
		MaxMessageBytes int `yaml:"max_message_bytes"`
		// Txn bounds broadcast transactions (R13.4): members (Begin and
		// end included; the last is kept for the end, beyond it a body
		// fails with TXN_FULL), a member's payload bytes, and targets (the
		// control channel included). 0: the engine's default (64, or the
		// catalog's transaction ops less two; 256 KiB; 128).
		Txn struct {
			MaxMembers     int `yaml:"max_members"`
			MaxMemberBytes int `yaml:"max_member_bytes"`
			MaxVChannels   int `yaml:"max_vchannels"`
		} `yaml:"txn"`
	} `yaml:"broadcast"`
	Replication struct {
		// SkipTypes are message types (<name>.v<version>) this cluster's
		// replicator, while it is a secondary, does not copy from its
		// primary (R13.14): a per-type replication policy on top of the
		// types that are local-only anyway (R13.13). A skipped broadcast
		// never reaches this cluster: skip only types whose effect this
		// cluster must not have, never a transaction's members.
		SkipTypes []string `yaml:"skip_types"`
	} `yaml:"replication"`
	Nodes struct {
		// Count is how many streaming nodes a standalone process runs; the
		// pchannels are spread over them round robin.
		Count int `yaml:"count"`
		// Name and PChannels configure a `walcast node` process: which
		// pchannels (by index) it consumes.
		Name      string `yaml:"name"`
		PChannels []int  `yaml:"pchannels"`
		// GroupSize, instead of PChannels, makes a `walcast node` one of
		// GroupSize nodes named <anything>-0 ... <anything>-(GroupSize-1)
		// (a Kubernetes StatefulSet's pods): it consumes the pchannels
		// whose index modulo GroupSize is the ordinal ending its name.
		GroupSize int `yaml:"group_size"`
		// Coordinators are the API addresses a `walcast node` acks to.
		Coordinators []string `yaml:"coordinators"`
		// TokenFile holds the token (role node) a `walcast node`
		// authenticates to the coordinators with.
		TokenFile string `yaml:"token_file"`
		// TLS of a `walcast node`'s connections to the coordinators: the
		// CA their certificates chain to, and a client certificate (OU
		// walcast:node) if it authenticates with one.
		TLS ClientTLS `yaml:"tls"`
	} `yaml:"nodes"`
	Election struct {
		// TTL is the coordinator lease: a dead leader is replaced after it.
		TTL Duration `yaml:"ttl"`
	} `yaml:"election"`
	Durability struct {
		// AllowUnsafe lets a coordinator start on backends that can lose
		// a DDL reported done (a NATS server that does not sync every
		// write or cannot be checked, a one-replica stream on a NATS
		// cluster, a Kafka topic whose acks=all a single broker can
		// satisfy). The coordinator prints what it found at start
		// either way.
		AllowUnsafe bool `yaml:"allow_unsafe"`
	} `yaml:"durability"`
	Tracing struct {
		// Exporter is "none", "stdout" (JSON spans on stderr) or "otlp".
		Exporter string `yaml:"exporter"`
		// SamplingRatio is the share of new traces recorded (0..1); a
		// caller's sampled trace is always followed.
		SamplingRatio float64 `yaml:"sampling_ratio"`
		// InstanceID is the resource's service.instance.id; default
		// <hostname>/<pid>.
		InstanceID string `yaml:"instance_id"`
		OTLP       struct {
			// Protocol is "grpc" (port 4317) or "http" (protobuf over
			// HTTP, port 4318).
			Protocol string `yaml:"protocol"`
			// Endpoint is the collector's host:port.
			Endpoint string `yaml:"endpoint"`
			// Headers are sent with every export, as key=value
			// (authentication for a hosted collector).
			Headers []string `yaml:"headers"`
			// Insecure sends without TLS; otherwise TLS, verified with
			// CAFile (default: the system's roots).
			Insecure bool   `yaml:"insecure"`
			CAFile   string `yaml:"ca_file"`
		} `yaml:"otlp"`
	} `yaml:"tracing"`
	Console struct {
		// Enabled serves the operator console at /ui/ on the API address.
		Enabled bool `yaml:"enabled"`
		// TraceURL links a task's trace id to a trace UI: "{trace_id}" in
		// it is replaced (e.g. http://127.0.0.1:16686/trace/{trace_id}).
		TraceURL string `yaml:"trace_url"`
		// Hanging is the age from which the tasks page's "hanging" filter
		// shows a live task.
		Hanging Duration `yaml:"hanging"`
	} `yaml:"console"`
	Meta struct {
		// MaxImportJobNum bounds unfinished import jobs (admission).
		MaxImportJobNum int `yaml:"max_import_job_num"`
		// ImportJobRetention is how long finished import jobs are kept; it
		// must be at least twice the tombstone lifetime, or a retry inside
		// the idempotency window could find its job gone.
		ImportJobRetention Duration `yaml:"import_job_retention"`
		// CollectionShards is the default number of vchannels of a new
		// collection.
		CollectionShards int `yaml:"collection_shards"`
		// ImportRoot is the directory import files are read from; empty
		// means "<data_dir>/imports" (see Config.ImportRoot).
		ImportRoot string `yaml:"import_root"`
	} `yaml:"meta"`
}

// ClientTLS is the TLS of a connection walcast makes (to etcd, NATS, Kafka,
// coordinators). It is on when Enabled or any file is set.
type ClientTLS struct {
	// Enabled turns TLS on with the system's roots, without any file.
	Enabled bool `yaml:"enabled"`
	// CAFile is the CA bundle the server's certificate must chain to;
	// empty means the system's roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are a client certificate and key (mTLS).
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName overrides the name the server's certificate is checked
	// against.
	ServerName string `yaml:"server_name"`
}

// On reports whether the connection uses TLS.
func (t ClientTLS) On() bool { return t != ClientTLS{} }

// ImportRoot is the directory the metadata service reads import files
// from: meta.import_root, or "<data_dir>/imports" if it is empty.
func (c Config) ImportRoot() string {
	if c.Meta.ImportRoot != "" {
		return c.Meta.ImportRoot
	}
	return filepath.Join(c.DataDir, "imports")
}

// Default returns the configuration with every default of docs/spec.md.
func Default() Config {
	var c Config
	c.DataDir = "./walcast-data"
	c.Cluster.Name = "walcast"
	c.API.Addr = "127.0.0.1:7070"
	c.API.MaxRequestBytes = 4 << 20
	c.API.MaxInFlight = 256
	c.API.MaxQueued = 1024
	c.API.QueueTimeout = Duration(time.Second)
	c.API.RetryAfter = Duration(2 * time.Second)
	c.API.ReloadInterval = Duration(2 * time.Second)
	c.Audit.File = "stderr"
	c.Metrics.Addr = "127.0.0.1:7071"
	c.Log.Level = "info"
	c.Log.Format = "json"
	c.Catalog.Prefix = "walcast/"
	c.Catalog.MaxTxnOps = 128
	c.Catalog.MaxTxnBytes = 1536 << 10
	c.Catalog.DialTimeout = Duration(5 * time.Second)
	c.Catalog.KeepaliveTime = Duration(5 * time.Second)
	c.Catalog.KeepaliveTimeout = Duration(3 * time.Second)
	c.Catalog.CommitTimeout = Duration(5 * time.Second)
	c.WAL.Kind = "nats"
	c.WAL.PChannels = 4
	c.WAL.PChannelPrefix = "wal-"
	c.WAL.Lanes = 1
	c.WAL.NATS.SyncAlways = true
	c.WAL.NATS.Replicas = 1
	c.WAL.NATS.DedupWindow = Duration(10 * time.Minute)
	c.WAL.NATS.StreamPrefix = walnats.DefaultStreamPrefix
	c.WAL.Kafka.TopicPrefix = walkafka.DefaultTopicPrefix
	c.WAL.Kafka.ReplicationFactor = 3
	c.Broadcast.ConcurrencyRatio = 4
	bo := broadcast.Backoff{}.WithDefaults()
	c.Broadcast.Backoff.Initial = Duration(bo.Initial)
	c.Broadcast.Backoff.Multiplier = bo.Multiplier
	c.Broadcast.Backoff.Max = Duration(bo.Max)
	c.Broadcast.Tombstone.MaxLifetime = Duration(24 * time.Hour)
	c.Broadcast.Tombstone.MaxCount = 8192
	c.Broadcast.Tombstone.CheckInterval = Duration(5 * time.Minute)
	c.Broadcast.Tombstone.Classes = []RetentionClass{{Name: ImportClass, Types: []string{"Import.v1"},
		MaxCount: 8192, MaxLifetime: Duration(24 * time.Hour)}}
	c.Broadcast.MaxKeyLength = message.DefaultMaxKeyLength
	c.Broadcast.MaxMessageBytes = 256 << 10
	c.Nodes.Count = 2
	c.Election.TTL = Duration(10 * time.Second)
	c.Standalone.NATSMaxStore = 64 << 30
	c.Standalone.NATSMaxMemory = 256 << 20
	c.Standalone.EtcdCompactionRetention = Duration(time.Hour)
	c.Standalone.EtcdQuotaBytes = embedetcd.DefaultQuotaBytes
	c.Standalone.WALRetention = Duration(10 * time.Minute)
	c.Disk.ReserveBytes = 256 << 20
	c.Disk.WarnBytes = 1 << 30
	c.Disk.CheckInterval = Duration(time.Second)
	c.Tracing.Exporter = "none"
	c.Tracing.SamplingRatio = 1
	c.Tracing.OTLP.Protocol = "grpc"
	c.Tracing.OTLP.Endpoint = "127.0.0.1:4317"
	c.Console.Enabled = true
	c.Console.Hanging = Duration(time.Minute)
	c.Meta.MaxImportJobNum = 1024
	c.Meta.ImportJobRetention = Duration(48 * time.Hour)
	c.Meta.CollectionShards = 2
	return c
}

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

// ErrConfig reports an invalid setting; the message names it.
var ErrConfig = errors.New("invalid configuration")

// Load is LoadWithWarnings without the warnings.
func Load(path string, environ []string, fs *pflag.FlagSet, flagKey func(string) string) (Config, error) {
	c, _, err := LoadWithWarnings(path, environ, fs, flagKey)
	return c, err
}

// ClientEnv are the WALCAST_* variables of walcast's client commands
// (cmd/walcast): servers ignore them.
var ClientEnv = []string{"WALCAST_ADDR", "WALCAST_CONTEXT", "WALCAST_CLIENT_CONFIG", "WALCAST_TOKEN_FILE", "WALCAST_OUTPUT"}

// envVerdict says what an unknown WALCAST_ variable is: an error (a likely
// typo of a setting), "" to ignore it silently, or a warning.
func envVerdict(name string, byEnv map[string]string) (warning string, err error) {
	if slices.Contains(ClientEnv, name) || kubernetesEnv.MatchString(name) {
		return "", nil
	}
	rest := strings.TrimPrefix(name, envPrefix)
	section, _, _ := strings.Cut(rest, "_")
	nearest, dist := "", math.MaxInt
	for env := range byEnv {
		if d := editDistance(name, env); d < dist || d == dist && env < nearest {
			nearest, dist = env, d
		}
		if strings.HasSuffix(env, "_"+rest) {
			return "", fmt.Errorf("%w: unknown environment variable %s (did you mean %s?)", ErrConfig, name, env)
		}
	}
	if dist <= 3 || sections[section] {
		return "", fmt.Errorf("%w: unknown environment variable %s (did you mean %s?)", ErrConfig, name, nearest)
	}
	return fmt.Sprintf("ignoring the environment variable %s: it is no walcast setting (settings are WALCAST_<SECTION>_<KEY>, e.g. WALCAST_LOG_LEVEL)", name), nil
}

// envPrefix starts every environment variable of a setting.
const envPrefix = "WALCAST_"

// kubernetesEnv matches the variables Kubernetes sets for a Service named
// walcast in every pod of its namespace (docker links had the same).
var kubernetesEnv = regexp.MustCompile(`^WALCAST_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT|PORT_\d+_(TCP|UDP|SCTP)(_(PORT|PROTO|ADDR))?)$`)

// sections are the first components of the settings' keys, upper-cased:
// a variable in one of them that names no setting is a typo.
var sections = func() map[string]bool {
	out := map[string]bool{}
	for key := range keysOf(reflect.TypeOf(Config{}), "") {
		first, _, _ := strings.Cut(key, ".")
		first, _, _ = strings.Cut(first, "_") // data_dir: DATA
		out[strings.ToUpper(first)] = true
	}
	return out
}()

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// LoadWithWarnings builds the configuration from the defaults, the YAML
// file at path (if path is not empty), the environment (environ, e.g.
// os.Environ()) and the flags of fs that were set. Flags are mapped to keys
// by flagKey (a flag "data-dir" to "data_dir", "api-addr" to "api.addr").
//
// Unknown keys in the file are errors, so a typo cannot silently leave a
// default in place. Unknown WALCAST_ variables are sorted by what they
// probably are (envVerdict): a likely typo of a setting (in a settings
// section, such as WALCAST_BROADCAST_TOMBSTONE_MAX_CONT, or close to a
// setting's name) is an error; the variables Kubernetes derives from a
// Service named walcast (WALCAST_PORT, WALCAST_SERVICE_HOST, ...) and those
// of the client commands (ClientEnv) are ignored; any other is ignored with
// a warning, returned for the caller to show.
func LoadWithWarnings(path string, environ []string, fs *pflag.FlagSet, flagKey func(string) string) (Config, []string, error) {
	known := keysOf(reflect.TypeOf(Config{}), "")
	k := koanf.New(".")
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			return Config{}, nil, fmt.Errorf("%w: config file: %w", ErrConfig, err)
		}
		if err := k.Load(file.Provider(path), yaml.Parser()); err != nil {
			return Config{}, nil, fmt.Errorf("%w: config file %s: %w", ErrConfig, path, err)
		}
	}
	byEnv := make(map[string]string, len(known))
	for key := range known {
		byEnv[envPrefix+strings.ToUpper(strings.ReplaceAll(key, ".", "_"))] = key
	}
	var envErr error
	var warnings []string
	ep := env.Provider(".", env.Opt{
		Prefix:      envPrefix,
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(name, value string) (string, any) {
			key, ok := byEnv[name]
			if !ok {
				w, err := envVerdict(name, byEnv)
				envErr = errors.Join(envErr, err)
				if w != "" {
					warnings = append(warnings, w)
				}
				return "", nil
			}
			if known[key] == reflect.Slice {
				return key, splitList(value)
			}
			return key, value
		},
	})
	if err := k.Load(ep, nil); err != nil {
		return Config{}, nil, fmt.Errorf("%w: environment: %w", ErrConfig, err)
	}
	if envErr != nil {
		return Config{}, nil, envErr
	}
	if fs != nil {
		fp := posflag.ProviderWithFlag(fs, ".", k, func(f *pflag.Flag) (string, any) {
			if !f.Changed || flagKey == nil {
				return "", nil
			}
			key := flagKey(f.Name)
			if key == "" {
				return "", nil
			}
			return key, posflag.FlagVal(fs, f)
		})
		if err := k.Load(fp, nil); err != nil {
			return Config{}, nil, fmt.Errorf("%w: flags: %w", ErrConfig, err)
		}
	}
	for _, key := range k.Keys() {
		if _, ok := known[key]; !ok {
			return Config{}, nil, fmt.Errorf("%w: unknown setting %q", ErrConfig, key)
		}
	}
	c := Default()
	err := k.UnmarshalWithConf("", &c, koanf.UnmarshalConf{DecoderConfig: &mapstructure.DecoderConfig{
		DecodeHook: mapstructure.ComposeDecodeHookFunc(
			mapstructure.TextUnmarshallerHookFunc(),
			mapstructure.StringToSliceHookFunc(","),
		),
		Result:           &c,
		WeaklyTypedInput: true,
		TagName:          configTag,
	}})
	if err != nil {
		return Config{}, nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	slices.Sort(warnings)
	return c, warnings, c.Validate()
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// configTag is the struct tag naming a setting's key: the YAML key, which
// the file, the environment and `walcast config print` share.
const configTag = "yaml"

// keysOf lists the leaf keys of a config struct type with their kinds.
func keysOf(t reflect.Type, prefix string) map[string]reflect.Kind {
	out := map[string]reflect.Kind{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get(configTag), ",")
		if tag == "" || tag == "-" {
			continue
		}
		key := prefix + tag
		if f.Type.Kind() == reflect.Struct {
			for k, v := range keysOf(f.Type, key+".") {
				out[k] = v
			}
			continue
		}
		out[key] = f.Type.Kind()
	}
	return out
}

// Validate checks every setting and the couplings between them; an error
// names the setting.
func (c Config) Validate() error {
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrConfig, key, fmt.Sprintf(format, args...))
	}
	b := c.Broadcast
	switch {
	case c.DataDir == "":
		return bad("data_dir", "must not be empty")
	case c.Cluster.Name == "" || len(c.Cluster.Name) > 64:
		return bad("cluster.name", "must be 1 to 64 bytes")
	case c.API.Addr == "":
		return bad("api.addr", "must not be empty")
	case c.API.MaxRequestBytes < 1024:
		return bad("api.max_request_bytes", "%d is below 1 KiB", c.API.MaxRequestBytes)
	case c.API.MaxInFlight < 0 || c.API.MaxQueued < 0:
		return bad("api.max_in_flight", "max_in_flight (%d) and max_queued (%d) must not be negative", c.API.MaxInFlight, c.API.MaxQueued)
	case c.API.MaxInFlight > 0 && c.API.QueueTimeout < Duration(time.Millisecond):
		return bad("api.queue_timeout", "%v is below 1ms", c.API.QueueTimeout.D())
	case c.API.MaxInFlight > 0 && c.API.RetryAfter < Duration(100*time.Millisecond):
		return bad("api.retry_after", "%v is below 100ms", c.API.RetryAfter.D())
	case !slices.Contains([]string{"debug", "info", "warn", "error"}, c.Log.Level):
		return bad("log.level", "%q is not debug, info, warn or error", c.Log.Level)
	case c.Log.Format != "json" && c.Log.Format != "text":
		return bad("log.format", "%q is not json or text", c.Log.Format)
	case c.Catalog.MaxTxnOps < 2:
		return bad("catalog.max_txn_ops", "%d is below 2", c.Catalog.MaxTxnOps)
	case c.Standalone.NATSMaxStore < 1<<20 || c.Standalone.NATSMaxMemory < 0:
		return bad("standalone.nats_max_store", "nats_max_store (%d) must be at least 1 MiB and nats_max_memory (%d) not negative", c.Standalone.NATSMaxStore, c.Standalone.NATSMaxMemory)
	case c.Standalone.EtcdCompactionRetention < Duration(time.Minute):
		return bad("standalone.etcd_compaction_retention", "%v is below 1m", c.Standalone.EtcdCompactionRetention.D())
	case c.Standalone.WALRetention < c.WAL.NATS.DedupWindow:
		return bad("standalone.wal_retention", "%v is below wal.nats.dedup_window (%v): a retried append must still meet its original", c.Standalone.WALRetention.D(), c.WAL.NATS.DedupWindow.D())
	case c.Standalone.EtcdQuotaBytes < 64<<20 || c.Standalone.EtcdQuotaBytes > 8<<30:
		return bad("standalone.etcd_quota_bytes", "%d is outside 64 MiB..8 GiB (etcd's largest supported quota)", c.Standalone.EtcdQuotaBytes)
	case c.Disk.ReserveBytes < 0 || c.Disk.WarnBytes < 0:
		return bad("disk.reserve_bytes", "reserve_bytes (%d) and warn_bytes (%d) must not be negative", c.Disk.ReserveBytes, c.Disk.WarnBytes)
	case c.Disk.CheckInterval < Duration(10*time.Millisecond):
		return bad("disk.check_interval", "%v is below 10ms", c.Disk.CheckInterval.D())
	case c.Catalog.DialTimeout <= 0:
		return bad("catalog.dial_timeout", "must be positive")
	case c.Catalog.KeepaliveTime < Duration(time.Second) || c.Catalog.KeepaliveTimeout < Duration(time.Second):
		return bad("catalog.keepalive_time", "keepalive_time (%v) and keepalive_timeout (%v) must be at least 1s", c.Catalog.KeepaliveTime.D(), c.Catalog.KeepaliveTimeout.D())
	case c.Catalog.CommitTimeout < Duration(100*time.Millisecond):
		return bad("catalog.commit_timeout", "%v is below 100ms", c.Catalog.CommitTimeout.D())
	case c.Catalog.AutoSyncInterval < 0:
		return bad("catalog.auto_sync_interval", "%v is negative", c.Catalog.AutoSyncInterval.D())
	case c.WAL.Kind != "nats" && c.WAL.Kind != "kafka":
		return bad("wal.kind", "%q is not nats or kafka", c.WAL.Kind)
	case c.WAL.PChannels < 1 || c.WAL.PChannels > 1024:
		return bad("wal.pchannels", "%d is outside 1..1024", c.WAL.PChannels)
	case c.WAL.Lanes < 0:
		return bad("wal.lanes", "%d is negative", c.WAL.Lanes)
	case c.WAL.NATS.Replicas != 1 && c.WAL.NATS.Replicas != 3 && c.WAL.NATS.Replicas != 5:
		return bad("wal.nats.replicas", "%d is not 1, 3 or 5", c.WAL.NATS.Replicas)
	case c.WAL.NATS.DedupWindow < Duration(time.Second):
		return bad("wal.nats.dedup_window", "%v is below 1s", c.WAL.NATS.DedupWindow.D())
	case len(c.WAL.NATS.StreamPrefix) < 1 || len(c.WAL.NATS.StreamPrefix) > 32 || message.PChannel(c.WAL.NATS.StreamPrefix).Validate() != nil:
		return bad("wal.nats.stream_prefix", "%q must be 1 to 32 bytes of [A-Za-z0-9_-]", c.WAL.NATS.StreamPrefix)
	case !kafkaTopicPrefix(c.WAL.Kafka.TopicPrefix):
		return bad("wal.kafka.topic_prefix", "%q must be 1 to 200 bytes of [A-Za-z0-9._-]", c.WAL.Kafka.TopicPrefix)
	case c.WAL.Kind == "kafka" && len(c.WAL.Kafka.Brokers) == 0:
		return bad("wal.kafka.brokers", "required when wal.kind is kafka")
	case c.WAL.Kafka.ReplicationFactor < 0 || c.WAL.Kafka.ReplicationFactor > math.MaxInt16:
		return bad("wal.kafka.replication_factor", "%d is outside 0..%d (0: the brokers' default)", c.WAL.Kafka.ReplicationFactor, math.MaxInt16)
	case c.WAL.Kafka.MinInsyncReplicas < 0 || c.WAL.Kafka.ReplicationFactor > 0 && c.WAL.Kafka.MinInsyncReplicas > c.WAL.Kafka.ReplicationFactor:
		return bad("wal.kafka.min_insync_replicas", "%d is outside 0..replication_factor (%d): no append could succeed", c.WAL.Kafka.MinInsyncReplicas, c.WAL.Kafka.ReplicationFactor)
	case b.ConcurrencyRatio <= 0:
		return bad("broadcast.concurrency_ratio", "%v must be positive", b.ConcurrencyRatio)
	case b.Backoff.Initial <= 0 || b.Backoff.Max < b.Backoff.Initial:
		return bad("broadcast.backoff", "need 0 < initial (%v) <= max (%v)", b.Backoff.Initial.D(), b.Backoff.Max.D())
	case b.Backoff.Multiplier < 1:
		return bad("broadcast.backoff.multiplier", "%v is below 1", b.Backoff.Multiplier)
	case b.Txn.MaxMembers != 0 && (b.Txn.MaxMembers < 2 || b.Txn.MaxMembers > c.Catalog.MaxTxnOps-2):
		return bad("broadcast.txn.max_members", "%d: need 0 (the default) or 2 to %d (catalog.max_txn_ops less two)", b.Txn.MaxMembers, c.Catalog.MaxTxnOps-2)
	case b.Txn.MaxMemberBytes < 0:
		return bad("broadcast.txn.max_member_bytes", "%d is negative", b.Txn.MaxMemberBytes)
	case b.Txn.MaxVChannels != 0 && b.Txn.MaxVChannels < 2:
		return bad("broadcast.txn.max_vchannels", "%d: need 0 (the default) or at least 2 (a target and the control channel)", b.Txn.MaxVChannels)
	case b.Tombstone.MaxLifetime <= 0:
		return bad("broadcast.tombstone.max_lifetime", "must be positive")
	case b.Tombstone.MaxCount < 1:
		return bad("broadcast.tombstone.max_count", "%d is below 1", b.Tombstone.MaxCount)
	case b.Tombstone.CheckInterval <= 0:
		return bad("broadcast.tombstone.check_interval", "must be positive")
	case b.MaxKeyLength < 1:
		return bad("broadcast.max_key_length", "%d is below 1", b.MaxKeyLength)
	case b.MaxMessageBytes < 1024:
		return bad("broadcast.max_message_bytes", "%d is below 1 KiB", b.MaxMessageBytes)
	case b.MaxMessageBytes+64<<10 > c.Catalog.MaxTxnBytes:
		return bad("broadcast.max_message_bytes", "%d plus 64 KiB of record overhead exceeds catalog.max_txn_bytes (%d)", b.MaxMessageBytes, c.Catalog.MaxTxnBytes)
	case c.API.MaxRequestBytes < b.MaxMessageBytes:
		return bad("api.max_request_bytes", "%d is below broadcast.max_message_bytes (%d)", c.API.MaxRequestBytes, b.MaxMessageBytes)
	case c.Nodes.Count < 0:
		return bad("nodes.count", "%d is negative", c.Nodes.Count)
	case c.Election.TTL < Duration(2*time.Second):
		return bad("election.ttl", "%v is below 2s", c.Election.TTL.D())
	case c.Tracing.Exporter != "none" && c.Tracing.Exporter != "stdout" && c.Tracing.Exporter != "otlp":
		return bad("tracing.exporter", "%q is not none, stdout or otlp", c.Tracing.Exporter)
	case c.Tracing.SamplingRatio < 0 || c.Tracing.SamplingRatio > 1 || math.IsNaN(c.Tracing.SamplingRatio):
		return bad("tracing.sampling_ratio", "%v is outside 0..1", c.Tracing.SamplingRatio)
	case c.Tracing.OTLP.Protocol != "grpc" && c.Tracing.OTLP.Protocol != "http":
		return bad("tracing.otlp.protocol", "%q is not grpc or http", c.Tracing.OTLP.Protocol)
	case c.Tracing.Exporter == "otlp" && c.Tracing.OTLP.Endpoint == "":
		return bad("tracing.otlp.endpoint", "required when tracing.exporter is otlp (the collector's host:port)")
	case c.Tracing.OTLP.Insecure && c.Tracing.OTLP.CAFile != "":
		return bad("tracing.otlp.ca_file", "set with tracing.otlp.insecure: choose TLS or not")
	case c.Console.Hanging <= 0:
		return bad("console.hanging", "must be positive")
	case c.Console.TraceURL != "" && !strings.Contains(c.Console.TraceURL, "{trace_id}"):
		return bad("console.trace_url", "%q has no {trace_id} placeholder", c.Console.TraceURL)
	case c.Meta.MaxImportJobNum < 1:
		return bad("meta.max_import_job_num", "%d is below 1", c.Meta.MaxImportJobNum)
	case c.Meta.CollectionShards < 1 || c.Meta.CollectionShards > 256:
		return bad("meta.collection_shards", "%d is outside 1..256", c.Meta.CollectionShards)
	}
	if err := c.validateClasses(); err != nil {
		return err
	}
	if _, err := c.skipTypes(); err != nil {
		return err
	}
	if _, _, err := c.EmbeddedPorts(); err != nil {
		return err
	}
	if _, err := otlpHeaders(c.Tracing.OTLP.Headers); err != nil {
		return bad("tracing.otlp.headers", "%v", err)
	}
	// The longest pchannel name decides whether every name is valid.
	if err := message.PChannel(fmt.Sprintf("%s%d", c.WAL.PChannelPrefix, c.WAL.PChannels-1)).Validate(); err != nil {
		return bad("wal.pchannel_prefix", "%q makes invalid pchannel names: %v", c.WAL.PChannelPrefix, err)
	}
	if n := c.Nodes.Name; n != "" && (n == "." || n == ".." || len(n) > 255 || strings.ContainsAny(n, "/\\\x00")) {
		return bad("nodes.name", "%q must be a single path component (the node's state lives in data_dir/nodes/<name>): no '/', '\\', and not '.' or '..'", n)
	}
	for _, p := range c.Nodes.PChannels {
		if p < 0 || p >= c.WAL.PChannels {
			return bad("nodes.pchannels", "pchannel index %d is outside 0..%d", p, c.WAL.PChannels-1)
		}
	}
	switch g := c.Nodes.GroupSize; {
	case g < 0:
		return bad("nodes.group_size", "%d is negative", g)
	case g > 0 && len(c.Nodes.PChannels) > 0:
		return bad("nodes.group_size", "set nodes.pchannels or nodes.group_size, not both")
	case g > c.WAL.PChannels:
		return bad("nodes.group_size", "%d nodes share %d pchannels: some would consume none", g, c.WAL.PChannels)
	}
	return c.validateSecurity(bad)
}

// validateSecurity checks the TLS, authentication and credential settings
// (R9.8), and refuses an API on a non-loopback address without TLS and
// authentication unless api.insecure says so.
func (c Config) validateSecurity(bad func(key, format string, args ...any) error) error {
	t := c.API.TLS
	switch {
	case (t.CertFile == "") != (t.KeyFile == ""):
		return bad("api.tls", "cert_file and key_file go together")
	case t.ClientCAFile != "" && t.CertFile == "":
		return bad("api.tls.client_ca_file", "client certificates need TLS: set api.tls.cert_file and api.tls.key_file")
	case t.RequireClientCert && t.ClientCAFile == "":
		return bad("api.tls.require_client_cert", "needs api.tls.client_ca_file")
	case c.API.ReloadInterval < Duration(100*time.Millisecond):
		return bad("api.reload_interval", "%v is below 100ms", c.API.ReloadInterval.D())
	case c.Metrics.TLS && t.CertFile == "":
		return bad("metrics.tls", "serves with api.tls's certificate: set api.tls.cert_file and api.tls.key_file")
	case c.Audit.File == "":
		return bad("audit.file", `must be "stderr", "off" or a file path`)
	}
	for key, ct := range map[string]ClientTLS{"catalog.tls": c.Catalog.TLS, "wal.nats.tls": c.WAL.NATS.TLS,
		"wal.kafka.tls": c.WAL.Kafka.TLS, "nodes.tls": c.Nodes.TLS} {
		if (ct.CertFile == "") != (ct.KeyFile == "") {
			return bad(key, "cert_file and key_file go together")
		}
	}
	n := c.WAL.NATS
	kinds := 0
	for _, set := range []bool{n.CredsFile != "", n.NKeyFile != "", n.User != "" || n.PasswordFile != ""} {
		if set {
			kinds++
		}
	}
	sasl := c.WAL.Kafka.SASL
	switch {
	case (c.Catalog.Username == "") != (c.Catalog.PasswordFile == ""):
		return bad("catalog.username", "username and password_file go together")
	case kinds > 1:
		return bad("wal.nats", "set one kind of credentials: creds_file, nkey_file, or user and password_file")
	case (n.User == "") != (n.PasswordFile == ""):
		return bad("wal.nats.user", "user and password_file go together")
	case !slices.Contains([]string{"", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}, sasl.Mechanism):
		return bad("wal.kafka.sasl.mechanism", "%q is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", sasl.Mechanism)
	case sasl.Mechanism != "" && (sasl.User == "" || sasl.PasswordFile == ""):
		return bad("wal.kafka.sasl", "mechanism %s needs user and password_file", sasl.Mechanism)
	case sasl.Mechanism == "" && (sasl.User != "" || sasl.PasswordFile != ""):
		return bad("wal.kafka.sasl.mechanism", "user and password_file need a mechanism")
	}
	if c.API.Secure && (t.CertFile != "" || t.ClientCAFile != "" || c.API.Auth.TokenFile != "") {
		return bad("api.secure", "makes its own api.tls and api.auth files: leave api.tls.* and api.auth.token_file unset")
	}
	if !c.API.Insecure && !c.API.Secure && !loopback(c.API.Addr) && !(t.CertFile != "" && c.AuthOn()) {
		return bad("api.addr", "%s is not a loopback address: serving the API there needs TLS (api.tls.cert_file and api.tls.key_file, --api-tls-cert/--api-tls-key) and authentication (api.auth.token_file or api.tls.client_ca_file, --api-token-file/--api-client-ca), or api.insecure: true (--insecure) to serve it unprotected", c.API.Addr)
	}
	return nil
}

// NodePChannels are the pchannel indexes a `walcast node` consumes:
// nodes.pchannels, or with nodes.group_size its share by the ordinal ending
// nodes.name (pod "walcast-node-1" of 2 takes 1, 3, ...).
func (c Config) NodePChannels() ([]int, error) {
	g := c.Nodes.GroupSize
	if g == 0 {
		return c.Nodes.PChannels, nil
	}
	i := strings.LastIndexByte(c.Nodes.Name, '-')
	ord, err := strconv.Atoi(c.Nodes.Name[i+1:])
	if i < 0 || err != nil || ord < 0 || ord >= g || c.Nodes.Name[i+1:] != strconv.Itoa(ord) {
		return nil, fmt.Errorf("%w: nodes.group_size %d: the node's name %q must end in -<ordinal>, 0 to %d", ErrConfig, g, c.Nodes.Name, g-1)
	}
	var out []int
	for p := ord; p < c.WAL.PChannels; p += g {
		out = append(out, p)
	}
	return out, nil
}

// AuthOn reports whether the API authenticates callers: with a token file
// or a client CA bundle.
func (c Config) AuthOn() bool { return c.API.Auth.TokenFile != "" || c.API.TLS.ClientCAFile != "" }

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

// validateClasses checks the retention classes, and that an import key's
// window cannot end before its import: the import job must be kept at
// least twice as long as the key (a retry inside the window must find its
// job), and the key's class must hold at least as many tombstones as
// imports may be unfinished at once (a burst of imports up to the admission
// limit must not evict the key of one still running).
func (c Config) validateClasses() error {
	bad := func(setting, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrConfig, setting, fmt.Sprintf(format, args...))
	}
	b := c.Broadcast.Tombstone
	importLife, importCount, importClass := b.MaxLifetime, b.MaxCount, "broadcast.tombstone"
	names := map[string]bool{"default": true}
	typed := map[message.Type]string{}
	for i, cl := range b.Classes {
		at := fmt.Sprintf("broadcast.tombstone.classes[%d]", i)
		switch {
		case cl.Name == "" || names[cl.Name]:
			return bad(at+".name", "%q is empty or used twice (\"default\" is the default class's)", cl.Name)
		case cl.MaxCount < 1:
			return bad(at+".max_count", "%d is below 1", cl.MaxCount)
		case cl.MaxLifetime <= 0:
			return bad(at+".max_lifetime", "must be positive")
		case len(cl.Types) == 0:
			return bad(at+".types", "class %s names no message type", cl.Name)
		}
		names[cl.Name] = true
		for _, s := range cl.Types {
			t, err := message.ParseType(s)
			if err != nil {
				return bad(at+".types", "%v", err)
			}
			if other, dup := typed[t]; dup {
				return bad(at+".types", "%s is in classes %s and %s", t, other, cl.Name)
			}
			typed[t] = cl.Name
			if t.Name == "Import" {
				importLife, importCount, importClass = cl.MaxLifetime, cl.MaxCount, at
			}
		}
	}
	switch {
	case c.Meta.ImportJobRetention < 2*importLife:
		// An idempotency key lives as long as its tombstone; the job it
		// names must outlive it, or a retry inside the window finds the
		// job gone (the reference system documented this coupling only).
		return bad("meta.import_job_retention", "%v is shorter than twice %s.max_lifetime (%v): retries inside the idempotency window could find their import job deleted",
			c.Meta.ImportJobRetention.D(), importClass, importLife.D())
	case importCount < c.Meta.MaxImportJobNum:
		return bad(importClass+".max_count", "%d is below meta.max_import_job_num (%d): a burst of imports could evict the key of one still running, and its retry would start a second import",
			importCount, c.Meta.MaxImportJobNum)
	}
	return nil
}

// skipTypes returns replication.skip_types, checked: each a type name
// <name>.v<version>, named once.
func (c Config) skipTypes() ([]message.Type, error) {
	var out []message.Type
	for i, s := range c.Replication.SkipTypes {
		t, err := message.ParseType(s)
		if err != nil {
			return nil, fmt.Errorf("%w: replication.skip_types[%d]: %v", ErrConfig, i, err)
		}
		if slices.Contains(out, t) {
			return nil, fmt.Errorf("%w: replication.skip_types[%d]: %s is named twice", ErrConfig, i, t)
		}
		out = append(out, t)
	}
	return out, nil
}

// retentionClasses returns the classes as the engine takes them.
func (c Config) retentionClasses() []broadcast.RetentionClass {
	var out []broadcast.RetentionClass
	for _, cl := range c.Broadcast.Tombstone.Classes {
		rc := broadcast.RetentionClass{Name: cl.Name, MaxCount: cl.MaxCount, MaxLifetime: cl.MaxLifetime.D()}
		for _, s := range cl.Types {
			if t, err := message.ParseType(s); err == nil {
				rc.Types = append(rc.Types, t)
			}
		}
		out = append(out, rc)
	}
	return out
}

// YAML returns the configuration as a YAML document, as `walcast config
// print` shows it.
func (c Config) YAML() ([]byte, error) { return yamlv3.Marshal(c) }

// kafkaTopicPrefix reports whether p can prefix Kafka topic names: 1 to 200
// bytes (room for the lane's name within Kafka's 249) of [A-Za-z0-9._-].
func kafkaTopicPrefix(p string) bool {
	if len(p) < 1 || len(p) > 200 {
		return false
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
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
