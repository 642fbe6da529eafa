package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	yaml "go.yaml.in/yaml/v3"

	"github.com/walcast/walcast/client"
)

// DefaultPort is the API port an address without one gets.
const DefaultPort = "7070"

// defaultAddr is where client commands look for a server when nothing says
// otherwise.
const defaultAddr = "127.0.0.1:" + DefaultPort

// defaultTimeout is a client command's deadline when nothing says
// otherwise.
const defaultTimeout = 30 * time.Second

// unreachableAfter is how long a client command retries when no
// coordinator can be connected to at all (nothing listens): long enough to
// ride over a coordinator's restart on the same port, short enough to fail
// at once for a server that is not running.
const unreachableAfter = time.Second

// connFlags are how a client command reaches the coordinators: address,
// credentials and TLS. They are declared in one place (addConnFlags) so
// every client command has the same ones; each comes, in decreasing
// priority, from its flag, an environment variable (WALCAST_ADDR,
// WALCAST_TOKEN_FILE), the context of the client configuration file, and
// the default.
type connFlags struct {
	addr          string
	context       string
	token         string
	tokenFile     string
	tlsCA         string
	tlsCert       string
	tlsKey        string
	tlsServerName string
}

// addConnFlags declares the connection flags on fs.
func addConnFlags(fs *pflag.FlagSet, f *connFlags) {
	fs.StringVar(&f.addr, "addr", "", "coordinator API address(es), comma separated: host[:port] (port "+DefaultPort+" if none), http:// or https:// (default: WALCAST_ADDR, the context's, "+defaultAddr+")")
	fs.StringVar(&f.context, "context", "", "the context of the client configuration file to use (default: WALCAST_CONTEXT, its current-context)")
	addCredentialFlags(fs, f)
}

// addCredentialFlags declares the credential and TLS flags on fs: the
// connection flags a streaming node takes for its own client of the
// coordinators (it has no --addr: it acks to --coordinators).
func addCredentialFlags(fs *pflag.FlagSet, f *connFlags) {
	fs.StringVar(&f.token, "token", "", "bearer token (visible to other local users in the process list: prefer --token-file)")
	fs.StringVar(&f.tokenFile, "token-file", "", "file holding the bearer token (default: WALCAST_TOKEN_FILE, the context's)")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "CA bundle the coordinators' certificates chain to; turns TLS on (bare addresses mean https://)")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "client certificate for mTLS (with --tls-key); turns TLS on")
	fs.StringVar(&f.tlsKey, "tls-key", "", "key of --tls-cert")
	fs.StringVar(&f.tlsServerName, "tls-server-name", "", "name the coordinators' certificates must be valid for (default: the host dialed)")
}

// clientConfig is the client configuration file:
//
//	current-context: prod
//	contexts:
//	  prod:
//	    addr: https://10.0.0.11:7070,https://10.0.0.12:7070
//	    tls-ca: /etc/walcast/ca.crt
//	    token-file: ~/.config/walcast/prod.token
//	  local:
//	    addr: 127.0.0.1:7070
type clientConfig struct {
	CurrentContext string                    `yaml:"current-context"`
	Contexts       map[string]contextSetting `yaml:"contexts"`

	path string // where it was read from
}

// contextSetting is one named context: how to reach one cluster.
type contextSetting struct {
	Addr          string `yaml:"addr,omitempty"`
	Token         string `yaml:"token,omitempty"`
	TokenFile     string `yaml:"token-file,omitempty"`
	TLSCA         string `yaml:"tls-ca,omitempty"`
	TLSCert       string `yaml:"tls-cert,omitempty"`
	TLSKey        string `yaml:"tls-key,omitempty"`
	TLSServerName string `yaml:"tls-server-name,omitempty"`
	Timeout       string `yaml:"timeout,omitempty"`
}

// clientConfigPath is where the client configuration file is:
// WALCAST_CLIENT_CONFIG, else $XDG_CONFIG_HOME/walcast/config.yaml, else
// ~/.config/walcast/config.yaml.
func clientConfigPath() string {
	if p := os.Getenv("WALCAST_CLIENT_CONFIG"); p != "" {
		return p
	}
	dir := os.Getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "walcast", "config.yaml")
}

