package server

import (
	"strings"
	"time"
)

// The sections of the settings a process serves with: its API, the
// metrics address, the audit log and the operator console.

// APIConfig is the coordinator API (section api): where it listens, how
// much it admits, and how callers are authenticated (R9.8).
type APIConfig struct {
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
	MaxInFlight int `yaml:"max_in_flight"`
	// MaxQueued is how many calls beyond MaxInFlight wait for a slot.
	MaxQueued int `yaml:"max_queued"`
	// QueueTimeout is how long a queued call waits for a slot.
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
	TLS ServerTLS `yaml:"tls"`
	// Auth is the API's bearer tokens.
	Auth AuthConfig `yaml:"auth"`
	// ReloadInterval is how often the TLS files and the token file
	// are checked for changes.
	ReloadInterval Duration `yaml:"reload_interval"`
}

// ServerTLS is the TLS the API serves with (section api.tls).
type ServerTLS struct {
	// CertFile is the server's certificate (chain), PEM; reloaded when it
	// changes (api.reload_interval) or on SIGHUP, without a restart.
	CertFile string `yaml:"cert_file"`
	// KeyFile is the key of CertFile, PEM; reloaded with it.
	KeyFile string `yaml:"key_file"`
	// ClientCAFile is the CA bundle client certificates are
	// verified against (mTLS): a verified certificate
	// authenticates its subject CN with the role of its
	// "walcast:<role>" OU. Reloaded like the certificate.
	ClientCAFile string `yaml:"client_ca_file"`
	// RequireClientCert refuses connections without a client
	// certificate (tokens alone are then not enough).
	RequireClientCert bool `yaml:"require_client_cert"`
}

// AuthConfig is the API's token authentication (section api.auth).
type AuthConfig struct {
	// TokenFile holds the bearer tokens (salted argon2id hashes)
	// that `walcast auth token` manages; reloaded when it
	// changes. Authentication is on when it or
	// api.tls.client_ca_file is set.
	TokenFile string `yaml:"token_file"`
}

// MetricsConfig is the Prometheus endpoint (section metrics).
type MetricsConfig struct {
	// Addr serves /metrics; empty disables it.
	Addr string `yaml:"addr"`
	// TLS serves /metrics over TLS with api.tls's certificate.
	TLS bool `yaml:"tls"`
	// Pprof serves Go's profiles at /debug/pprof/ on the same address
	// (heap, CPU, goroutines), behind the API's authentication, or to
	// loopback callers only without it: for finding where a process's
	// memory or CPU goes.
	Pprof bool `yaml:"pprof"`
}

// AuditConfig is the audit log (section audit).
type AuditConfig struct {
	// File receives the audit log (JSON lines): "stderr", "off", or
	// a file path (appended to).
	File string `yaml:"file"`
}

// ConsoleConfig is the operator console (section console).
type ConsoleConfig struct {
	// Enabled serves the operator console at /ui/ on the API address.
	Enabled bool `yaml:"enabled"`
	// TraceURL links a task's trace id to a trace UI: "{trace_id}" in
	// it is replaced (e.g. http://127.0.0.1:16686/trace/{trace_id}).
	TraceURL string `yaml:"trace_url"`
	// Hanging is the age from which the tasks page's "hanging" filter
	// shows a live task.
	Hanging Duration `yaml:"hanging"`
}

func defaultAPIConfig() APIConfig {
	return APIConfig{
		Addr:            "127.0.0.1:7070",
		MaxRequestBytes: 4 << 20,
		MaxInFlight:     256,
		MaxQueued:       1024,
		QueueTimeout:    Duration(time.Second),
		RetryAfter:      Duration(2 * time.Second),
		ReloadInterval:  Duration(2 * time.Second),
	}
}

func defaultMetricsConfig() MetricsConfig { return MetricsConfig{Addr: "127.0.0.1:7071"} }

func defaultAuditConfig() AuditConfig { return AuditConfig{File: "stderr"} }

func defaultConsoleConfig() ConsoleConfig {
	return ConsoleConfig{Enabled: true, Hanging: Duration(time.Minute)}
}

// Validate checks the API settings: limits, TLS and authentication, and
// refuses an API on a non-loopback address without TLS and authentication
// unless api.insecure says so (R9.8).
func (a APIConfig) Validate() error {
	t := a.TLS
	switch {
	case a.Addr == "":
		return badSetting("api.addr", "must not be empty")
	case a.MaxRequestBytes < 1024:
		return badSetting("api.max_request_bytes", "%d is below 1 KiB", a.MaxRequestBytes)
	case a.MaxInFlight < 0 || a.MaxQueued < 0:
		return badSetting("api.max_in_flight", "max_in_flight (%d) and max_queued (%d) must not be negative", a.MaxInFlight, a.MaxQueued)
	case a.MaxInFlight > 0 && a.QueueTimeout < Duration(time.Millisecond):
		return badSetting("api.queue_timeout", "%v is below 1ms", a.QueueTimeout.D())
	case a.MaxInFlight > 0 && a.RetryAfter < Duration(100*time.Millisecond):
		return badSetting("api.retry_after", "%v is below 100ms", a.RetryAfter.D())
	case (t.CertFile == "") != (t.KeyFile == ""):
		return badSetting("api.tls", "cert_file and key_file go together")
	case t.ClientCAFile != "" && t.CertFile == "":
		return badSetting("api.tls.client_ca_file", "client certificates need TLS: set api.tls.cert_file and api.tls.key_file")
	case t.RequireClientCert && t.ClientCAFile == "":
		return badSetting("api.tls.require_client_cert", "needs api.tls.client_ca_file")
	case a.ReloadInterval < Duration(100*time.Millisecond):
		return badSetting("api.reload_interval", "%v is below 100ms", a.ReloadInterval.D())
	case a.Secure && (t.CertFile != "" || t.ClientCAFile != "" || a.Auth.TokenFile != ""):
		return badSetting("api.secure", "makes its own api.tls and api.auth files: leave api.tls.* and api.auth.token_file unset")
	case !a.Insecure && !a.Secure && !loopback(a.Addr) && !(t.CertFile != "" && a.authOn()):
		return badSetting("api.addr", "%s is not a loopback address: serving the API there needs TLS (api.tls.cert_file and api.tls.key_file, --api-tls-cert/--api-tls-key) and authentication (api.auth.token_file or api.tls.client_ca_file, --api-token-file/--api-client-ca), or api.insecure: true (--insecure) to serve it unprotected", a.Addr)
	}
	return nil
}

// authOn reports whether the API authenticates callers: with a token file
// or a client CA bundle.
func (a APIConfig) authOn() bool { return a.Auth.TokenFile != "" || a.TLS.ClientCAFile != "" }

// Validate checks the audit log's destination.
func (a AuditConfig) Validate() error {
	if a.File == "" {
		return badSetting("audit.file", `must be "stderr", "off" or a file path`)
	}
	return nil
}

// Validate checks the console's settings.
func (c ConsoleConfig) Validate() error {
	switch {
	case c.Hanging <= 0:
		return badSetting("console.hanging", "must be positive")
	case c.TraceURL != "" && !strings.Contains(c.TraceURL, "{trace_id}"):
		return badSetting("console.trace_url", "%q has no {trace_id} placeholder", c.TraceURL)
	}
	return nil
}
