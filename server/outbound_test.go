package server_test

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/internal/embedetcd"
	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/internal/longtest"
	"github.com/walcast/walcast/internal/pki"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/server"
)

// backendPKI is a CA with a server certificate for the backends and a
// client certificate for walcast, as files.
type backendPKI struct {
	ca                    *pki.CA
	caFile                string
	serverCert, serverKey string
	clientCert, clientKey string
	serverPair            tls.Certificate
}

func newBackendPKI(t *testing.T) *backendPKI {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA("backends", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b := &backendPKI{ca: ca, caFile: filepath.Join(dir, "ca.crt"),
		serverCert: filepath.Join(dir, "server.crt"), serverKey: filepath.Join(dir, "server.key"),
		clientCert: filepath.Join(dir, "client.crt"), clientKey: filepath.Join(dir, "client.key")}
	sc, sk, err := ca.Issue(pki.Localhost())
	if err != nil {
		t.Fatal(err)
	}
	cc, ck, err := ca.Issue(pki.Leaf{CommonName: "walcast", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	for path, data := range map[string][]byte{b.caFile: ca.CertPEM, b.serverCert: sc, b.serverKey: sk, b.clientCert: cc, b.clientKey: ck} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if b.serverPair, err = tls.X509KeyPair(sc, sk); err != nil {
		t.Fatal(err)
	}
	return b
}

func secretFile(t *testing.T, s string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(s+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// coordConfig is a coordinator configuration against etcd endpoints and a
// NATS URL, its API on loopback.
func coordConfig(t *testing.T, endpoints []string, natsURL string) server.Config {
	cfg := server.Default()
	cfg.DataDir = t.TempDir()
	cfg.API.Addr = "127.0.0.1:0"
	cfg.Metrics.Addr = ""
	cfg.Log.Level = "error"
	cfg.Audit.File = "off"
	cfg.Catalog.Endpoints = endpoints
	cfg.Catalog.MaxTxnOps = embedetcd.DefaultMaxTxnOps
	cfg.Catalog.DialTimeout = server.Duration(3 * time.Second)
	cfg.Catalog.Prefix = "outbound/"
	cfg.WAL.NATS.URL = natsURL
	cfg.Election.TTL = server.Duration(2 * time.Second)
	return cfg
}

// broadcastOnce sends one keyed broadcast to p and waits for its result:
// it succeeds only if the coordinator reached its catalog and its WAL.
func broadcastOnce(t *testing.T, p *server.Process) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New([]string{p.APIAddr()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Broadcast(ctx, &client.BroadcastRequest{Type: app.GenericType, Payload: []byte("x"),
		VChannels: []message.VChannel{"wal-1/a"}, ResourceKeys: []resource.Key{resource.ExclusiveCollection("db", "c")},
		Scope: client.ClusterScope(), ClientKey: "outbound-1"})
	if err != nil {
		t.Fatal(err)
	}
	if res.BroadcastID == 0 {
		t.Fatalf("result %+v", res)
	}
}

// TestR9_8_OutboundTLSAndCredentialsEtcdNATS runs a coordinator against an
// etcd that serves TLS, requires client certificates and has auth enabled,
// and a NATS server that serves TLS, requires client certificates and a
// user and password: with catalog.tls, catalog.username/password_file,
// wal.nats.tls and wal.nats.user/password_file it broadcasts; with a
// wrong password for either it does not start, and says why.
func TestR9_8_OutboundTLSAndCredentialsEtcdNATS(t *testing.T) {
	longtest.Require(t)
	b := newBackendPKI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	etcd, err := embedetcd.Start(ctx, embedetcd.Config{Dir: t.TempDir(), TLS: &embedetcd.TLS{CertFile: b.serverCert, KeyFile: b.serverKey,
		CAFile: b.caFile, ClientCertAuth: true, ClientCertFile: b.clientCert, ClientKeyFile: b.clientKey},
		BcryptCost: 4}) // bcrypt's minimum: see embedetcd.Config.BcryptCost
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	if !strings.HasPrefix(etcd.Endpoints()[0], "https://") {
		t.Fatalf("endpoints %v", etcd.Endpoints())
	}
	// etcd auth: a root user, then auth on.
	ec, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []func() error{
		func() error { _, err := ec.RoleAdd(ctx, "root"); return err },
		func() error { _, err := ec.UserAdd(ctx, "root", "etcd-secret"); return err },
		func() error { _, err := ec.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := ec.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	ec.Close()

	natsTLS := &tls.Config{Certificates: []tls.Certificate{b.serverPair}, ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs: b.ca.Pool(), MinVersion: tls.VersionTLS12}
	ns, err := embednats.Start(ctx, embednats.Config{Dir: t.TempDir(), SyncAlways: true, Monitor: true, TLS: natsTLS,
		Users: []embednats.User{{Name: "walcast", Password: "nats-secret"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()

	cfg := coordConfig(t, etcd.Endpoints(), ns.ClientURL())
	// The etcd client's DialTimeout also bounds its first Authenticate: a
	// TLS handshake with client certificates and etcd's bcrypt check of the
	// password. A wrong password is refused as soon as etcd answers, so a
	// generous bound costs nothing; 3 s ran out on a loaded CI machine and
	// turned the refusal into "context deadline exceeded".
	cfg.Catalog.DialTimeout = server.Duration(20 * time.Second)
	cfg.WAL.NATS.MonitorURLs = []string{ns.MonitorURL()}
	cfg.Catalog.TLS = server.ClientTLS{CAFile: b.caFile, CertFile: b.clientCert, KeyFile: b.clientKey}
	cfg.Catalog.Username, cfg.Catalog.PasswordFile = "root", secretFile(t, "etcd-secret")
	cfg.WAL.NATS.TLS = server.ClientTLS{CAFile: b.caFile, CertFile: b.clientCert, KeyFile: b.clientKey}
	cfg.WAL.NATS.User, cfg.WAL.NATS.PasswordFile = "walcast", secretFile(t, "nats-secret")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := server.StartCoordinator(ctx, cfg, app.Generic{})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the coordinator to lead", func() bool { _, err := p.Coord.Current(); return err == nil })
	broadcastOnce(t, p)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	bad := cfg
	bad.WAL.NATS.PasswordFile = secretFile(t, "wrong")
	if _, err := server.StartCoordinator(ctx, bad, app.Generic{}); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("wrong NATS password: %v, want an authorization error", err)
	}
	bad = cfg
	bad.WAL.NATS.TLS = server.ClientTLS{CAFile: b.caFile}
	if _, err := server.StartCoordinator(ctx, bad, app.Generic{}); err == nil {
		t.Fatal("NATS without the client certificate it requires: started")
	}
	bad = cfg
	bad.Catalog.PasswordFile = secretFile(t, "wrong")
	if p, err := server.StartCoordinator(ctx, bad, app.Generic{}); err == nil {
		p.Close()
		t.Fatal("wrong etcd password: started")
	} else if !strings.Contains(err.Error(), "authentication failed") {
		t.Fatalf("wrong etcd password: %v, want etcd's authentication error", err)
	}
	bad = cfg
	bad.Catalog.PasswordFile = filepath.Join(t.TempDir(), "missing")
	if _, err := server.StartCoordinator(ctx, bad, app.Generic{}); !errors.Is(err, server.ErrConfig) || !strings.Contains(err.Error(), "catalog.password_file") {
		t.Fatalf("missing password file: %v", err)
	}
}

// TestR9_8_OutboundNATSNKey authenticates to NATS with an nkey seed file.
func TestR9_8_OutboundNATSNKey(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := embednats.Start(ctx, embednats.Config{Dir: t.TempDir(), SyncAlways: true, Monitor: true, NKeys: []string{pub}})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	etcd, err := embedetcd.Start(ctx, embedetcd.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	cfg := coordConfig(t, etcd.Endpoints(), ns.ClientURL())
	cfg.WAL.NATS.MonitorURLs = []string{ns.MonitorURL()}
	cfg.WAL.NATS.NKeyFile = secretFile(t, string(seed))
	p, err := server.StartCoordinator(ctx, cfg, app.Generic{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitUntil(t, "the coordinator to lead", func() bool { _, err := p.Coord.Current(); return err == nil })
	broadcastOnce(t, p)

	other, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	otherSeed, _ := other.Seed()
	bad := cfg
	bad.WAL.NATS.NKeyFile = secretFile(t, string(otherSeed))
	bad.DataDir = t.TempDir()
	if _, err := server.StartCoordinator(ctx, bad, app.Generic{}); err == nil {
		t.Fatal("an nkey the server does not know: started")
	}
}

// TestR9_8_OutboundKafkaTLSAndSASL runs a coordinator on kfake (franz-go's
// fake Kafka, which supports TLS and SASL PLAIN and SCRAM) serving TLS and
// requiring SASL: each mechanism works with the right password, and a
// wrong one does not start.
func TestR9_8_OutboundKafkaTLSAndSASL(t *testing.T) {
	b := newBackendPKI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{b.serverPair}, MinVersion: tls.VersionTLS12}),
		kfake.Superuser("PLAIN", "plainuser", "plain-secret"),
		kfake.Superuser("SCRAM-SHA-256", "scram256", "scram-secret"),
		kfake.Superuser("SCRAM-SHA-512", "scram512", "scram-secret"))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	etcd, err := embedetcd.Start(ctx, embedetcd.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	for _, m := range []struct{ mech, user, pass string }{
		{"PLAIN", "plainuser", "plain-secret"}, {"SCRAM-SHA-256", "scram256", "scram-secret"}, {"SCRAM-SHA-512", "scram512", "scram-secret"},
	} {
		cfg := coordConfig(t, etcd.Endpoints(), "")
		cfg.Catalog.Prefix = "kafka" + m.mech + "/"
		// Each cluster on the shared kfake has its own topics (R8.2).
		cfg.WAL.Kafka.TopicPrefix = m.mech + "-"
		cfg.WAL.Kind = "kafka"
		cfg.WAL.Kafka.Brokers = kc.ListenAddrs()
		cfg.WAL.Kafka.ReplicationFactor = 1
		cfg.WAL.Kafka.TLS = server.ClientTLS{CAFile: b.caFile}
		cfg.WAL.Kafka.SASL.Mechanism, cfg.WAL.Kafka.SASL.User = m.mech, m.user
		cfg.WAL.Kafka.SASL.PasswordFile = secretFile(t, m.pass)
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		p, err := server.StartCoordinator(ctx, cfg, app.Generic{})
		if err != nil {
			t.Fatalf("%s: %v", m.mech, err)
		}
		waitUntil(t, "the coordinator to lead", func() bool { _, err := p.Coord.Current(); return err == nil })
		broadcastOnce(t, p)
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		bad := cfg
		bad.WAL.Kafka.SASL.PasswordFile = secretFile(t, "wrong")
		sctx, scancel := context.WithTimeout(ctx, 15*time.Second)
		p, err = server.StartCoordinator(sctx, bad, app.Generic{})
		scancel()
		if err == nil {
			p.Close()
			t.Fatalf("%s with a wrong password: started", m.mech)
		} else if !strings.Contains(err.Error(), "wal.kafka.sasl") {
			t.Fatalf("%s with a wrong password: %v, want the settings to check named", m.mech, err)
		}
		if m.mech != "PLAIN" {
			continue
		}
		bad = cfg
		bad.WAL.Kafka.TLS = server.ClientTLS{Enabled: true} // the system's roots do not know the CA
		if p, err := server.StartCoordinator(ctx, bad, app.Generic{}); err == nil {
			p.Close()
			t.Fatal("Kafka with an untrusted certificate: started")
		} else if !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("Kafka with an untrusted certificate: %v", err)
		}
	}
}