// readClientConfig reads the client configuration file; a missing file is
// an empty configuration, a malformed one (unknown keys included) an
// error.
func readClientConfig() (*clientConfig, error) {
	path := clientConfigPath()
	cfg := &clientConfig{path: path}
	if path == "" {
		return cfg, nil
	}
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cfg, nil
	}
	if err != nil {
		return nil, usageError{fmt.Errorf("client configuration: %w", err)}
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) {
		return nil, usageError{fmt.Errorf("client configuration %s: %w", path, err)}
	}
	for name := range cfg.Contexts {
		if name == "" {
			return nil, usageError{fmt.Errorf("client configuration %s: a context has an empty name", path)}
		}
	}
	if c := cfg.CurrentContext; c != "" {
		if _, ok := cfg.Contexts[c]; !ok {
			return nil, usageError{fmt.Errorf("client configuration %s: current-context %q is not among its contexts", path, c)}
		}
	}
	return cfg, nil
}

// resolved is the connection a command uses, and where each part came
// from ("flag", "env", "context <name>", "default").
type resolved struct {
	connFlags
	timeout time.Duration
	from    map[string]string
	ctxName string
}

// resolve applies the environment, the client configuration's context and
// the defaults to what cmd's flags left unset.
func (g *globals) resolve(cmd *cobra.Command) (*resolved, error) {
	f := &g.conn
	r := &resolved{connFlags: *f, from: map[string]string{}}
	changed := func(name string) bool { return cmd.Flags().Changed(name) }
	cfg, err := readClientConfig()
	if err != nil {
		return nil, err
	}
	name, nameFrom := f.context, "flag"
	if !changed("context") {
		name, nameFrom = os.Getenv("WALCAST_CONTEXT"), "env"
	}
	if name == "" {
		name, nameFrom = cfg.CurrentContext, "current-context of "+cfg.path
	}
	var ctx contextSetting
	if name != "" {
		var ok bool
		if ctx, ok = cfg.Contexts[name]; !ok {
			return nil, usageError{fmt.Errorf("context %q (from the %s) is not in %s (walcast context list)", name, nameFrom, cfg.path)}
		}
		r.ctxName = name
	}
	fromCtx := "context " + name
	pick := func(key string, into *string, env, ctxValue, def string, path bool) {
		switch {
		case changed(key):
			r.from[key] = "flag"
		case env != "" && os.Getenv(env) != "":
			*into, r.from[key] = os.Getenv(env), "env "+env
		case ctxValue != "":
			if path {
				ctxValue = expandPath(ctxValue, filepath.Dir(cfg.path))
			}
			*into, r.from[key] = ctxValue, fromCtx
		case def != "":
			*into, r.from[key] = def, "default"
		}
	}
	pick("addr", &r.addr, "WALCAST_ADDR", ctx.Addr, defaultAddr, false)
	// Credentials come as a whole from one place: a --token-file must not
	// be combined with the context's certificate of another identity.
	if !changed("token") && !changed("token-file") {
		pick("token-file", &r.tokenFile, "WALCAST_TOKEN_FILE", ctx.TokenFile, "", true)
		if r.tokenFile == "" && ctx.Token != "" {
			r.token, r.from["token"] = ctx.Token, fromCtx
		}
	}
	if !changed("tls-ca") && !changed("tls-cert") && !changed("tls-key") && !changed("tls-server-name") {
		pick("tls-ca", &r.tlsCA, "", ctx.TLSCA, "", true)
		pick("tls-cert", &r.tlsCert, "", ctx.TLSCert, "", true)
		pick("tls-key", &r.tlsKey, "", ctx.TLSKey, "", true)
		pick("tls-server-name", &r.tlsServerName, "", ctx.TLSServerName, "", false)
	}
	timeout := g.timeout
	switch {
	case timeout != "":
		r.from["timeout"] = "flag"
	case ctx.Timeout != "":
		timeout, r.from["timeout"] = ctx.Timeout, fromCtx
	default:
		timeout, r.from["timeout"] = defaultTimeout.String(), "default"
	}
	d, err := time.ParseDuration(timeout)
	if err != nil || d <= 0 {
		return nil, usageError{fmt.Errorf("timeout %q (%s) is not a positive duration", timeout, r.from["timeout"])}
	}
	r.timeout = d
	if err := checkAddrs(r.addr); err != nil {
		return nil, usageError{fmt.Errorf("%w (the address from the %s)", err, r.from["addr"])}
	}
	return r, nil
}

