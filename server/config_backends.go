package server

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/walcast/walcast/message"
	walkafka "github.com/walcast/walcast/wal/kafka"
	walnats "github.com/walcast/walcast/wal/nats"
)

// The sections of the settings of walcast's backends: the catalog (etcd)
// and the WAL (NATS JetStream or Kafka).

// CatalogConfig is the catalog, an etcd cluster (section catalog).
type CatalogConfig struct {
	// Endpoints of an external etcd cluster; empty runs an embedded
	// etcd in DataDir (standalone only).
	Endpoints []string `yaml:"endpoints"`
	// Prefix is prepended to every key walcast writes.
	Prefix string `yaml:"prefix"`
	// MaxTxnOps must not exceed the etcd server's --max-txn-ops.
	MaxTxnOps int `yaml:"max_txn_ops"`
	// MaxTxnBytes must not exceed the server's --max-request-bytes.
	MaxTxnBytes int `yaml:"max_txn_bytes"`
	// DialTimeout bounds connecting to the etcd cluster.
	DialTimeout Duration `yaml:"dial_timeout"`
	// KeepaliveTime and KeepaliveTimeout are the client's gRPC
	// keepalive pings: a member that stops answering (a hung machine,
	// a partition) is given up after their sum and the client moves
	// to another endpoint. Keep the sum below election.ttl, so that a
	// leader's lease survives a member's loss; etcd refuses pings
	// more often than every 5s by default.
	KeepaliveTime Duration `yaml:"keepalive_time"`
	// KeepaliveTimeout is how long a keepalive ping waits for its answer.
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
	// AttemptTimeout bounds one attempt of an etcd call of a
	// coordinator: a member that does not answer within it (one cut
	// off from its peers that has not noticed yet) is asked no more
	// and the call goes to another member (SPEC R9.12). Every call
	// also requires the member to know a leader, and the client only
	// calls the members whose reads answer (probed every 500ms).
	AttemptTimeout Duration `yaml:"attempt_timeout"`
	// TLS of the connections to etcd (https:// endpoints).
	TLS ClientTLS `yaml:"tls"`
	// Username and PasswordFile authenticate to etcd (etcd auth);
	// the password is read from the file, never from the config.
	Username string `yaml:"username"`
	// PasswordFile holds Username's password.
	PasswordFile string `yaml:"password_file"`
}

// WALConfig is the write-ahead log (section wal).
type WALConfig struct {
	// Kind is "nats" or "kafka".
	Kind string `yaml:"kind"`
	// PChannels is the number of pchannels, named <prefix>0 ...
	PChannels int `yaml:"pchannels"`
	// PChannelPrefix starts every pchannel's name.
	PChannelPrefix string `yaml:"pchannel_prefix"`
	// Lanes is how many backend channels (JetStream streams, Kafka
	// topics) the pchannels are folded into; copies for the pchannels
	// of one lane share entries, so one durable write serves them all.
	// 0 gives every pchannel its own lane. Replicated clusters must use
	// the same pchannels and lanes.
	Lanes int `yaml:"lanes"`
	// NATS is the WAL on NATS JetStream.
	NATS NATSConfig `yaml:"nats"`
	// Kafka is the WAL on Kafka.
	Kafka KafkaConfig `yaml:"kafka"`
}

// NATSConfig is the WAL on NATS JetStream (section wal.nats).
type NATSConfig struct {
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
	SyncAlways bool `yaml:"sync_always"`
	// Replicas is how many replicas the streams walcast creates have: 1,
	// 3 or 5.
	Replicas int `yaml:"replicas"`
	// DedupWindow is the streams' duplicate window, in which a retried
	// append with the same id is written once.
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
	// CredsFile and the keys below are credentials, at most one kind: a
	// creds file (JWT and nkey seed), an nkey seed file, or a user and
	// password file.
	CredsFile string `yaml:"creds_file"`
	// NKeyFile is an nkey seed file.
	NKeyFile string `yaml:"nkey_file"`
	// User authenticates with the password in PasswordFile.
	User string `yaml:"user"`
	// PasswordFile holds User's password.
	PasswordFile string `yaml:"password_file"`
}

