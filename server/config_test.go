package server

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestR9_7_DefaultsAreValid(t *testing.T) {
	c, err := Load("", nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, Default()) {
		t.Fatalf("Load with nothing set differs from Default()")
	}
	// SPEC defaults, by name.
	if c.Broadcast.Tombstone.MaxLifetime.D() != 24*time.Hour || c.Broadcast.Tombstone.MaxCount != 8192 ||
		c.Broadcast.Tombstone.CheckInterval.D() != 5*time.Minute || c.Broadcast.ConcurrencyRatio != 4 ||
		c.Broadcast.Backoff.Initial.D() != 10*time.Millisecond || c.Broadcast.Backoff.Max.D() != 10*time.Second ||
		c.Broadcast.MaxKeyLength != 256 || c.WAL.PChannels != 4 || c.Nodes.Count != 2 || c.DataDir != "./walcast-data" {
		t.Fatalf("defaults %+v", c)
	}
}

func TestR9_7_FileEnvFlagsPrecedence(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "walcast.yaml")
	yml := "data_dir: /from/file\nbroadcast:\n  tombstone:\n    max_count: 100\n    max_lifetime: 2h\napi:\n  addr: 127.0.0.1:1\n"
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"WALCAST_BROADCAST_TOMBSTONE_MAX_COUNT=200", "WALCAST_CATALOG_ENDPOINTS=http://a:2379, http://b:2379", "HOME=/x"}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.String("data-dir", "./walcast-data", "")
	fs.String("api-addr", "", "")
	if err := fs.Parse([]string{"--data-dir=/from/flag"}); err != nil {
		t.Fatal(err)
	}
	keyOf := func(f string) string { return map[string]string{"data-dir": "data_dir", "api-addr": "api.addr"}[f] }
	c, err := Load(path, env, fs, keyOf)
	if err != nil {
		t.Fatal(err)
	}
	if c.DataDir != "/from/flag" {
		t.Errorf("data_dir %q: flags must win", c.DataDir)
	}
	if c.Broadcast.Tombstone.MaxCount != 200 {
		t.Errorf("max_count %d: env must beat the file", c.Broadcast.Tombstone.MaxCount)
	}
	if c.Broadcast.Tombstone.MaxLifetime.D() != 2*time.Hour || c.API.Addr != "127.0.0.1:1" {
		t.Errorf("file values lost: %+v", c)
	}
	if !reflect.DeepEqual(c.Catalog.Endpoints, []string{"http://a:2379", "http://b:2379"}) {
		t.Errorf("endpoints %q", c.Catalog.Endpoints)
	}
	if c.Broadcast.Tombstone.CheckInterval.D() != 5*time.Minute {
		t.Error("unset value lost its default")
	}
}

func TestR9_7_InvalidSettingsNameTheSetting(t *testing.T) {
	cases := []struct {
		env  string
		want string
	}{
		{"WALCAST_BROADCAST_TOMBSTONE_MAX_COUNT=0", "broadcast.tombstone.max_count"},
		{"WALCAST_WAL_KIND=pulsar", "wal.kind"},
		{"WALCAST_LOG_LEVEL=loud", "log.level"},
		{"WALCAST_BROADCAST_BACKOFF_INITIAL=-1s", "broadcast.backoff"},
		// The coupling: import jobs kept less than twice their keys' window
		// (the import class's, R6.4).
		{"WALCAST_META_IMPORT_JOB_RETENTION=47h", "meta.import_job_retention"},
		{"WALCAST_META_MAX_IMPORT_JOB_NUM=9000", "classes[0].max_count"},
		{"WALCAST_BROADCAST_MAX_MESSAGE_BYTES=4000000", "broadcast.max_message_bytes"},
		{"WALCAST_NODES_PCHANNELS=0,9", "nodes.pchannels"},
		{"WALCAST_TOMBSTONE_MAX_COUNT=5", "WALCAST_TOMBSTONE_MAX_COUNT"}, // typo
		{"WALCAST_BROADCAST_TOMBSTONE_MAX_LIFETIME=soon", "max_lifetime"},
	}
	for _, c := range cases {
		_, err := Load("", []string{c.env}, nil, nil)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %s", c.env, err, c.want)
		}
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "bad.yaml")
	_ = os.WriteFile(path, []byte("broadcast:\n  tombstone:\n    max_cuont: 3\n"), 0o600)
	if _, err := Load(path, nil, nil, nil); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "max_cuont") {
		t.Errorf("unknown key in file: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml"), nil, nil, nil); !errors.Is(err, ErrConfig) {
		t.Errorf("missing file: %v", err)
	}
}

