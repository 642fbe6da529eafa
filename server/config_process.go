package server

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The sections of the settings of the process itself: the cluster it
// belongs to, its log, its streaming nodes, the coordinators' election and
// tracing.

// ClusterConfig is the cluster the process belongs to (section cluster).
type ClusterConfig struct {
	// Name names the cluster in replication topologies (SPEC §8).
	Name string `yaml:"name"`
}

// LogConfig is the process log (section log).
type LogConfig struct {
	// Level is debug, info, warn or error.
	Level string `yaml:"level"`
	// Format is json or text.
	Format string `yaml:"format"`
}

// NodesConfig is the streaming nodes (section nodes): standalone's, or
// the one a `walcast node` process runs.
type NodesConfig struct {
	// Count is how many streaming nodes a standalone process runs; the
	// pchannels are spread over them round robin.
	Count int `yaml:"count"`
	// Name and PChannels configure a `walcast node` process: which
	// pchannels (by index) it consumes.
	Name string `yaml:"name"`
	// PChannels are the indexes of the pchannels a `walcast node`
	// consumes.
	PChannels []int `yaml:"pchannels"`
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
}

// ElectionConfig is the coordinators' leader election (section election).
type ElectionConfig struct {
	// TTL is the coordinator lease: a dead leader is replaced after it.
	TTL Duration `yaml:"ttl"`
}

// TracingConfig is OpenTelemetry tracing (section tracing).
type TracingConfig struct {
	// Exporter is "none", "stdout" (JSON spans on stderr) or "otlp".
	Exporter string `yaml:"exporter"`
	// SamplingRatio is the share of new traces recorded (0..1); a
	// caller's sampled trace is always followed.
	SamplingRatio float64 `yaml:"sampling_ratio"`
	// InstanceID is the resource's service.instance.id; default
	// <hostname>/<pid>.
	InstanceID string `yaml:"instance_id"`
	// OTLP is the collector the otlp exporter sends to.
	OTLP OTLPConfig `yaml:"otlp"`
}

// OTLPConfig is the OTLP collector of tracing (section tracing.otlp).
type OTLPConfig struct {
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
	Insecure bool `yaml:"insecure"`
	// CAFile is the CA bundle the collector's certificate must chain to.
	CAFile string `yaml:"ca_file"`
}

func defaultLogConfig() LogConfig { return LogConfig{Level: "info", Format: "json"} }

func defaultTracingConfig() TracingConfig {
	return TracingConfig{Exporter: "none", SamplingRatio: 1, OTLP: OTLPConfig{Protocol: "grpc", Endpoint: "127.0.0.1:4317"}}
}

// Validate checks the cluster's name.
func (c ClusterConfig) Validate() error {
	if c.Name == "" || len(c.Name) > 64 {
		return badSetting("cluster.name", "must be 1 to 64 bytes")
	}
	return nil
}

// Validate checks the log's level and format.
func (l LogConfig) Validate() error {
	switch {
	case !slices.Contains([]string{"debug", "info", "warn", "error"}, l.Level):
		return badSetting("log.level", "%q is not debug, info, warn or error", l.Level)
	case l.Format != "json" && l.Format != "text":
		return badSetting("log.format", "%q is not json or text", l.Format)
	}
	return nil
}

// Validate checks the nodes' settings; the pchannel indexes are checked
// against wal.pchannels by Config.Validate.
func (n NodesConfig) Validate() error {
	switch g := n.GroupSize; {
	case n.Count < 0:
		return badSetting("nodes.count", "%d is negative", n.Count)
	case n.Name != "" && (n.Name == "." || n.Name == ".." || len(n.Name) > 255 || strings.ContainsAny(n.Name, "/\\\x00")):
		return badSetting("nodes.name", "%q must be a single path component (the node's state lives in data_dir/nodes/<name>): no '/', '\\', and not '.' or '..'", n.Name)
	case g < 0:
		return badSetting("nodes.group_size", "%d is negative", g)
	case g > 0 && len(n.PChannels) > 0:
		return badSetting("nodes.group_size", "set nodes.pchannels or nodes.group_size, not both")
	}
	return n.TLS.validate("nodes.tls")
}

// Validate checks the election's lease.
func (e ElectionConfig) Validate() error {
	if e.TTL < Duration(2*time.Second) {
		return badSetting("election.ttl", "%v is below 2s", e.TTL.D())
	}
	return nil
}

// Validate checks the tracing settings.
func (t TracingConfig) Validate() error {
	switch {
	case t.Exporter != "none" && t.Exporter != "stdout" && t.Exporter != "otlp":
		return badSetting("tracing.exporter", "%q is not none, stdout or otlp", t.Exporter)
	case t.SamplingRatio < 0 || t.SamplingRatio > 1 || math.IsNaN(t.SamplingRatio):
		return badSetting("tracing.sampling_ratio", "%v is outside 0..1", t.SamplingRatio)
	case t.OTLP.Protocol != "grpc" && t.OTLP.Protocol != "http":
		return badSetting("tracing.otlp.protocol", "%q is not grpc or http", t.OTLP.Protocol)
	case t.Exporter == "otlp" && t.OTLP.Endpoint == "":
		return badSetting("tracing.otlp.endpoint", "required when tracing.exporter is otlp (the collector's host:port)")
	case t.OTLP.Insecure && t.OTLP.CAFile != "":
		return badSetting("tracing.otlp.ca_file", "set with tracing.otlp.insecure: choose TLS or not")
	}
	if _, err := otlpHeaders(t.OTLP.Headers); err != nil {
		return badSetting("tracing.otlp.headers", "%v", err)
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
