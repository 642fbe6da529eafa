package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/auth"
	"github.com/walcast/walcast/internal/tlsfiles"
)

// security is a process's API protection (R9.8), built from the api.tls,
// api.auth and audit settings: the reloading server certificate, the
// authenticator in front of every procedure, and the audit log.
type security struct {
	tls    *tlsfiles.Server    // nil: plain HTTP
	tokens *auth.Tokens        // nil: no bearer tokens
	authn  *auth.Authenticator // nil: authentication off
	audit  *auth.Audit
	closer io.Closer // the audit file, if one
	log    *slog.Logger
}

func newSecurity(cfg Config, log *slog.Logger) (_ *security, err error) {
	s := &security{log: log}
	defer func() {
		if err != nil {
			_ = s.close()
		}
	}()
	switch f := cfg.Audit.File; f {
	case "off":
	case "stderr":
		s.audit = auth.NewAudit(os.Stderr)
	default:
		af, err := os.OpenFile(f, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("%w: audit.file: %w", ErrConfig, err)
		}
		s.audit, s.closer = auth.NewAudit(af), af
	}
	t := cfg.API.TLS
	if t.CertFile != "" {
		s.tls, err = tlsfiles.NewServer(tlsfiles.ServerFiles{CertFile: t.CertFile, KeyFile: t.KeyFile,
			ClientCAFile: t.ClientCAFile, RequireClientCert: t.RequireClientCert})
		if err != nil {
			return nil, fmt.Errorf("%w: api.tls: %w", ErrConfig, err)
		}
	}
	if cfg.API.Auth.TokenFile != "" {
		if s.tokens, err = auth.OpenTokens(cfg.API.Auth.TokenFile); err != nil {
			return nil, fmt.Errorf("%w: api.auth.token_file: %w (create it with: walcast auth token create --file %s --name <name> --role admin)",
				ErrConfig, err, cfg.API.Auth.TokenFile)
		}
	}
	if cfg.AuthOn() {
		opts := auth.Options{Tokens: s.tokens}
		if t.ClientCAFile != "" {
			opts.ClientCAs = func() *x509.CertPool { return s.tls.ClientCAs() }
		}
		s.authn = auth.NewAuthenticator(opts)
	}
	return s, nil
}

// handler puts the middleware in front of h when authentication is on.
func (s *security) handler(h http.Handler) http.Handler {
	if s.authn == nil {
		return h
	}
	return s.authn.Middleware(h, s.audit)
}

// handlerOptions are the options of every service handler: the audit
// interceptor.
func (s *security) handlerOptions() []connect.HandlerOption {
	if s.audit == nil {
		return nil
	}
	return []connect.HandlerOption{connect.WithInterceptors(s.audit.Interceptor())}
}

// serve serves h on ln, over TLS when configured, until the returned
// shutdown is called; a failure of Serve goes to fail.
func (s *security) serve(ln net.Listener, h http.Handler, fail func(error)) (shutdown func(context.Context) error) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		// TLS handshake failures (scanners, clients without the CA) are
		// the clients' to report; the server notes them at debug level.
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	var protos http.Protocols
	protos.SetHTTP1(true)
	if s.tls != nil {
		protos.SetHTTP2(true)
		srv.TLSConfig = s.tls.Config()
		ln = tlsfiles.Listener(ln, srv.TLSConfig)
	} else {
		protos.SetUnencryptedHTTP2(true) // gRPC without TLS on 127.0.0.1
	}
	srv.Protocols = &protos
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fail(err)
		}
	}()
	return srv.Shutdown
}

// scheme is the URL scheme clients reach the API with.
func (s *security) scheme() string {
	if s.tls != nil {
		return "https"
	}
	return "http"
}

// reload reads the TLS files and the token file again if they changed.
func (s *security) reload() error {
	var errs []error
	if s.tls != nil {
		if changed, err := s.tls.Reload(); err != nil {
			errs = append(errs, fmt.Errorf("api.tls: %w", err))
		} else if changed {
			s.log.Info("API TLS files reloaded")
		}
	}
	if s.tokens != nil {
		if changed, err := s.tokens.Reload(); err != nil {
			errs = append(errs, fmt.Errorf("api.auth.token_file: %w", err))
		} else if changed {
			s.log.Info("token file reloaded", "tokens", s.tokens.Len())
		}
	}
	return errors.Join(errs...)
}

// watch reloads every interval until ctx ends; failures are logged, and
// what was loaded before stays in force.
func (s *security) watch(ctx context.Context, interval time.Duration) {
	if s.tls == nil && s.tokens == nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.reload(); err != nil {
			s.log.Error("reload failed; the previous certificates and tokens stay in force", "err", err)
		}
	}
}

// metricsTLS is the TLS configuration of /metrics (metrics.tls), nil for
// plain HTTP.
func (s *security) metricsTLS(cfg Config) *tls.Config {
	if !cfg.Metrics.TLS || s.tls == nil {
		return nil
	}
	c := s.tls.Config()
	c.ClientAuth = tls.NoClientCert
	return c
}

func (s *security) close() error {
	if s.closer != nil {
		return s.closer.Close()
	}
	return nil
}
