package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/walcast/walcast/auth"
	"github.com/walcast/walcast/internal/pki"
)

// TestR9_8_SecureStandaloneThroughTheCLI runs `walcast standalone --secure`
// as a real process and drives it with the CLI only: TLS and the admin
// token it made work, missing credentials and plain HTTP are refused with
// errors that say what to do, a writer token made with `walcast auth token
// create` broadcasts but cannot complete a callback, its revocation takes
// effect on SIGHUP, a client certificate made with `walcast auth cert
// create` authenticates with its role, and the audit log records the
// refusals without any token.
func TestR9_8_SecureStandaloneThroughTheCLI(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	audit := filepath.Join(t.TempDir(), "audit.log")
	p := start(t, "standalone", "standalone", "--secure", "--data-dir", dir, "--api-addr", "127.0.0.1:0",
		"--metrics-addr", "", "--audit-file", audit)
	if !regexp.MustCompile(`ready: api=https://127\.0\.0\.1:\d+ `).MatchString(p.out()) {
		t.Fatalf("ready line without https:\n%s", p.out())
	}
	sec := filepath.Join(dir, "secure")
	ca, adminTok, tokens := filepath.Join(sec, "ca.crt"), filepath.Join(sec, "admin.token"), filepath.Join(sec, "tokens.json")
	tlsFlags := []string{"--addr", p.api, "--tls-ca", ca}
	cli := func(args ...string) (string, error) { return run(t, args...) }
	mustFail := func(want string, args ...string) {
		t.Helper()
		out, err := cli(args...)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("walcast %s: %v (%s); want a failure saying %q", strings.Join(args, " "), err, out, want)
		}
	}

	if out, err := cli(append([]string{"tasks", "list", "--token-file", adminTok}, tlsFlags...)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	mustFail("unauthenticated: no credentials", append([]string{"tasks", "list"}, tlsFlags...)...)
	mustFail("this address serves TLS", "tasks", "list", "--addr", p.api)
	mustFail("not signed by a CA this client trusts", "tasks", "list", "--addr", "https://"+p.api, "--token-file", adminTok)

	// A writer token, made while the server runs.
	out, err := cli("auth", "token", "create", "--file", tokens, "--name", "ci", "--role", "writer")
	if err != nil {
		t.Fatal(err)
	}
	writerTok := filepath.Join(t.TempDir(), "ci.token")
	if err := os.WriteFile(writerTok, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	broadcast := append([]string{"broadcast", "--type", "Generic.v1", "--payload", "x", "--vchannel", "wal-1/a",
		"--key", "Collection:db:c@X", "--token-file", writerTok}, tlsFlags...)
	waitUntil(t, "the server to load the new token", func() bool {
		_, err := cli(broadcast...)
		return err == nil
	})
	mustFail("permission_denied", append([]string{"tasks", "complete", "1", "--reason", "r", "--token-file", writerTok}, tlsFlags...)...)
	if out, err := cli("auth", "token", "list", "--file", tokens); err != nil || !strings.Contains(out, "ci") || !strings.Contains(out, "writer") {
		t.Fatalf("token list: %v\n%s", err, out)
	}
	if _, err := cli("auth", "token", "revoke", "--file", tokens, "ci"); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "SIGHUP to revoke the token", func() bool {
		_, err := cli(append([]string{"tasks", "list", "--token-file", writerTok}, tlsFlags...)...)
		return err != nil && strings.Contains(err.Error(), "unauthenticated")
	})

	// A reader certificate of the local CA.
	certOut := filepath.Join(t.TempDir(), "viewer")
	if _, err := cli("auth", "cert", "create", "--ca-cert", ca, "--ca-key", filepath.Join(sec, "ca.key"),
		"--name", "viewer", "--role", "reader", "--out", certOut); err != nil {
		t.Fatal(err)
	}
	certFlags := append([]string{"--tls-cert", certOut + ".crt", "--tls-key", certOut + ".key"}, tlsFlags...)
	if out, err := cli(append([]string{"tasks", "list"}, certFlags...)...); err != nil || !strings.Contains(out, "Generic.v1") {
		t.Fatalf("tasks list with a reader certificate: %v\n%s", err, out)
	}
	mustFail("permission_denied", append([]string{"broadcast", "--type", "Generic.v1", "--payload", "x", "--vchannel", "wal-1/b"}, certFlags...)...)

	p.stop()
	raw, err := os.ReadFile(audit)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(raw), `"msg":"refused"`); n < 4 {
		t.Errorf("audit log has %d refusals, want at least 4:\n%s", n, raw)
	}
	for _, f := range []string{adminTok, writerTok} {
		tok, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if s := strings.TrimSpace(string(tok)); strings.Contains(string(raw), s[len(s)-43:]) {
			t.Errorf("audit log holds the token of %s", f)
		}
	}
}

// TestR9_8_NodeAcksWithTheNodeRole runs a coordinator serving TLS and
// tokens and a streaming node as real processes: the node authenticates
// with a token of role node over TLS, and its acks complete a broadcast
// that waits for them (GenericSync).
func TestR9_8_NodeAcksWithTheNodeRole(t *testing.T) {
	startShared(t)
	dir := t.TempDir()
	ca, err := pki.NewCA("cluster CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, k, err := ca.Issue(pki.Localhost())
	if err != nil {
		t.Fatal(err)
	}
	caFile, certFile, keyFile, tokens := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "coord.crt"), filepath.Join(dir, "coord.key"), filepath.Join(dir, "tokens.json")
	for path, data := range map[string][]byte{caFile: ca.CertPEM, certFile: c, keyFile: k} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tokenFile := func(name string, role auth.Role) string {
		tok, _, err := auth.CreateToken(tokens, name, role, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, name+".token")
		if err := os.WriteFile(f, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	admin, nodeTok := tokenFile("ops", auth.Admin), tokenFile("n0", auth.Node)
	t.Setenv("WALCAST_CATALOG_PREFIX", fmt.Sprintf("securenode%d/", time.Now().UnixNano()))
	t.Setenv("WALCAST_CATALOG_MAX_TXN_OPS", "1024")
	streams := streamPrefix() // this cluster's own streams on the shared NATS
	common := []string{"--etcd", strings.Join(shared.etcd.Endpoints(), ","), "--nats", shared.nats.ClientURL(), "--nats-monitor", shared.nats.MonitorURL(), "--nats-stream-prefix", streams, "--metrics-addr", ""}
	nodeCommon := []string{"--nats", shared.nats.ClientURL(), "--nats-stream-prefix", streams, "--metrics-addr", ""} // a node has no etcd
	coord := start(t, "coord", append([]string{"coord", "--api-addr", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--api-tls-cert", certFile, "--api-tls-key", keyFile, "--api-token-file", tokens, "--audit-file", "off"}, common...)...)
	if !strings.Contains(coord.out(), "api=https://") {
		t.Fatalf("coordinator ready line:\n%s", coord.out())
	}
	start(t, "node", append([]string{"node", "--name", "n0", "--consume", "0,1,2,3", "--coordinators", coord.api,
		"--data-dir", t.TempDir(), "--tls-ca", caFile, "--token-file", nodeTok}, nodeCommon...)...)
	out, err := run(t, "broadcast", "--type", "GenericSync.v1", "--payload", "acked", "--vchannel", "wal-1/s",
		"--addr", coord.api, "--tls-ca", caFile, "--token-file", admin, "--timeout", "60s")
	if err != nil || !strings.Contains(out, "outcome succeeded") {
		t.Fatalf("a broadcast the node must ack: %v\n%s", err, out)
	}
}
