package auth_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/auth"
	"github.com/walcast/walcast/internal/pki"
)

// fixture is an authenticator over a token file and a client CA, served by
// a TLS test server whose handler echoes the identity it was given.
type fixture struct {
	ca, otherCA *pki.CA
	tokens      map[string]string // name -> token
	srv         *httptest.Server
	audit       *bytes.Buffer
	auditMu     *sync.Mutex
	reached     map[string]int // procedure -> calls that reached the handler
	mu          sync.Mutex
}

type lockedBuffer struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{tokens: map[string]string{}, audit: &bytes.Buffer{}, auditMu: &sync.Mutex{}, reached: map[string]int{}}
	var err error
	if f.ca, err = pki.NewCA("test CA", time.Hour); err != nil {
		t.Fatal(err)
	}
	if f.otherCA, err = pki.NewCA("other CA", time.Hour); err != nil {
		t.Fatal(err)
	}
	path := tokenFile(t)
	for _, r := range auth.IdentityRoles {
		tok, _, err := auth.CreateToken(path, r.String()+"-user", r, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		f.tokens[r.String()] = tok
	}
	expired, _, err := auth.CreateToken(path, "late", auth.Admin, time.Now().Add(-time.Second))
	if err != nil {
		t.Fatal(err)
	}
	f.tokens["expired"] = expired
	ts, err := auth.OpenTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	a := auth.NewAuthenticator(auth.Options{Tokens: ts, ClientCAs: f.ca.Pool})
	audit := auth.NewAudit(lockedBuffer{f.auditMu, f.audit})
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.reached[r.URL.Path]++
		f.mu.Unlock()
		id, ok := auth.FromContext(r.Context())
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": ok, "name": id.Name, "role": id.Role.String(), "method": id.Method})
	})
	f.srv = httptest.NewUnstartedServer(a.Middleware(echo, audit))
	f.srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	f.srv.EnableHTTP2 = true
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

