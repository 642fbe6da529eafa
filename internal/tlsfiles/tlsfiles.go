// Package tlsfiles builds TLS configurations from PEM files: the API
// server's, whose certificate, key and client CA bundle are reloaded when
// the files change (certificate rotation without a restart), and the
// clients' of etcd, NATS, Kafka and the walcast API.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// ErrInvalid reports files that do not make a TLS configuration.
var ErrInvalid = errors.New("tls: invalid files")

// ServerFiles names a server's TLS files.
type ServerFiles struct {
	// CertFile and KeyFile are the server's certificate (chain) and key.
	CertFile, KeyFile string
	// ClientCAFile, if set, is the CA bundle client certificates are
	// verified against (by the caller, see ClientCAs).
	ClientCAFile string
	// RequireClientCert makes the handshake fail without a client
	// certificate.
	RequireClientCert bool
}

// Server is a server TLS configuration whose files are reloaded by Reload
// and Watch. A reload that fails (a file half written during a rotation, a
// key that does not match) keeps the previous certificate in force.
type Server struct {
	files ServerFiles

	mu     sync.Mutex // serialises loads
	stamps map[string]stamp

	cert atomic.Pointer[tls.Certificate]
	cas  atomic.Pointer[x509.CertPool]
}

type stamp struct {
	size  int64
	mtime time.Time
}

// NewServer loads the files.
func NewServer(f ServerFiles) (*Server, error) {
	if f.CertFile == "" || f.KeyFile == "" {
		return nil, fmt.Errorf("%w: a server needs both a certificate and a key file", ErrInvalid)
	}
	if f.RequireClientCert && f.ClientCAFile == "" {
		return nil, fmt.Errorf("%w: requiring client certificates needs a client CA file", ErrInvalid)
	}
	s := &Server{files: f, stamps: map[string]stamp{}}
	if _, err := s.load(true); err != nil {
		return nil, err
	}
	return s, nil
}

// Reload reads the files again if one changed, and reports whether it did.
func (s *Server) Reload() (bool, error) { return s.load(false) }

func (s *Server) load(force bool) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	files := []string{s.files.CertFile, s.files.KeyFile}
	if s.files.ClientCAFile != "" {
		files = append(files, s.files.ClientCAFile)
	}
	now := make(map[string]stamp, len(files))
	changed := force
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			return false, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		now[f] = stamp{fi.Size(), fi.ModTime()}
		if now[f] != s.stamps[f] {
			changed = true
		}
	}
	if !changed {
		return false, nil
	}
	cert, err := tls.LoadX509KeyPair(s.files.CertFile, s.files.KeyFile)
	if err != nil {
		return false, fmt.Errorf("%w: server certificate %s, key %s: %w", ErrInvalid, s.files.CertFile, s.files.KeyFile, err)
	}
	var pool *x509.CertPool
	if s.files.ClientCAFile != "" {
		if pool, err = LoadPool(s.files.ClientCAFile); err != nil {
			return false, err
		}
	}
	s.cert.Store(&cert)
	if pool != nil {
		s.cas.Store(pool)
	}
	s.stamps = now
	return true, nil
}

// Certificate is the certificate in force.
func (s *Server) Certificate() *tls.Certificate { return s.cert.Load() }

// ClientCAs returns the client CA bundle in force, nil without one.
func (s *Server) ClientCAs() *x509.CertPool { return s.cas.Load() }

// Config returns the tls.Config of a server: the certificate in force at
// every handshake, HTTP/2 and HTTP/1.1 by ALPN, TLS 1.2 at least. With a
// client CA file it asks for client certificates (requires one with
// RequireClientCert) but leaves their verification to the caller, against
// ClientCAs: a certificate from another CA then gets a clear
// Unauthenticated answer instead of a failed handshake.
func (s *Server) Config() *tls.Config {
	c := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.cert.Load(), nil
		},
	}
	switch {
	case s.files.RequireClientCert:
		c.ClientAuth = tls.RequireAnyClientCert
	case s.files.ClientCAFile != "":
		c.ClientAuth = tls.RequestClientCert
	}
	return c
}

// LoadPool reads a PEM CA bundle.
func LoadPool(file string) (*x509.CertPool, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%w: CA bundle: %w", ErrInvalid, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw) {
		return nil, fmt.Errorf("%w: CA bundle %s holds no PEM certificate", ErrInvalid, file)
	}
	return pool, nil
}

// ClientFiles names a client's TLS files.
type ClientFiles struct {
	// CAFile is the CA bundle the server's certificate must chain to;
	// empty means the system's roots.
	CAFile string
	// CertFile and KeyFile are the client's certificate and key (mTLS);
	// both or neither.
	CertFile, KeyFile string
	// ServerName overrides the name the server's certificate is checked
	// against (default: the host dialed).
	ServerName string
}

// IsZero reports whether no file or name is set.
func (f ClientFiles) IsZero() bool { return f == ClientFiles{} }

// Client returns the tls.Config of a client.
func Client(f ClientFiles) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CAFile != "" {
		pool, err := LoadPool(f.CAFile)
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	switch {
	case f.CertFile != "" && f.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: client certificate %s, key %s: %w", ErrInvalid, f.CertFile, f.KeyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	case f.CertFile != "" || f.KeyFile != "":
		return nil, fmt.Errorf("%w: a client certificate needs both its certificate and key file", ErrInvalid)
	}
	return c, nil
}