// TestR9_7_InvalidNamesAndRangesNameTheSetting: settings that become a
// Kafka topic's replication factor (an int16), pchannel names and a node's
// state directory are refused at start, naming the setting, instead of
// wrapping, failing later or escaping data_dir.
func TestR9_7_InvalidNamesAndRangesNameTheSetting(t *testing.T) {
	cases := []struct {
		env  string
		want string
	}{
		{"WALCAST_WAL_KAFKA_REPLICATION_FACTOR=70000", "wal.kafka.replication_factor"},
		{"WALCAST_WAL_KAFKA_REPLICATION_FACTOR=-1", "wal.kafka.replication_factor"},
		{"WALCAST_WAL_PCHANNEL_PREFIX=wal/", "wal.pchannel_prefix"},
		{"WALCAST_WAL_PCHANNEL_PREFIX=" + strings.Repeat("p", 64), "wal.pchannel_prefix"},
		{"WALCAST_NODES_NAME=..", "nodes.name"},
		{"WALCAST_NODES_NAME=../../etc", "nodes.name"},
		{"WALCAST_NODES_NAME=a/b", "nodes.name"},
		{"WALCAST_STANDALONE_ETCD_QUOTA_BYTES=1048576", "standalone.etcd_quota_bytes"},
		{"WALCAST_STANDALONE_ETCD_QUOTA_BYTES=17179869184", "standalone.etcd_quota_bytes"},
		{"WALCAST_STANDALONE_MEMORY_LIMIT=1048576", "standalone.memory_limit"},
		{"WALCAST_STANDALONE_MEMORY_LIMIT=-1", "standalone.memory_limit"},
		{"WALCAST_STANDALONE_ETCD_MAX_TXN_OPS=63", "standalone.etcd_max_txn_ops"},
	}
	for _, c := range cases {
		_, err := Load("", []string{c.env}, nil, nil)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %s", c.env, err, c.want)
		}
	}
	// Valid values at the edges pass.
	for _, env := range [][]string{{"WALCAST_WAL_KAFKA_REPLICATION_FACTOR=0"}, {"WALCAST_WAL_KAFKA_REPLICATION_FACTOR=32767"},
		{"WALCAST_WAL_PCHANNEL_PREFIX=" + strings.Repeat("p", 63)}, {"WALCAST_NODES_NAME=node-1.a"},
		{"WALCAST_STANDALONE_ETCD_QUOTA_BYTES=67108864"}, {"WALCAST_STANDALONE_ETCD_QUOTA_BYTES=8589934592"},
		{"WALCAST_STANDALONE_ETCD_MAX_TXN_OPS=64"},
		{"WALCAST_STANDALONE_MEMORY_LIMIT=0"}, {"WALCAST_STANDALONE_MEMORY_LIMIT=67108864"}} {
		if _, err := Load("", env, nil, nil); err != nil {
			t.Errorf("%s: %v", env, err)
		}
	}
}

func TestR9_7_PrintedConfigLoadsBack(t *testing.T) {
	c := Default()
	c.Broadcast.Tombstone.MaxCount = 77
	c.Catalog.Endpoints = []string{"http://x:2379"}
	y, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(y), "max_lifetime: 24h0m0s") {
		t.Fatalf("durations not printed as durations:\n%s", y)
	}
	path := filepath.Join(t.TempDir(), "printed.yaml")
	if err := os.WriteFile(path, y, 0o600); err != nil {
		t.Fatal(err)
	}
	back, err := Load(path, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	y2, err := back.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if string(y2) != string(y) || back.Broadcast.Tombstone.MaxCount != 77 {
		t.Fatalf("printed config loads back differently:\n%s\n---\n%s", y, y2)
	}
}

