package server

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
)

// The sections of the settings of the broadcaster and what rides on it:
// its limits, backoff and transactions, the tombstones that keep
// idempotency keys, the replicator's skipped types, and the metadata
// service's settings.

// BroadcastConfig is the broadcaster (section broadcast).
type BroadcastConfig struct {
	// ConcurrencyRatio × CPUs bounds concurrent appends.
	ConcurrencyRatio float64 `yaml:"concurrency_ratio"`
	// Backoff spaces the retries of failed appends and callbacks.
	Backoff BackoffConfig `yaml:"backoff"`
	// Tombstone keeps finished tasks, and so their idempotency keys.
	Tombstone TombstoneConfig `yaml:"tombstone"`
	// MaxKeyLength bounds new client idempotency keys, in bytes.
	MaxKeyLength int `yaml:"max_key_length"`
	// MaxMessageBytes bounds one message's payload, in bytes.
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// Txn bounds broadcast transactions (R13.4).
	Txn TxnConfig `yaml:"txn"`
}

// BackoffConfig is the retry backoff (section broadcast.backoff).
type BackoffConfig struct {
	// Initial is the first retry's delay.
	Initial Duration `yaml:"initial"`
	// Multiplier grows the delay after each failure.
	Multiplier float64 `yaml:"multiplier"`
	// Max bounds the delay.
	Max Duration `yaml:"max"`
}

// TombstoneConfig is how long finished tasks, and with them their
// idempotency keys, are kept (section broadcast.tombstone; R6).
type TombstoneConfig struct {
	// MaxLifetime is the age beyond which a tombstone is collected.
	MaxLifetime Duration `yaml:"max_lifetime"`
	// MaxCount is how many tombstones of the default class are kept, the
	// newest.
	MaxCount int `yaml:"max_count"`
	// CheckInterval is how often tombstones are collected.
	CheckInterval Duration `yaml:"check_interval"`
	// Classes are retention classes of their own for some message
	// types (R6.4): a burst of one class never evicts another's
	// tombstones. Types in none share the default class above. A
	// configured list replaces the default one (the metadata
	// service's import class) whole.
	Classes []RetentionClass `yaml:"classes"`
}

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

// TxnConfig bounds broadcast transactions (section broadcast.txn; R13.4).
// 0: the engine's default (64, or the catalog's transaction ops less two;
// 256 KiB; 128).
type TxnConfig struct {
	// MaxMembers bounds a transaction's members, Begin and end included;
	// the last is kept for the end, beyond it a body fails with TXN_FULL.
	MaxMembers int `yaml:"max_members"`
	// MaxMemberBytes bounds a member's payload bytes.
	MaxMemberBytes int `yaml:"max_member_bytes"`
	// MaxVChannels bounds a transaction's targets, the control channel
	// included.
	MaxVChannels int `yaml:"max_vchannels"`
}

// ReplicationConfig is this cluster's replicator (section replication).
type ReplicationConfig struct {
	// SkipTypes are message types (<name>.v<version>) this cluster's
	// replicator, while it is a secondary, does not copy from its
	// primary (R13.14): a per-type replication policy on top of the
	// types that are local-only anyway (R13.13). A skipped broadcast
	// never reaches this cluster: skip only types whose effect this
	// cluster must not have, never a transaction's members.
	SkipTypes []string `yaml:"skip_types"`
	// Peers are the API addresses (host:port, or http:// and https://
	// URLs) of the other clusters of this cluster's replication topology.
	// A primary asks them, when it starts to lead and every few seconds,
	// whether one of them was force-promoted over it (R8.5), and learns
	// which of them are its secondaries: a secondary it learned of must
	// answer before a restarted primary accepts DDL
	// (replication.unreachable_secondaries).
	Peers []string `yaml:"peers"`
	// PeerTokenFile holds a token (of the reader role) this cluster sends
	// to its peers' APIs when they need authentication.
	PeerTokenFile string `yaml:"peer_token_file"`
	// PeerCAFile is the CA bundle of the peers' API certificates: set it
	// when they serve TLS (addresses without a scheme then mean https://).
	PeerCAFile string `yaml:"peer_ca_file"`
	// UnreachableSecondaries is what a primary does while it cannot
	// confirm that none of its secondaries (those its topology names, and
	// those it learned from its peers) was promoted over it, because they
	// do not answer: "refuse" (the default) refuses DDL until one answers
	// each; "accept" accepts DDL, with a warning in its log, at the risk of
	// two primaries.
	UnreachableSecondaries string `yaml:"unreachable_secondaries"`
}

// Policies of replication.unreachable_secondaries.
const (
	RefuseUnconfirmed = "refuse"
	AcceptUnconfirmed = "accept"
)

// MetaConfig is the metadata service's settings (section meta), which the
// walcast command gives the service it runs.
type MetaConfig struct {
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
}

func defaultBroadcastConfig() BroadcastConfig {
	bo := broadcast.Backoff{}.WithDefaults()
	return BroadcastConfig{
		ConcurrencyRatio: 4,
		Backoff:          BackoffConfig{Initial: Duration(bo.Initial), Multiplier: bo.Multiplier, Max: Duration(bo.Max)},
		Tombstone: TombstoneConfig{
			MaxLifetime:   Duration(24 * time.Hour),
			MaxCount:      8192,
			CheckInterval: Duration(5 * time.Minute),
			Classes: []RetentionClass{{Name: ImportClass, Types: []string{"Import.v1"},
				MaxCount: 8192, MaxLifetime: Duration(24 * time.Hour)}},
		},
		MaxKeyLength:    message.DefaultMaxKeyLength,
		MaxMessageBytes: 256 << 10,
	}
}