// KafkaConfig is the WAL on Kafka (section wal.kafka).
type KafkaConfig struct {
	// Brokers are the Kafka cluster's seed brokers.
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
	TLS ClientTLS `yaml:"tls"`
	// SASL authenticates to the brokers.
	SASL SASLConfig `yaml:"sasl"`
}

// SASLConfig is Kafka's SASL authentication (section wal.kafka.sasl).
type SASLConfig struct {
	// Mechanism is "", PLAIN, SCRAM-SHA-256 or
	// SCRAM-SHA-512.
	Mechanism string `yaml:"mechanism"`
	// User authenticates with the password in PasswordFile.
	User string `yaml:"user"`
	// PasswordFile holds User's password.
	PasswordFile string `yaml:"password_file"`
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
	// KeyFile is the key of CertFile.
	KeyFile string `yaml:"key_file"`
	// ServerName overrides the name the server's certificate is checked
	// against.
	ServerName string `yaml:"server_name"`
}

// On reports whether the connection uses TLS.
func (t ClientTLS) On() bool { return t != ClientTLS{} }

// validate checks the TLS of the connection configured at key.
func (t ClientTLS) validate(key string) error {
	if (t.CertFile == "") != (t.KeyFile == "") {
		return badSetting(key, "cert_file and key_file go together")
	}
	return nil
}

func defaultCatalogConfig() CatalogConfig {
	return CatalogConfig{
		Prefix:           "walcast/",
		MaxTxnOps:        128,
		MaxTxnBytes:      1536 << 10,
		DialTimeout:      Duration(5 * time.Second),
		KeepaliveTime:    Duration(5 * time.Second),
		KeepaliveTimeout: Duration(3 * time.Second),
		CommitTimeout:    Duration(5 * time.Second),
		AttemptTimeout:   Duration(2 * time.Second), // etcd.DefaultAttemptTimeout
	}
}

func defaultWALConfig() WALConfig {
	return WALConfig{
		Kind:           "nats",
		PChannels:      4,
		PChannelPrefix: "wal-",
		Lanes:          1,
		NATS: NATSConfig{
			SyncAlways:   true,
			Replicas:     1,
			DedupWindow:  Duration(10 * time.Minute),
			StreamPrefix: walnats.DefaultStreamPrefix,
		},
		Kafka: KafkaConfig{TopicPrefix: walkafka.DefaultTopicPrefix, ReplicationFactor: 3},
	}
}

// Validate checks the catalog's settings and credentials.
func (c CatalogConfig) Validate() error {
	switch {
	case c.MaxTxnOps < 2:
		return badSetting("catalog.max_txn_ops", "%d is below 2", c.MaxTxnOps)
	case c.DialTimeout <= 0:
		return badSetting("catalog.dial_timeout", "must be positive")
	case c.KeepaliveTime < Duration(time.Second) || c.KeepaliveTimeout < Duration(time.Second):
		return badSetting("catalog.keepalive_time", "keepalive_time (%v) and keepalive_timeout (%v) must be at least 1s", c.KeepaliveTime.D(), c.KeepaliveTimeout.D())
	case c.CommitTimeout < Duration(100*time.Millisecond):
		return badSetting("catalog.commit_timeout", "%v is below 100ms", c.CommitTimeout.D())
	case c.AttemptTimeout < Duration(100*time.Millisecond):
		return badSetting("catalog.attempt_timeout", "%v is below 100ms", c.AttemptTimeout.D())
	case c.AutoSyncInterval < 0:
		return badSetting("catalog.auto_sync_interval", "%v is negative", c.AutoSyncInterval.D())
	case (c.Username == "") != (c.PasswordFile == ""):
		return badSetting("catalog.username", "username and password_file go together")
	}
	return c.TLS.validate("catalog.tls")
}