// TestR9_8_NonLoopbackNeedsTLSAndAuth: an API on an address other than
// loopback refuses to start without TLS and authentication, naming the
// settings, unless api.insecure says so; loopback runs as before.
func TestR9_8_NonLoopbackNeedsTLSAndAuth(t *testing.T) {
	with := func(mod func(*Config)) error {
		c := Default()
		mod(&c)
		return c.Validate()
	}
	for _, addr := range []string{"127.0.0.1:7070", "[::1]:7070", "localhost:7070", "127.0.0.2:0"} {
		if err := with(func(c *Config) { c.API.Addr = addr }); err != nil {
			t.Errorf("%s: %v", addr, err)
		}
	}
	for _, addr := range []string{"0.0.0.0:7070", ":7070", "10.0.0.11:7070", "[::]:7070", "walcast.example:7070"} {
		err := with(func(c *Config) { c.API.Addr = addr })
		if !errors.Is(err, ErrConfig) {
			t.Errorf("%s without TLS and auth: %v", addr, err)
			continue
		}
		for _, key := range []string{"api.addr", "api.tls.cert_file", "api.auth.token_file", "api.tls.client_ca_file", "api.insecure"} {
			if !strings.Contains(err.Error(), key) {
				t.Errorf("%s: error does not name %s: %v", addr, key, err)
			}
		}
	}
	ok := map[string]func(*Config){
		"insecure": func(c *Config) { c.API.Insecure = true },
		"TLS and tokens": func(c *Config) {
			c.API.TLS.CertFile, c.API.TLS.KeyFile, c.API.Auth.TokenFile = "s.crt", "s.key", "tokens.json"
		},
		"TLS and client certificates": func(c *Config) {
			c.API.TLS.CertFile, c.API.TLS.KeyFile, c.API.TLS.ClientCAFile = "s.crt", "s.key", "ca.crt"
		},
		"secure standalone": func(c *Config) { c.API.Secure = true },
	}
	for name, mod := range ok {
		if err := with(func(c *Config) { c.API.Addr = "0.0.0.0:7070"; mod(c) }); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, mod := range map[string]func(*Config){
		"tokens without TLS": func(c *Config) { c.API.Auth.TokenFile = "tokens.json" },
		"TLS without auth":   func(c *Config) { c.API.TLS.CertFile, c.API.TLS.KeyFile = "s.crt", "s.key" },
	} {
		if err := with(func(c *Config) { c.API.Addr = "0.0.0.0:7070"; mod(c) }); !errors.Is(err, ErrConfig) {
			t.Errorf("%s on 0.0.0.0: %v", name, err)
		}
	}
}

func TestR9_8_SecuritySettingsNameTheSetting(t *testing.T) {
	for key, mod := range map[string]func(*Config){
		"api.tls":                     func(c *Config) { c.API.TLS.CertFile = "s.crt" },
		"api.tls.client_ca_file":      func(c *Config) { c.API.TLS.ClientCAFile = "ca.crt" },
		"api.tls.require_client_cert": func(c *Config) { c.API.TLS.RequireClientCert = true },
		"api.reload_interval":         func(c *Config) { c.API.ReloadInterval = Duration(time.Millisecond) },
		"api.secure":                  func(c *Config) { c.API.Secure = true; c.API.Auth.TokenFile = "t.json" },
		"metrics.tls":                 func(c *Config) { c.Metrics.TLS = true },
		"audit.file":                  func(c *Config) { c.Audit.File = "" },
		"catalog.tls":                 func(c *Config) { c.Catalog.TLS.KeyFile = "k" },
		"catalog.username":            func(c *Config) { c.Catalog.Username = "root" },
		"wal.nats":                    func(c *Config) { c.WAL.NATS.CredsFile, c.WAL.NATS.NKeyFile = "a", "b" },
		"wal.nats.user":               func(c *Config) { c.WAL.NATS.User = "u" },
		"wal.kafka.sasl.mechanism":    func(c *Config) { c.WAL.Kafka.SASL.Mechanism = "GSSAPI" },
		"wal.kafka.sasl":              func(c *Config) { c.WAL.Kafka.SASL.Mechanism = "PLAIN" },
		"nodes.tls":                   func(c *Config) { c.Nodes.TLS.CertFile = "c" },
	} {
		c := Default()
		mod(&c)
		err := c.Validate()
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: %v", key, err)
		}
	}
}

