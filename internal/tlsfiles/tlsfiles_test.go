package tlsfiles_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/internal/pki"
	"github.com/walcast/walcast/internal/tlsfiles"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func writePair(t *testing.T, ca *pki.CA, dir, cn string) (string, string) {
	t.Helper()
	l := pki.Localhost()
	l.CommonName = cn
	c, k, err := ca.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	cert, key := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	if err := errors.Join(pki.WriteFile(key, k, 0o600), pki.WriteFile(cert, c, 0o644)); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// serve runs an HTTPS server on a listener of the package and returns its
// address.
func serve(t *testing.T, s *tlsfiles.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(r.Proto))
	}), TLSConfig: s.Config(), ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.Serve(tlsfiles.Listener(ln, srv.TLSConfig)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

func peerCN(t *testing.T, addr string, roots *x509.CertPool) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// A rotated certificate is served from the next handshake on, without a
// restart; a rotation caught half way keeps the old one.
func TestR9_8_CertificateReload(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, key := writePair(t, ca, dir, "first")
	s, err := tlsfiles.NewServer(tlsfiles.ServerFiles{CertFile: cert, KeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, s)
	if cn := peerCN(t, addr, ca.Pool()); cn != "first" {
		t.Fatalf("served %q", cn)
	}
	if changed, err := s.Reload(); changed || err != nil {
		t.Fatalf("reload of unchanged files: %v %v", changed, err)
	}
	writePair(t, ca, dir, "second")
	if changed, err := s.Reload(); !changed || err != nil {
		t.Fatalf("reload after rotation: %v %v", changed, err)
	}
	if cn := peerCN(t, addr, ca.Pool()); cn != "second" {
		t.Fatalf("served %q after the rotation", cn)
	}
	// Half a rotation: a new certificate whose key is not written yet.
	l := pki.Localhost()
	l.CommonName = "third"
	c3, _, err := ca.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteFile(cert, c3, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reload(); !errors.Is(err, tlsfiles.ErrInvalid) {
		t.Fatalf("reload of a mismatched pair: %v", err)
	}
	if cn := peerCN(t, addr, ca.Pool()); cn != "second" {
		t.Fatalf("served %q after a failed reload, want the previous one", cn)
	}
}

// A plain-HTTP client of a TLS port is told to use TLS, an h2c client gets
// the same in a GOAWAY, and a TLS client gets HTTP/2.
func TestR9_8_PlainTextToTLSPort(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, key := writePair(t, ca, dir, "srv")
	s, err := tlsfiles.NewServer(tlsfiles.ServerFiles{CertFile: cert, KeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, s)

	res, err := http.Post("http://"+addr+"/walcast.api.v1.BroadcastService/ListTasks", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest || !bytes.Contains(body, []byte(tlsfiles.PlainTextHint)) ||
		!bytes.Contains(body, []byte(`"code":"failed_precondition"`)) {
		t.Fatalf("plain HTTP: %d %s", res.StatusCode, body)
	}

	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: &http.Transport{Protocols: &protos}}
	defer h2c.CloseIdleConnections()
	grpc := walcastv1connect.NewBroadcastServiceClient(h2c, "http://"+addr, connect.WithGRPC())
	_, err = grpc.ListTasks(context.Background(), connect.NewRequest(&walcastv1.ListTasksRequest{}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), tlsfiles.PlainTextHint) {
		t.Fatalf("gRPC over h2c: %v, want failed_precondition with the hint", err)
	}

	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	res, err = (&http.Client{Transport: tr}).Get("https://127.0.0.1:" + strings.Split(addr, ":")[1] + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if string(body) != "HTTP/2.0" {
		t.Fatalf("TLS client got %s", body)
	}
}

func TestClientFiles(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := tlsfiles.Client(tlsfiles.ClientFiles{CAFile: caFile}); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]tlsfiles.ClientFiles{
		"missing CA":   {CAFile: filepath.Join(dir, "nope")},
		"not PEM":      {CAFile: filepath.Join(dir, "ca.crt") + "x"},
		"cert alone":   {CertFile: caFile},
		"key mismatch": {CertFile: caFile, KeyFile: caFile},
	} {
		if _, err := tlsfiles.Client(f); !errors.Is(err, tlsfiles.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := tlsfiles.NewServer(tlsfiles.ServerFiles{CertFile: caFile}); !errors.Is(err, tlsfiles.ErrInvalid) {
		t.Errorf("server without key: %v", err)
	}
}