// checkAddrs checks a comma-separated coordinator address list: at least
// one address, each with a host and (if it has one) a numeric port.
func checkAddrs(list string) error {
	var n int
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		n++
		_, rest, ok := strings.Cut(a, "://")
		if !ok {
			rest = a
		}
		hostport, _, _ := strings.Cut(rest, "/")
		host, port, err := net.SplitHostPort(withDefaultPort(hostport))
		if err != nil || host == "" {
			return fmt.Errorf("address %q has no host: give host[:port], http://host[:port] or https://host[:port]", a)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("address %q: port %q is not a number from 1 to 65535", a, port)
		}
	}
	if n == 0 {
		return fmt.Errorf("no coordinator address: give host[:port] (comma separated for several)")
	}
	return nil
}

// expandPath makes a path of the configuration file absolute: "~/" is the
// home directory, a relative path is relative to the file's directory.
func expandPath(p, base string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, rest)
		}
	}
	if !filepath.IsAbs(p) && base != "" {
		return filepath.Join(base, p)
	}
	return p
}

// tlsOn reports whether a TLS setting was given.
func (f *connFlags) tlsOn() bool {
	return f.tlsCA != "" || f.tlsCert != "" || f.tlsKey != "" || f.tlsServerName != ""
}

// addrs splits the address list and gives each address without a port the
// default port.
func (f *connFlags) addrs() []string {
	var out []string
	for _, a := range strings.Split(f.addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, withDefaultPort(a))
		}
	}
	return out
}

// withDefaultPort adds DefaultPort to an address that has none: a bare host
// ("10.0.0.1", "[::1]", "walcast.internal"), with or without a scheme.
func withDefaultPort(a string) string {
	scheme, host, ok := strings.Cut(a, "://")
	if !ok {
		scheme, host = "", a
	}
	hostport, path, _ := strings.Cut(host, "/")
	if _, _, err := net.SplitHostPort(hostport); err == nil || hostport == "" {
		return a
	}
	if ip := net.ParseIP(hostport); ip != nil && ip.To4() == nil {
		hostport = "[" + hostport + "]" // a bare IPv6 address
	}
	out := net.JoinHostPort(strings.Trim(hostport, "[]"), DefaultPort)
	if path != "" {
		out += "/" + path
	}
	if scheme != "" {
		out = scheme + "://" + out
	}
	return out
}

// options are the client options of the connection.
func (f *connFlags) options() ([]client.Option, error) {
	var opts []client.Option
	switch {
	case f.token != "" && f.tokenFile != "":
		return nil, usageError{fmt.Errorf("--token and --token-file: give one")}
	case f.token != "":
		opts = append(opts, client.WithToken(f.token))
	case f.tokenFile != "":
		opts = append(opts, client.WithTokenFile(f.tokenFile))
	}
	if f.tlsOn() || f.usesHTTPS() {
		tc, err := client.TLSConfig(f.tlsCA, f.tlsCert, f.tlsKey)
		if err != nil {
			return nil, usageError{err}
		}
		tc.ServerName = f.tlsServerName
		opts = append(opts, client.WithTLS(tc))
	}
	return opts, nil
}

func (f *connFlags) usesHTTPS() bool {
	for _, a := range f.addrs() {
		if strings.HasPrefix(a, "https://") {
			return true
		}
	}
	return false
}

// dial returns a client of the resolved coordinators and the command's
// deadline. A command fails after about a second when nothing listens at
// any address (unreachableAfter), and otherwise retries within its
// deadline.
func (g *globals) dial(cmd *cobra.Command) (*client.Client, context.Context, context.CancelFunc, error) {
	quietStdLog()
	r, err := g.resolve(cmd)
	if err != nil {
		return nil, nil, nil, err
	}
	opts, err := r.options()
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := client.New(r.addrs(), append(opts, client.WithUnreachable(unreachableAfter))...)
	if err != nil {
		return nil, nil, nil, usageError{err}
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), r.timeout)
	return c, ctx, func() { cancel(); c.Close() }, nil
}

// quietStdLog silences the standard logger in a client command: net/http
// writes there ("Unsolicited response received on idle HTTP channel" when
// --addr names a NATS port), which the command's own error says better.
// Servers log with slog.
var quietStdLog = sync.OnceFunc(func() { log.SetOutput(io.Discard) })

// connError says what to do about a failed call: for a server that cannot
// be reached, where the address came from and how to set it.
func (g *globals) connError(cmd *cobra.Command, err error) error {
	if !errors.Is(err, client.ErrUnreachable) {
		return err
	}
	r, rerr := g.resolve(cmd)
	if rerr != nil {
		return err
	}
	return fmt.Errorf("cannot reach walcast at %s (the address from the %s): is it running there? Set the address with --addr, WALCAST_ADDR or a context (walcast context list)\n%w",
		strings.Join(r.addrs(), ","), r.from["addr"], err)
}