// TestR9_7_UnrelatedEnvironmentDoesNotStopAServer: the variables a
// Kubernetes Service named walcast injects into every pod, and the client
// commands' own, never stop a server; other unknown WALCAST_* variables are
// ignored with a warning unless they look like a misspelt setting, which
// is refused naming the setting meant.
func TestR9_7_UnrelatedEnvironmentDoesNotStopAServer(t *testing.T) {
	kube := []string{"WALCAST_PORT=tcp://10.96.0.12:7070", "WALCAST_PORT_7070_TCP=tcp://10.96.0.12:7070",
		"WALCAST_PORT_7070_TCP_ADDR=10.96.0.12", "WALCAST_PORT_7070_TCP_PORT=7070", "WALCAST_PORT_7070_TCP_PROTO=tcp",
		"WALCAST_SERVICE_HOST=10.96.0.12", "WALCAST_SERVICE_PORT=7070", "WALCAST_SERVICE_PORT_API=7070",
		"WALCAST_ADDR=10.0.0.1:7070", "WALCAST_CONTEXT=prod", "WALCAST_LOG_LEVEL=warn"}
	c, warnings, err := LoadWithWarnings("", kube, nil, nil)
	if err != nil || len(warnings) != 0 || c.Log.Level != "warn" {
		t.Fatalf("Kubernetes and client variables: %v, warnings %q, log level %q", err, warnings, c.Log.Level)
	}
	_, warnings, err = LoadWithWarnings("", []string{"WALCAST_HOME=/opt/walcast", "WALCAST_VERSION=1.2"}, nil, nil)
	if err != nil || len(warnings) != 2 || !strings.Contains(warnings[0], "WALCAST_HOME") || !strings.Contains(warnings[1], "WALCAST_VERSION") {
		t.Fatalf("unrelated variables: %v, warnings %q", err, warnings)
	}
	for env, meant := range map[string]string{
		"WALCAST_BROADCAST_TOMBSTONE_MAX_CONT=5": "WALCAST_BROADCAST_TOMBSTONE_MAX_COUNT", // close
		"WALCAST_TOMBSTONE_MAX_COUNT=5":          "WALCAST_BROADCAST_TOMBSTONE_MAX_COUNT", // a section missing
		"WALCAST_ELECTION_TIMEOUT=5s":            "WALCAST_ELECTION_TTL",                  // a settings section
		"WALCAST_LOG_LEVLE=debug":                "WALCAST_LOG_LEVEL",
	} {
		if _, _, err := LoadWithWarnings("", []string{env}, nil, nil); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), meant) {
			t.Errorf("%s: %v, want an error suggesting %s", env, err, meant)
		}
	}
}

// TestR9_7_EmbeddedPortsNextToTheAPI: standalone's embedded NATS and etcd
// listen next to the API port unless set, at random ports with a random API
// port, and bad addresses are refused naming the setting.
func TestR9_7_EmbeddedPortsNextToTheAPI(t *testing.T) {
	c := Default()
	if n, e, err := c.EmbeddedPorts(); err != nil || n != 7072 || e != 7073 {
		t.Fatalf("default: %d %d %v", n, e, err)
	}
	c.API.Addr = "127.0.0.1:0"
	if n, e, err := c.EmbeddedPorts(); err != nil || n != 0 || e != 0 {
		t.Fatalf("random API port: %d %d %v", n, e, err)
	}
	c.Standalone.NATSAddr, c.Standalone.EtcdAddr = "127.0.0.1:4222", "localhost:2379"
	if n, e, err := c.EmbeddedPorts(); err != nil || n != 4222 || e != 2379 {
		t.Fatalf("set: %d %d %v", n, e, err)
	}
	for _, env := range []string{"WALCAST_STANDALONE_NATS_ADDR=10.0.0.1:4222", "WALCAST_STANDALONE_ETCD_ADDR=2379",
		"WALCAST_STANDALONE_NATS_ADDR=127.0.0.1:99999", "WALCAST_API_ADDR=127.0.0.1:65534"} {
		if _, err := Load("", []string{env}, nil, nil); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "standalone.") {
			t.Errorf("%s: %v, want an error naming standalone.*", env, err)
		}
	}
}

