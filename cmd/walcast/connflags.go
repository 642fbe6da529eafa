package main

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"

	"github.com/walcast/walcast/client"
)

// connFlags are how a client command reaches the coordinators: address,
// credentials and TLS. They are declared in one place (addConnFlags) so
// every client command has the same ones.
type connFlags struct {
	addr          string
	token         string
	tokenFile     string
	tlsCA         string
	tlsCert       string
	tlsKey        string
	tlsServerName string
}

// addConnFlags declares the connection flags on fs.
func addConnFlags(fs *pflag.FlagSet, f *connFlags) {
	fs.StringVar(&f.addr, "addr", "127.0.0.1:7070", "coordinator API address(es), comma separated (host:port, http:// or https://)")
	fs.StringVar(&f.token, "token", "", "bearer token (visible to other local users in the process list: prefer --token-file)")
	fs.StringVar(&f.tokenFile, "token-file", "", "file holding the bearer token")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "CA bundle the coordinators' certificates chain to; turns TLS on (bare addresses mean https://)")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "client certificate for mTLS (with --tls-key); turns TLS on")
	fs.StringVar(&f.tlsKey, "tls-key", "", "key of --tls-cert")
	fs.StringVar(&f.tlsServerName, "tls-server-name", "", "name the coordinators' certificates must be valid for (default: the host dialed)")
}

// tlsOn reports whether a TLS flag was given.
func (f *connFlags) tlsOn() bool {
	return f.tlsCA != "" || f.tlsCert != "" || f.tlsKey != "" || f.tlsServerName != ""
}

// addrs splits --addr.
func (f *connFlags) addrs() []string {
	var out []string
	for _, a := range strings.Split(f.addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// options are the client options of the flags.
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
