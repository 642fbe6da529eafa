package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/walcast/walcast/internal/tlsfiles"
)

// Outbound TLS and credentials (R9.8): what walcast presents to the etcd,
// NATS and Kafka it connects to. Secrets come from files only, so that no
// password is in the configuration, its printout or a process listing.

// clientTLS builds the tls.Config of a ClientTLS setting, nil when off.
func clientTLS(key string, t ClientTLS) (*tls.Config, error) {
	if !t.On() {
		return nil, nil
	}
	c, err := tlsfiles.Client(tlsfiles.ClientFiles{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, ServerName: t.ServerName})
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrConfig, key, err)
	}
	return c, nil
}

// readSecret reads a password file, without its trailing newline.
func readSecret(key, path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrConfig, key, err)
	}
	s := strings.TrimRight(string(raw), "\r\n")
	if s == "" {
		return "", fmt.Errorf("%w: %s: %s is empty", ErrConfig, key, path)
	}
	return s, nil
}

// etcdTLS completes an etcd client configuration with catalog.tls and
// catalog.username/password_file.
func etcdTLS(cfg Config, ec *clientv3.Config) error {
	tc, err := clientTLS("catalog.tls", cfg.Catalog.TLS)
	if err != nil {
		return err
	}
	ec.TLS = tc
	if cfg.Catalog.Username != "" {
		pw, err := readSecret("catalog.password_file", cfg.Catalog.PasswordFile)
		if err != nil {
			return err
		}
		ec.Username, ec.Password = cfg.Catalog.Username, pw
	}
	return nil
}

// natsOptions are the NATS connection options of wal.nats.tls and its
// credentials; a secondary also reads its primary's NATS with them.
func natsOptions(cfg Config) ([]natsgo.Option, error) {
	n := cfg.WAL.NATS
	var opts []natsgo.Option
	tc, err := clientTLS("wal.nats.tls", n.TLS)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, natsgo.Secure(tc))
	}
	switch {
	case n.CredsFile != "":
		if _, err := os.Stat(n.CredsFile); err != nil {
			return nil, fmt.Errorf("%w: wal.nats.creds_file: %w", ErrConfig, err)
		}
		opts = append(opts, natsgo.UserCredentials(n.CredsFile))
	case n.NKeyFile != "":
		o, err := natsgo.NkeyOptionFromSeed(n.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: wal.nats.nkey_file: %w", ErrConfig, err)
		}
		opts = append(opts, o)
	case n.User != "":
		pw, err := readSecret("wal.nats.password_file", n.PasswordFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, natsgo.UserInfo(n.User, pw))
	}
	return opts, nil
}

// kafkaOptions are the franz-go options of wal.kafka.tls and wal.kafka.sasl.
func kafkaOptions(cfg Config) ([]kgo.Opt, error) {
	k := cfg.WAL.Kafka
	var opts []kgo.Opt
	tc, err := clientTLS("wal.kafka.tls", k.TLS)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if k.SASL.Mechanism == "" {
		return opts, nil
	}
	pw, err := readSecret("wal.kafka.sasl.password_file", k.SASL.PasswordFile)
	if err != nil {
		return nil, err
	}
	switch k.SASL.Mechanism {
	case "PLAIN":
		opts = append(opts, kgo.SASL(plain.Auth{User: k.SASL.User, Pass: pw}.AsMechanism()))
	case "SCRAM-SHA-256":
		opts = append(opts, kgo.SASL(scram.Auth{User: k.SASL.User, Pass: pw}.AsSha256Mechanism()))
	case "SCRAM-SHA-512":
		opts = append(opts, kgo.SASL(scram.Auth{User: k.SASL.User, Pass: pw}.AsSha512Mechanism()))
	}
	return opts, nil
}

// kafkaPreflight connects once to the brokers with opts and no retries, so
// that bad credentials or TLS fail the start at once with the brokers'
// answer, instead of as a deadline after the client's retries.
func kafkaPreflight(ctx context.Context, brokers []string, opts []kgo.Opt) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.RequestRetries(0)}, opts...)...)
	if err != nil {
		return fmt.Errorf("%w: wal.kafka: %w", ErrConfig, err)
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := cl.Ping(pctx); err != nil {
		return fmt.Errorf("wal (kafka): cannot talk to the brokers %v (check wal.kafka.tls and wal.kafka.sasl): %w", brokers, err)
	}
	return nil
}