func defaultMetaConfig() MetaConfig {
	return MetaConfig{MaxImportJobNum: 1024, ImportJobRetention: Duration(48 * time.Hour), CollectionShards: 2}
}

// Validate checks the broadcaster's settings; the limits that depend on the
// catalog's and the API's are checked by Config.Validate.
func (b BroadcastConfig) Validate() error {
	switch {
	case b.ConcurrencyRatio <= 0:
		return badSetting("broadcast.concurrency_ratio", "%v must be positive", b.ConcurrencyRatio)
	case b.Backoff.Initial <= 0 || b.Backoff.Max < b.Backoff.Initial:
		return badSetting("broadcast.backoff", "need 0 < initial (%v) <= max (%v)", b.Backoff.Initial.D(), b.Backoff.Max.D())
	case b.Backoff.Multiplier < 1:
		return badSetting("broadcast.backoff.multiplier", "%v is below 1", b.Backoff.Multiplier)
	case b.Txn.MaxMemberBytes < 0:
		return badSetting("broadcast.txn.max_member_bytes", "%d is negative", b.Txn.MaxMemberBytes)
	case b.Txn.MaxVChannels != 0 && b.Txn.MaxVChannels < 2:
		return badSetting("broadcast.txn.max_vchannels", "%d: need 0 (the default) or at least 2 (a target and the control channel)", b.Txn.MaxVChannels)
	case b.MaxKeyLength < 1:
		return badSetting("broadcast.max_key_length", "%d is below 1", b.MaxKeyLength)
	case b.MaxMessageBytes < 1024:
		return badSetting("broadcast.max_message_bytes", "%d is below 1 KiB", b.MaxMessageBytes)
	}
	return b.Tombstone.Validate()
}

// Validate checks the tombstone settings and the retention classes.
func (t TombstoneConfig) Validate() error {
	switch {
	case t.MaxLifetime <= 0:
		return badSetting("broadcast.tombstone.max_lifetime", "must be positive")
	case t.MaxCount < 1:
		return badSetting("broadcast.tombstone.max_count", "%d is below 1", t.MaxCount)
	case t.CheckInterval <= 0:
		return badSetting("broadcast.tombstone.check_interval", "must be positive")
	}
	names := map[string]bool{"default": true}
	typed := map[message.Type]string{}
	for i, cl := range t.Classes {
		at := fmt.Sprintf("broadcast.tombstone.classes[%d]", i)
		switch {
		case cl.Name == "" || names[cl.Name]:
			return badSetting(at+".name", "%q is empty or used twice (\"default\" is the default class's)", cl.Name)
		case cl.MaxCount < 1:
			return badSetting(at+".max_count", "%d is below 1", cl.MaxCount)
		case cl.MaxLifetime <= 0:
			return badSetting(at+".max_lifetime", "must be positive")
		case len(cl.Types) == 0:
			return badSetting(at+".types", "class %s names no message type", cl.Name)
		}
		names[cl.Name] = true
		for _, s := range cl.Types {
			t, err := message.ParseType(s)
			if err != nil {
				return badSetting(at+".types", "%v", err)
			}
			if other, dup := typed[t]; dup {
				return badSetting(at+".types", "%s is in classes %s and %s", t, other, cl.Name)
			}
			typed[t] = cl.Name
		}
	}
	return nil
}

// importWindow is the retention of the metadata service's import keys: the
// lifetime and count of the class of Import.v1 (the default class's if
// none has it), and the setting that holds them.
func (t TombstoneConfig) importWindow() (life Duration, count int, setting string) {
	life, count, setting = t.MaxLifetime, t.MaxCount, "broadcast.tombstone"
	for i, cl := range t.Classes {
		for _, s := range cl.Types {
			if ty, err := message.ParseType(s); err == nil && ty.Name == "Import" {
				life, count, setting = cl.MaxLifetime, cl.MaxCount, fmt.Sprintf("broadcast.tombstone.classes[%d]", i)
			}
		}
	}
	return life, count, setting
}

// Validate checks the replication settings.
func (r ReplicationConfig) Validate() error {
	if _, err := r.skipTypes(); err != nil {
		return err
	}
	for i, p := range r.Peers {
		if strings.TrimSpace(p) == "" || strings.ContainsAny(p, " \t") {
			return badSetting(fmt.Sprintf("replication.peers[%d]", i), "%q is not an API address (host:port or an http:// or https:// URL)", p)
		}
	}
	switch r.UnreachableSecondaries {
	case RefuseUnconfirmed, AcceptUnconfirmed:
	default:
		return badSetting("replication.unreachable_secondaries", "%q is neither %q nor %q", r.UnreachableSecondaries, RefuseUnconfirmed, AcceptUnconfirmed)
	}
	return nil
}

// skipTypes returns replication.skip_types, checked: each a type name
// <name>.v<version>, named once.
func (r ReplicationConfig) skipTypes() ([]message.Type, error) {
	var out []message.Type
	for i, s := range r.SkipTypes {
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

// Validate checks the metadata service's settings; their coupling with the
// import class's tombstones is checked by Config.Validate.
func (m MetaConfig) Validate() error {
	switch {
	case m.MaxImportJobNum < 1:
		return badSetting("meta.max_import_job_num", "%d is below 1", m.MaxImportJobNum)
	case m.CollectionShards < 1 || m.CollectionShards > 256:
		return badSetting("meta.collection_shards", "%d is outside 1..256", m.CollectionShards)
	}
	return nil
}

// retentionClasses returns the classes as the engine takes them.
func (t TombstoneConfig) retentionClasses() []broadcast.RetentionClass {
	var out []broadcast.RetentionClass
	for _, cl := range t.Classes {
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