// Validate checks the WAL's settings, its backends' and their
// credentials.
func (w WALConfig) Validate() error {
	switch {
	case w.Kind != "nats" && w.Kind != "kafka":
		return badSetting("wal.kind", "%q is not nats or kafka", w.Kind)
	case w.PChannels < 1 || w.PChannels > 1024:
		return badSetting("wal.pchannels", "%d is outside 1..1024", w.PChannels)
	case w.Lanes < 0:
		return badSetting("wal.lanes", "%d is negative", w.Lanes)
	case w.Kind == "kafka" && len(w.Kafka.Brokers) == 0:
		return badSetting("wal.kafka.brokers", "required when wal.kind is kafka")
	}
	// The longest pchannel name decides whether every name is valid.
	if err := message.PChannel(fmt.Sprintf("%s%d", w.PChannelPrefix, w.PChannels-1)).Validate(); err != nil {
		return badSetting("wal.pchannel_prefix", "%q makes invalid pchannel names: %v", w.PChannelPrefix, err)
	}
	if err := w.NATS.Validate(); err != nil {
		return err
	}
	return w.Kafka.Validate()
}

// Validate checks the NATS settings and credentials.
func (n NATSConfig) Validate() error {
	kinds := 0
	for _, set := range []bool{n.CredsFile != "", n.NKeyFile != "", n.User != "" || n.PasswordFile != ""} {
		if set {
			kinds++
		}
	}
	switch {
	case n.Replicas != 1 && n.Replicas != 3 && n.Replicas != 5:
		return badSetting("wal.nats.replicas", "%d is not 1, 3 or 5", n.Replicas)
	case n.DedupWindow < Duration(time.Second):
		return badSetting("wal.nats.dedup_window", "%v is below 1s", n.DedupWindow.D())
	case len(n.StreamPrefix) < 1 || len(n.StreamPrefix) > 32 || message.PChannel(n.StreamPrefix).Validate() != nil:
		return badSetting("wal.nats.stream_prefix", "%q must be 1 to 32 bytes of [A-Za-z0-9_-]", n.StreamPrefix)
	case kinds > 1:
		return badSetting("wal.nats", "set one kind of credentials: creds_file, nkey_file, or user and password_file")
	case (n.User == "") != (n.PasswordFile == ""):
		return badSetting("wal.nats.user", "user and password_file go together")
	}
	return n.TLS.validate("wal.nats.tls")
}

// Validate checks the Kafka settings and credentials.
func (k KafkaConfig) Validate() error {
	sasl := k.SASL
	switch {
	case !kafkaTopicPrefix(k.TopicPrefix):
		return badSetting("wal.kafka.topic_prefix", "%q must be 1 to 200 bytes of [A-Za-z0-9._-]", k.TopicPrefix)
	case k.ReplicationFactor < 0 || k.ReplicationFactor > math.MaxInt16:
		return badSetting("wal.kafka.replication_factor", "%d is outside 0..%d (0: the brokers' default)", k.ReplicationFactor, math.MaxInt16)
	case k.MinInsyncReplicas < 0 || k.ReplicationFactor > 0 && k.MinInsyncReplicas > k.ReplicationFactor:
		return badSetting("wal.kafka.min_insync_replicas", "%d is outside 0..replication_factor (%d): no append could succeed", k.MinInsyncReplicas, k.ReplicationFactor)
	case !slices.Contains([]string{"", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}, sasl.Mechanism):
		return badSetting("wal.kafka.sasl.mechanism", "%q is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", sasl.Mechanism)
	case sasl.Mechanism != "" && (sasl.User == "" || sasl.PasswordFile == ""):
		return badSetting("wal.kafka.sasl", "mechanism %s needs user and password_file", sasl.Mechanism)
	case sasl.Mechanism == "" && (sasl.User != "" || sasl.PasswordFile != ""):
		return badSetting("wal.kafka.sasl.mechanism", "user and password_file need a mechanism")
	}
	return k.TLS.validate("wal.kafka.tls")
}

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