// client returns an HTTP client trusting the test server, presenting cert
// if not nil.
func (f *fixture) client(t *testing.T, cert *tls.Certificate) *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(f.srv.Certificate())
	tc := &tls.Config{RootCAs: pool}
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	tr := &http.Transport{TLSClientConfig: tc}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func (f *fixture) cert(t *testing.T, ca *pki.CA, cn string, ous ...string) *tls.Certificate {
	c, err := ca.IssuePair(pki.Leaf{CommonName: cn, OrganizationalUnits: ous, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

// call posts a Connect JSON request and returns the HTTP status and body.
func call(t *testing.T, c *http.Client, url, bearer string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(res.Body).Decode(&body)
	return res.StatusCode, body
}

func TestR9_8_MiddlewareCodes(t *testing.T) {
	f := newFixture(t)
	plain := f.client(t, nil)
	bcast := f.srv.URL + walcastv1connect.BroadcastServiceBroadcastProcedure
	complete := f.srv.URL + walcastv1connect.BroadcastServiceCompleteCallbackProcedure
	ack := f.srv.URL + walcastv1connect.BroadcastServiceAckProcedure
	for _, tc := range []struct {
		name   string
		client *http.Client
		url    string
		token  string
		code   string // "" means let through
		who    string
	}{
		{"no credentials", plain, bcast, "", "unauthenticated", ""},
		{"reader broadcasts", plain, bcast, f.tokens["reader"], "permission_denied", ""},
		{"writer broadcasts", plain, bcast, f.tokens["writer"], "", "writer-user"},
		{"writer completes", plain, complete, f.tokens["writer"], "permission_denied", ""},
		{"admin completes", plain, complete, f.tokens["admin"], "", "admin-user"},
		{"node acks", plain, ack, f.tokens["node"], "", "node-user"},
		{"node broadcasts", plain, bcast, f.tokens["node"], "permission_denied", ""},
		{"writer acks", plain, ack, f.tokens["writer"], "permission_denied", ""},
		{"expired admin", plain, complete, f.tokens["expired"], "unauthenticated", ""},
		{"malformed token", plain, bcast, "wct_x", "unauthenticated", ""},
		{"procedure not in the table", plain, f.srv.URL + "/walcast.api.v1.BroadcastService/Nope", f.tokens["admin"], "permission_denied", ""},
		{"certificate writer", f.client(t, f.cert(t, f.ca, "carol", "walcast:writer")), bcast, "", "", "carol"},
		{"certificate reader", f.client(t, f.cert(t, f.ca, "dave", "walcast:reader")), bcast, "", "permission_denied", ""},
		{"certificate without role", f.client(t, f.cert(t, f.ca, "erin")), bcast, "", "permission_denied", ""},
		{"certificate of another CA", f.client(t, f.cert(t, f.otherCA, "mallory", "walcast:admin")), bcast, "", "unauthenticated", ""},
		{"another CA with a good token", f.client(t, f.cert(t, f.otherCA, "mallory", "walcast:admin")), bcast, f.tokens["admin"], "unauthenticated", ""},
		{"token beats certificate", f.client(t, f.cert(t, f.ca, "carol", "walcast:writer")), complete, f.tokens["admin"], "", "admin-user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := call(t, tc.client, tc.url, tc.token)
			if tc.code == "" {
				if status != http.StatusOK || body["name"] != tc.who || body["ok"] != true {
					t.Fatalf("status %d, body %v; want through as %s", status, body, tc.who)
				}
				return
			}
			if body["code"] != tc.code {
				t.Fatalf("status %d, body %v; want code %s", status, body, tc.code)
			}
			msg, _ := body["message"].(string)
			if tc.token != "" && len(tc.token) > 20 && strings.Contains(msg, tc.token[20:]) {
				t.Fatalf("message %q echoes the token", msg)
			}
		})
	}
	// Paths outside the RPC namespace are the handlers' own business.
	if status, body := call(t, plain, f.srv.URL+"/healthz", ""); status != http.StatusOK || body["ok"] != false {
		t.Fatalf("/healthz: %d %v", status, body)
	}
	// Refused calls never reached the handler: Nope and every refused
	// broadcast stopped in the middleware.
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.reached["/walcast.api.v1.BroadcastService/Nope"]; n != 0 {
		t.Fatalf("a procedure missing from the table reached the handler %d times", n)
	}
	if n := f.reached[walcastv1connect.BroadcastServiceBroadcastProcedure]; n != 2 {
		t.Fatalf("Broadcast reached the handler %d times, want 2 (writer token, writer certificate)", n)
	}
}

// A gRPC client gets the refusal as a gRPC status (the middleware answers
// in the request's protocol).
func TestR9_8_MiddlewareGRPC(t *testing.T) {
	f := newFixture(t)
	pool := x509.NewCertPool()
	pool.AddCert(f.srv.Certificate())
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	c := walcastv1connect.NewBroadcastServiceClient(&http.Client{Transport: tr}, f.srv.URL, connect.WithGRPC())
	_, err := c.RetryCallback(context.Background(), connect.NewRequest(&walcastv1.RetryCallbackRequest{Id: 1}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("gRPC call without credentials: %v, want Unauthenticated", err)
	}
	req := connect.NewRequest(&walcastv1.RetryCallbackRequest{Id: 1})
	req.Header().Set("Authorization", "Bearer "+f.tokens["reader"])
	if _, err := c.RetryCallback(context.Background(), req); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("gRPC call as reader: %v, want PermissionDenied", err)
	}
}

// Every refusal is audited with who and why, never with the credential.
func TestR9_8_RefusalsAudited(t *testing.T) {
	f := newFixture(t)
	plain := f.client(t, nil)
	call(t, plain, f.srv.URL+walcastv1connect.BroadcastServiceRetryCallbackProcedure, f.tokens["reader"])
	call(t, plain, f.srv.URL+walcastv1connect.BroadcastServiceRetryCallbackProcedure, "")
	f.auditMu.Lock()
	out := f.audit.String()
	f.auditMu.Unlock()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("audit has %d lines, want 2:\n%s", len(lines), out)
	}
	var first, second map[string]any
	if err := errors.Join(json.Unmarshal([]byte(lines[0]), &first), json.Unmarshal([]byte(lines[1]), &second)); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if first["who"] != "reader-user" || first["role"] != "reader" || first["result"] != "permission_denied" ||
		first["rpc"] != walcastv1connect.BroadcastServiceRetryCallbackProcedure || first["msg"] != "refused" {
		t.Fatalf("first line %v", first)
	}
	if second["who"] != "anonymous" || second["result"] != "unauthenticated" {
		t.Fatalf("second line %v", second)
	}
	for _, tok := range f.tokens {
		if strings.Contains(out, tok[len(tok)-43:]) {
			t.Fatal("the audit log holds a token secret")
		}
	}
}

// denyingBroadcast refuses every Broadcast the way a handler's own check
// (a metadata privilege) does.
type denyingBroadcast struct {
	walcastv1connect.UnimplementedBroadcastServiceHandler
}

func (denyingBroadcast) Broadcast(context.Context, *connect.Request[walcastv1.BroadcastRequest]) (*connect.Response[walcastv1.BroadcastResponse], error) {
	return nil, connect.NewError(connect.CodePermissionDenied, errors.New("no privilege"))
}

// The interceptor records admin actions and handler refusals with their
// target: idempotency keys as fingerprints only, payloads by size only.
func TestR9_8_AdminActionsAudited(t *testing.T) {
	path := tokenFile(t)
	admin, _, err := auth.CreateToken(path, "ops", auth.Admin, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	ts, err := auth.OpenTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	var mu sync.Mutex
	audit := auth.NewAudit(lockedBuffer{&mu, &buf})
	mux := http.NewServeMux()
	mux.Handle(walcastv1connect.NewMetaServiceHandler(walcastv1connect.UnimplementedMetaServiceHandler{}, connect.WithInterceptors(audit.Interceptor())))
	mux.Handle(walcastv1connect.NewBroadcastServiceHandler(denyingBroadcast{}, connect.WithInterceptors(audit.Interceptor())))
	srv := httptest.NewServer(auth.NewAuthenticator(auth.Options{Tokens: ts}).Middleware(mux, audit))
	defer srv.Close()
	withToken := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
			r.Header().Set("Authorization", "Bearer "+admin)
			r.Header().Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
			return next(ctx, r)
		}
	}))
	meta := walcastv1connect.NewMetaServiceClient(srv.Client(), srv.URL, withToken)
	bc := walcastv1connect.NewBroadcastServiceClient(srv.Client(), srv.URL, withToken)
	ctx := context.Background()
	_, err = meta.CreateUser(ctx, connect.NewRequest(&walcastv1.CreateUserRequest{Name: "alice", IdempotencyKey: "raw-key-do-not-log"}))
	if connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("CreateUser: %v", err)
	}
	_, err = meta.ListUsers(ctx, connect.NewRequest(&walcastv1.ListUsersRequest{})) // a reader call: not audited
	if connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("ListUsers: %v", err)
	}
	_, err = bc.Broadcast(ctx, connect.NewRequest(&walcastv1.BroadcastRequest{Type: "Generic.v1", Payload: []byte("secret payload"),
		Vchannels: []string{"wal-1/a"}, IdempotencyKey: "1:0:another-raw-key"}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("Broadcast: %v", err)
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	for _, secret := range []string{"raw-key-do-not-log", "another-raw-key", "secret payload", admin[len(admin)-43:]} {
		if strings.Contains(out, secret) {
			t.Fatalf("audit log holds %q:\n%s", secret, out)
		}
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d audit lines, want 2 (CreateUser, the refused Broadcast):\n%s", len(lines), out)
	}
	type line struct {
		RPC     string         `json:"rpc"`
		Who     string         `json:"who"`
		Role    string         `json:"role"`
		Result  string         `json:"result"`
		TraceID string         `json:"trace_id"`
		Target  map[string]any `json:"target"`
	}
	var cu, b line
	if err := errors.Join(json.Unmarshal([]byte(lines[0]), &cu), json.Unmarshal([]byte(lines[1]), &b)); err != nil {
		t.Fatal(err)
	}
	if cu.RPC != walcastv1connect.MetaServiceCreateUserProcedure || cu.Who != "ops" || cu.Role != "admin" || cu.Result != "unimplemented" ||
		cu.Target["name"] != "alice" || cu.Target["idempotency_key_fingerprint"] == nil || cu.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("CreateUser line: %+v\n%s", cu, lines[0])
	}
	if b.Result != "permission_denied" || b.Target["payload_bytes"] != float64(len("secret payload")) || b.Target["type"] != "Generic.v1" {
		t.Fatalf("Broadcast line: %+v\n%s", b, lines[1])
	}
}

func TestRequireRole(t *testing.T) {
	path := tokenFile(t)
	reader, _, err := auth.CreateToken(path, "r", auth.Reader, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	admin, _, err := auth.CreateToken(path, "a", auth.Admin, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	ts, err := auth.OpenTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := auth.FromContext(r.Context())
		_, _ = w.Write([]byte(id.Name))
	})
	h := auth.NewAuthenticator(auth.Options{Tokens: ts}).RequireRole(auth.Admin, ok, nil)
	for tok, want := range map[string]int{"": http.StatusUnauthorized, reader: http.StatusForbidden, admin: http.StatusOK} {
		req := httptest.NewRequest(http.MethodPost, "/console/tasks/1/retry", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("status %d, want %d: %s", rec.Code, want, rec.Body)
		}
		if want == http.StatusOK && rec.Body.String() != "a" {
			t.Errorf("identity %q reached the handler, want a", rec.Body)
		}
	}
	var none *auth.Authenticator
	if none.RequireRole(auth.Admin, ok, nil) == nil {
		t.Fatal("nil authenticator")
	}
}