// TestR6_4_RetentionClassesFromTheFile: the default configuration gives the
// metadata service's imports a class of their own; a file's classes replace
// it whole; bad classes and couplings that would end an import key's window
// before its import are refused, naming the setting.
func TestR6_4_RetentionClassesFromTheFile(t *testing.T) {
	def := Default()
	if cls := def.Broadcast.Tombstone.Classes; len(cls) != 1 || cls[0].Name != ImportClass || cls[0].Types[0] != "Import.v1" {
		t.Fatalf("default classes %+v, want the import class", cls)
	}
	load := func(t *testing.T, yml string) (Config, error) {
		t.Helper()
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
			t.Fatal(err)
		}
		return Load(path, nil, nil, nil)
	}
	c, err := load(t, `broadcast:
  tombstone:
    classes:
      - name: imports
        types: [Import.v1]
        max_count: 4096
        max_lifetime: 12h
      - name: rbac
        types: [CreateUser.v1, Grant.v1]
        max_count: 100
        max_lifetime: 1h
`)
	if err != nil {
		t.Fatal(err)
	}
	if cls := c.Broadcast.Tombstone.Classes; len(cls) != 2 || cls[0].Name != "imports" || cls[0].MaxCount != 4096 || cls[1].Types[1] != "Grant.v1" {
		t.Fatalf("classes %+v", cls)
	}
	for _, bad := range []struct{ yml, setting string }{
		{"broadcast:\n  tombstone:\n    classes:\n      - {name: default, types: [A.v1], max_count: 1, max_lifetime: 1h}\n", "classes[0].name"},
		{"broadcast:\n  tombstone:\n    classes:\n      - {name: a, types: [A.v1], max_count: 0, max_lifetime: 1h}\n", "classes[0].max_count"},
		{"broadcast:\n  tombstone:\n    classes:\n      - {name: a, types: [], max_count: 1, max_lifetime: 1h}\n", "classes[0].types"},
		{"broadcast:\n  tombstone:\n    classes:\n      - {name: a, types: [nope], max_count: 1, max_lifetime: 1h}\n", "classes[0].types"},
		{"broadcast:\n  tombstone:\n    classes:\n      - {name: a, types: [A.v1], max_count: 1, max_lifetime: 1h}\n      - {name: b, types: [A.v1], max_count: 1, max_lifetime: 1h}\n", "classes[1].types"},
		// The import class holds fewer keys than imports may run at once.
		{"broadcast:\n  tombstone:\n    classes:\n      - {name: i, types: [Import.v1], max_count: 10, max_lifetime: 1h}\n", "classes[0].max_count"},
		// The import jobs would be deleted inside their keys' window.
		{"broadcast:\n  tombstone:\n    classes:\n      - {name: i, types: [Import.v1], max_count: 9000, max_lifetime: 30h}\n", "meta.import_job_retention"},
	} {
		_, err := load(t, bad.yml)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), bad.setting) {
			t.Errorf("%q: %v, want an error naming %s", bad.yml, err, bad.setting)
		}
	}
}

// TestB13_StandaloneMemoryLimitYieldsToGOMEMLIMIT: standalone.memory_limit
// becomes the process's soft memory limit, unless GOMEMLIMIT set one, and 0
// sets none.
func TestB13_StandaloneMemoryLimitYieldsToGOMEMLIMIT(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })

	t.Setenv("GOMEMLIMIT", "")
	os.Unsetenv("GOMEMLIMIT")
	s := Default().Standalone
	if s.MemoryLimit != DefaultMemoryLimit {
		t.Fatalf("default standalone.memory_limit %d, want %d", s.MemoryLimit, DefaultMemoryLimit)
	}
	limit, from := s.ApplyMemoryLimit()
	if limit != DefaultMemoryLimit || from != "standalone.memory_limit" || debug.SetMemoryLimit(-1) != DefaultMemoryLimit {
		t.Errorf("applied %d from %q (in force %d), want %d from standalone.memory_limit", limit, from, debug.SetMemoryLimit(-1), DefaultMemoryLimit)
	}

	debug.SetMemoryLimit(math.MaxInt64)
	s.MemoryLimit = 0
	if limit, from := s.ApplyMemoryLimit(); limit != math.MaxInt64 || from != "" {
		t.Errorf("memory_limit 0: %d from %q, want no limit", limit, from)
	}

	// GOMEMLIMIT is read by the runtime as the process starts; the limit
	// it set is left alone.
	t.Setenv("GOMEMLIMIT", "3GiB")
	debug.SetMemoryLimit(3 << 30)
	s.MemoryLimit = 100 << 20
	if limit, from := s.ApplyMemoryLimit(); limit != 3<<30 || from != "GOMEMLIMIT" {
		t.Errorf("with GOMEMLIMIT: %d from %q, want GOMEMLIMIT's %d", limit, from, int64(3<<30))
	}
}
