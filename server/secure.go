package server

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/walcast/walcast/auth"
	"github.com/walcast/walcast/internal/pki"
)

// SecureFiles are the files of a secure standalone (api.secure), under
// <data_dir>/secure.
type SecureFiles struct {
	// Dir is the directory holding them.
	Dir string
	// CACert and CAKey are the local CA: clients pass CACert with
	// --tls-ca; `walcast auth cert create` issues client certificates
	// with both.
	CACert, CAKey string
	// ServerCert and ServerKey serve the API (localhost, 127.0.0.1, ::1
	// and the hosts of api.addr and api.advertise).
	ServerCert, ServerKey string
	// TokenFile is api.auth.token_file.
	TokenFile string
	// AdminToken holds the admin token made with the token file (mode
	// 0600): clients pass it with --token-file.
	AdminToken string
}

// secureFilesIn names the files under dataDir.
func secureFilesIn(dataDir string) SecureFiles {
	d := filepath.Join(dataDir, "secure")
	return SecureFiles{Dir: d, CACert: filepath.Join(d, "ca.crt"), CAKey: filepath.Join(d, "ca.key"),
		ServerCert: filepath.Join(d, "server.crt"), ServerKey: filepath.Join(d, "server.key"),
		TokenFile: filepath.Join(d, "tokens.json"), AdminToken: filepath.Join(d, "admin.token")}
}

// SetupSecure makes the files of a secure standalone under
// <cfg.DataDir>/secure, those that do not exist yet (a restart reuses
// them, so clients keep working), and returns cfg serving the API with
// them: TLS with the server certificate, the token file, and client
// certificates of the local CA.
func SetupSecure(cfg Config) (Config, SecureFiles, error) {
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return cfg, SecureFiles{}, err
	}
	f := secureFilesIn(dir)
	if err := os.MkdirAll(f.Dir, 0o700); err != nil {
		return cfg, f, fmt.Errorf("secure: %w", err)
	}
	var ca *pki.CA
	if exists(f.CACert) && exists(f.CAKey) {
		if ca, err = pki.LoadCA(f.CACert, f.CAKey); err != nil {
			return cfg, f, fmt.Errorf("secure: %w", err)
		}
	} else {
		if ca, err = pki.NewCA("walcast local CA", 10*365*24*time.Hour); err != nil {
			return cfg, f, err
		}
		if err := errors.Join(pki.WriteFile(f.CAKey, ca.KeyPEM(), 0o600), pki.WriteFile(f.CACert, ca.CertPEM, 0o644)); err != nil {
			return cfg, f, fmt.Errorf("secure: %w", err)
		}
		// A new CA invalidates a server certificate of an old one.
		_ = os.Remove(f.ServerCert)
	}
	if !exists(f.ServerCert) || !exists(f.ServerKey) {
		var hosts []string
		for _, a := range []string{cfg.API.Addr, cfg.API.Advertise} {
			if h, _, err := net.SplitHostPort(a); err == nil && h != "" {
				hosts = append(hosts, h)
			}
		}
		c, k, err := ca.Issue(pki.Localhost(hosts...))
		if err != nil {
			return cfg, f, err
		}
		if err := errors.Join(pki.WriteFile(f.ServerKey, k, 0o600), pki.WriteFile(f.ServerCert, c, 0o644)); err != nil {
			return cfg, f, fmt.Errorf("secure: %w", err)
		}
	}
	if !exists(f.AdminToken) {
		// A token file without the admin token file (deleted) gets a new
		// admin token; old tokens stay.
		tok, _, err := auth.CreateToken(f.TokenFile, "admin", auth.Admin, time.Time{})
		if err != nil {
			return cfg, f, fmt.Errorf("secure: %w", err)
		}
		if err := pki.WriteFile(f.AdminToken, []byte(tok+"\n"), 0o600); err != nil {
			return cfg, f, fmt.Errorf("secure: %w", err)
		}
	}
	cfg.API.TLS.CertFile, cfg.API.TLS.KeyFile, cfg.API.TLS.ClientCAFile = f.ServerCert, f.ServerKey, f.CACert
	cfg.API.Auth.TokenFile = f.TokenFile
	return cfg, f, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, fs.ErrNotExist)
}
