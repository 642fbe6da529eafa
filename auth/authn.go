package auth

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Method is how an identity authenticated.
type Method string

// Methods.
const (
	// MethodToken: a bearer token of the token file.
	MethodToken Method = "token"
	// MethodCertificate: a client certificate a trusted CA signed (mTLS).
	MethodCertificate Method = "certificate"
)

// Identity is an authenticated caller.
type Identity struct {
	// Name is who the caller is: the token's name, or the certificate's
	// subject common name (else its first URI, DNS or e-mail SAN). It is
	// the metadata user whose grants a writer's DDL needs.
	Name string
	// Role is what the caller may do.
	Role Role
	// Method is how the caller authenticated.
	Method Method
	// TokenID is the token's public id (MethodToken only).
	TokenID string
}

// String describes the identity for logs: name, role and method, never a
// secret.
func (id Identity) String() string {
	if id.Method == MethodToken {
		return fmt.Sprintf("%s (%s, token %s)", id.Name, id.Role, id.TokenID)
	}
	return fmt.Sprintf("%s (%s, %s)", id.Name, id.Role, id.Method)
}

type ctxKey struct{}

// NewContext returns ctx carrying id; the middleware gives it to every call
// it lets through.
func NewContext(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// FromContext returns the identity of the call ctx belongs to, and false if
// there is none (authentication is off, or the call is in process).
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(ctxKey{}).(Identity)
	return id, ok
}

// CertRolePrefix starts the subject organizational unit (OU) that gives a
// client certificate its role: "walcast:reader", "walcast:writer",
// "walcast:admin" or "walcast:node". The CA that signs the certificate
// vouches for the role.
const CertRolePrefix = "walcast:"

// Options configure an Authenticator.
type Options struct {
	// Tokens verifies bearer tokens; nil refuses them.
	Tokens *Tokens
	// ClientCAs returns the CA bundle client certificates must chain to
	// (called per request, so a reloaded bundle takes effect at once); nil
	// ignores client certificates.
	ClientCAs func() *x509.CertPool
	// Now is the clock expiries are checked against; nil means time.Now.
	Now func() time.Time
}

// Authenticator finds the identity of API calls (R9.8): from a bearer token
// in the Authorization header, else from a verified client certificate.
type Authenticator struct {
	opts Options
}

// NewAuthenticator returns an authenticator with opts.
func NewAuthenticator(opts Options) *Authenticator {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Authenticator{opts: opts}
}

// Authenticate returns the identity of r. A token, when present, decides;
// a client certificate, when presented, must chain to a trusted CA even
// then. Every failure matches ErrUnauthenticated and says what to fix;
// none echoes a secret. The web console and other plain HTTP handlers
// authenticate their requests with it.
func (a *Authenticator) Authenticate(r *http.Request) (Identity, error) {
	var certID *Identity
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && a.opts.ClientCAs != nil {
		id, err := a.certIdentity(r.TLS.PeerCertificates)
		if err != nil {
			return Identity{}, err
		}
		certID = &id
	}
	if hs := r.Header.Values("Authorization"); len(hs) > 0 {
		if len(hs) > 1 {
			return Identity{}, fmt.Errorf("%w: more than one Authorization header", ErrUnauthenticated)
		}
		return a.tokenIdentity(hs[0])
	}
	if certID != nil {
		return *certID, nil
	}
	var how []string
	if a.opts.Tokens != nil {
		how = append(how, "a bearer token (walcast --token-file)")
	}
	if a.opts.ClientCAs != nil {
		how = append(how, "a client certificate (walcast --tls-cert/--tls-key)")
	}
	if len(how) == 0 {
		return Identity{}, fmt.Errorf("%w: this server accepts no credentials", ErrUnauthenticated)
	}
	return Identity{}, fmt.Errorf("%w: no credentials: send %s", ErrUnauthenticated, strings.Join(how, " or "))
}

func (a *Authenticator) tokenIdentity(header string) (Identity, error) {
	if a.opts.Tokens == nil {
		return Identity{}, fmt.Errorf("%w: this server accepts no tokens (api.auth.token_file is not set)", ErrUnauthenticated)
	}
	tok, err := ParseAuthorization(header)
	if err != nil {
		return Identity{}, err
	}
	rec, err := a.opts.Tokens.Verify(tok, a.opts.Now())
	if err != nil {
		return Identity{Method: MethodToken, TokenID: rec.ID, Name: rec.Name}, err
	}
	return Identity{Name: rec.Name, Role: rec.Role, Method: MethodToken, TokenID: rec.ID}, nil
}

// certIdentity verifies a client's chain against the CA bundle and reads
// its identity.
func (a *Authenticator) certIdentity(chain []*x509.Certificate) (Identity, error) {
	leaf := chain[0]
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: a.opts.ClientCAs(), Intermediates: inter,
		CurrentTime: a.opts.Now(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		var ua x509.UnknownAuthorityError
		if errors.As(err, &ua) {
			return Identity{}, fmt.Errorf("%w: client certificate %q is not signed by a CA of api.tls.client_ca_file", ErrUnauthenticated, leaf.Subject.CommonName)
		}
		return Identity{}, fmt.Errorf("%w: client certificate %q: %v", ErrUnauthenticated, leaf.Subject.CommonName, err)
	}
	id := Identity{Name: certName(leaf), Method: MethodCertificate}
	for _, ou := range leaf.Subject.OrganizationalUnit {
		s, ok := strings.CutPrefix(ou, CertRolePrefix)
		if !ok {
			continue
		}
		r, err := ParseRole(s)
		if err != nil {
			return Identity{}, fmt.Errorf("%w: client certificate %q: OU %q: %v", ErrUnauthenticated, id.Name, ou, err)
		}
		if id.Role != NoRole && id.Role != r {
			return Identity{}, fmt.Errorf("%w: client certificate %q names two roles", ErrUnauthenticated, id.Name)
		}
		id.Role = r
	}
	if id.Name == "" {
		return Identity{}, fmt.Errorf("%w: client certificate names nobody (no subject CN or SAN)", ErrUnauthenticated)
	}
	return id, nil
}

func certName(c *x509.Certificate) string {
	switch {
	case c.Subject.CommonName != "":
		return c.Subject.CommonName
	case len(c.URIs) > 0:
		return c.URIs[0].String()
	case len(c.DNSNames) > 0:
		return c.DNSNames[0]
	case len(c.EmailAddresses) > 0:
		return c.EmailAddresses[0]
	}
	return ""
}

// Authorize checks that id may call procedure: the procedure is in the
// table and id's role satisfies it. Failures match ErrPermissionDenied.
func Authorize(id Identity, procedure string) error {
	req, ok := Required(procedure)
	if !ok {
		return fmt.Errorf("%w: %s is not in the role table", ErrPermissionDenied, procedure)
	}
	if !id.Role.Satisfies(req) {
		return fmt.Errorf("%w: %s needs role %s; %s has role %s", ErrPermissionDenied, procedure, req, id.Name, id.Role)
	}
	return nil
}
