package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/auth"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/internal/longtest"
	"github.com/walcast/walcast/internal/pki"
	"github.com/walcast/walcast/meta"
	"github.com/walcast/walcast/server"
)

// secureEnv is a secure standalone (api.secure: TLS, tokens, client
// certificates of its local CA) running the metadata service, with a
// token and a certificate of every role.
type secureEnv struct {
	p      *server.Process
	files  server.SecureFiles
	base   string // https://127.0.0.1:port
	roots  *x509.CertPool
	tokens map[string]string          // role name, "expired", "revoked" -> token
	certs  map[string]tls.Certificate // role name, "foreign" (another CA) -> client certificate
	audit  string                     // the audit file
}

func startSecure(t *testing.T, mod ...func(*server.Config)) *secureEnv {
	t.Helper()
	cfg := server.Default()
	cfg.DataDir = t.TempDir()
	cfg.API.Addr = "127.0.0.1:0"
	cfg.Metrics.Addr = ""
	cfg.Log.Level = "error"
	cfg.API.Secure = true
	cfg.Audit.File = filepath.Join(cfg.DataDir, "audit.log")
	for _, m := range mod {
		m(&cfg)
	}
	// Make the secure files first, to add tokens before the server reads
	// the token file; StartStandalone then reuses them.
	_, files, err := server.SetupSecure(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &secureEnv{files: files, tokens: map[string]string{}, certs: map[string]tls.Certificate{}, audit: cfg.Audit.File}
	for _, r := range auth.IdentityRoles {
		if e.tokens[r.String()], _, err = auth.CreateToken(files.TokenFile, r.String()+"_user", r, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	if e.tokens["expired"], _, err = auth.CreateToken(files.TokenFile, "late", auth.Admin, time.Now().Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	var revoked auth.TokenRecord
	if e.tokens["revoked"], revoked, err = auth.CreateToken(files.TokenFile, "gone", auth.Admin, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if _, err := auth.RevokeTokens(files.TokenFile, revoked.ID); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(files.CACert, files.CAKey)
	if err != nil {
		t.Fatal(err)
	}
	e.roots = ca.Pool()
	for _, r := range auth.IdentityRoles {
		if e.certs[r.String()], err = ca.IssuePair(pki.Leaf{CommonName: r.String() + "_cert", Client: true,
			OrganizationalUnits: []string{auth.CertRolePrefix + r.String()}}); err != nil {
			t.Fatal(err)
		}
	}
	other, err := pki.NewCA("someone else's CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if e.certs["foreign"], err = other.IssuePair(pki.Leaf{CommonName: "mallory", Client: true,
		OrganizationalUnits: []string{auth.CertRolePrefix + "admin"}}); err != nil {
		t.Fatal(err)
	}
	mc := meta.Config{PChannels: cfg.PChannelNames(), ImportRoot: cfg.ImportRoot(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	app, err := meta.NewApp(mc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if e.p, err = server.StartStandalone(ctx, cfg, app); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.p.Close() })
	e.base = "https://" + e.p.APIAddr()
	return e
}

// httpClient trusts the local CA and presents cert if not nil.
func (e *secureEnv) httpClient(t *testing.T, cert *tls.Certificate) *http.Client {
	tc := &tls.Config{RootCAs: e.roots}
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// client is a walcast client of the process with opts.
func (e *secureEnv) client(t *testing.T, opts ...client.Option) *client.Client {
	c, err := client.New([]string{e.p.APIAddr()}, append([]client.Option{client.WithTLS(&tls.Config{RootCAs: e.roots}),
		client.WithMaxAttempts(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// rawCall posts "{}" to procedure over the Connect protocol (JSON) and
// returns the code ("" for success) and message.
func rawCall(t *testing.T, c *http.Client, url, token string) (string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode == http.StatusOK {
		return "", ""
	}
	var body struct{ Code, Message string }
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		t.Fatalf("%s: status %d, undecodable body: %v", url, res.StatusCode, err)
	}
	return body.Code, body.Message
}

// catalogOf is every key and value of the catalog.
func catalogOf(t *testing.T, p *server.Process) map[string]string {
	t.Helper()
	b, err := p.Coord.Current()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Catalog().List(ctx, "", func(k string, v []byte) error { out[k] = string(v); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestR9_8_EveryRPCEveryCredential calls every procedure of every service
// without credentials, with an expired and a revoked token, with a client
// certificate of another CA (Unauthenticated), and with a token and a
// certificate of each role (PermissionDenied unless the role table allows
// it), and checks that the refused calls changed nothing in the catalog.
func TestR9_8_EveryRPCEveryCredential(t *testing.T) {
	e := startSecure(t)
	plain := e.httpClient(t, nil)
	certClients := map[string]*http.Client{}
	for name, c := range e.certs {
		certClients[name] = e.httpClient(t, &c)
	}
	before := catalogOf(t, e.p)
	// Every unary procedure: the API's, and the health check (streams are
	// checked by the same middleware; a plain POST cannot call them).
	var procs []string
	for _, proc := range slices.Sorted(maps.Keys(auth.Procedures())) {
		if strings.HasPrefix(proc, "/walcast.api.v1.") || proc == "/grpc.health.v1.Health/Check" {
			procs = append(procs, proc)
		}
	}
	type allowed struct{ proc, who, token string }
	var through []allowed
	refused := 0
	for _, proc := range procs {
		need, _ := auth.Required(proc)
		url := e.base + proc
		if need == auth.Public {
			if code, msg := rawCall(t, plain, url, ""); code != "" {
				t.Errorf("%s without credentials: %q %q, want through (public)", proc, code, msg)
			}
			continue
		}
		for name, c := range map[string]struct {
			hc    *http.Client
			token string
		}{"no credentials": {plain, ""}, "expired token": {plain, e.tokens["expired"]}, "revoked token": {plain, e.tokens["revoked"]},
			"certificate of another CA": {certClients["foreign"], ""}} {
			if code, msg := rawCall(t, c.hc, url, c.token); code != "unauthenticated" {
				t.Errorf("%s with %s: %q %q, want unauthenticated", proc, name, code, msg)
			}
			refused++
		}
		for _, r := range auth.IdentityRoles {
			for how, call := range map[string]func() (string, string){
				"token":       func() (string, string) { return rawCall(t, plain, url, e.tokens[r.String()]) },
				"certificate": func() (string, string) { return rawCall(t, certClients[r.String()], url, "") },
			} {
				if r.Satisfies(need) {
					through = append(through, allowed{proc, r.String() + " " + how, e.tokens[r.String()]})
					continue
				}
				if code, msg := call(); code != "permission_denied" {
					t.Errorf("%s as %s %s: %q %q, want permission_denied", proc, r, how, code, msg)
				}
				refused++
			}
		}
	}
	if after := catalogOf(t, e.p); !maps.Equal(before, after) {
		t.Fatalf("%d refused calls changed the catalog", refused)
	}
	// The calls the table allows get past authentication: "{}" is invalid
	// or a read for every procedure, so these change nothing either.
	// Metadata DDL of non-admins stops at its missing privilege.
	for _, a := range through {
		if a.proc == "/walcast.api.v1.ReplicationService/Configure" {
			// An empty topology is accepted (it broadcasts "no
			// replication"), so this one changes the catalog.
			continue
		}
		hc := plain
		token := a.token
		if strings.HasSuffix(a.who, "certificate") {
			hc, token = certClients[strings.Fields(a.who)[0]], ""
		}
		code, msg := rawCall(t, hc, e.base+a.proc, token)
		switch {
		case code == "unauthenticated":
			t.Errorf("%s as %s: unauthenticated: %s", a.proc, a.who, msg)
		case code == "permission_denied" && !(strings.Contains(a.proc, "MetaService") && strings.Contains(msg, "needs privilege")):
			t.Errorf("%s as %s: permission_denied: %s", a.proc, a.who, msg)
		}
	}
	if after := catalogOf(t, e.p); !maps.Equal(before, after) {
		for k, v := range after {
			if before[k] != v {
				t.Errorf("changed: %s = %q", k, v)
			}
		}
		t.Fatal("calls with empty requests changed the catalog")
	}
	// Every refusal is in the audit log, and no token is.
	raw, err := os.ReadFile(e.audit)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(raw), `"msg":"refused"`); n != refused {
		t.Errorf("audit log has %d refusals, want %d", n, refused)
	}
	for name, tok := range e.tokens {
		if strings.Contains(string(raw), tok[len(tok)-43:]) {
			t.Errorf("audit log holds the %s token", name)
		}
	}
}

// The Go client reports refusals as ErrUnauthenticated and
// ErrPermissionDenied, over the Connect protocol and over gRPC, and does
// not retry them.
func TestR9_8_ClientErrors(t *testing.T) {
	e := startSecure(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, grpc := range []bool{false, true} {
		var opts []client.Option
		if grpc {
			opts = append(opts, client.WithGRPC())
		}
		_, err := e.client(t, opts...).ListTasks(ctx, nil)
		if !errors.Is(err, client.ErrUnauthenticated) {
			t.Errorf("grpc=%v, no token: %v, want ErrUnauthenticated", grpc, err)
		}
		err = e.client(t, append(opts, client.WithToken(e.tokens["reader"]))...).RetryCallback(ctx, 1)
		if !errors.Is(err, client.ErrPermissionDenied) {
			t.Errorf("grpc=%v, reader retries a callback: %v, want ErrPermissionDenied", grpc, err)
		}
		if _, err := e.client(t, append(opts, client.WithTokenFile(e.files.AdminToken))...).ListTasks(ctx, nil); err != nil {
			t.Errorf("grpc=%v, admin token file: %v", grpc, err)
		}
		cert := e.certs["writer"]
		tc := &tls.Config{RootCAs: e.roots, Certificates: []tls.Certificate{cert}}
		if _, err := e.client(t, append(opts, client.WithTLS(tc))...).ListLocks(ctx); err != nil {
			t.Errorf("grpc=%v, writer certificate: %v", grpc, err)
		}
	}
}

// TLS mistakes fail at once with an error that says what to change: a
// client without the CA, a plain-HTTP client of the TLS port, a TLS client
// of a plain port, and a client without a certificate where one is
// required.
func TestR9_8_TLSErrorsAreClear(t *testing.T) {
	e := startSecure(t)
	check := func(name string, c *client.Client, hint string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		start := time.Now()
		_, err := c.ListTasks(ctx, nil)
		if !errors.Is(err, client.ErrTLS) || !strings.Contains(err.Error(), hint) {
			t.Errorf("%s: %v, want ErrTLS saying %q", name, err, hint)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("%s: took %v: TLS failures must not be retried", name, d)
		}
	}
	newClient := func(addr string, opts ...client.Option) *client.Client {
		c, err := client.New([]string{addr}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	check("no CA", newClient(e.p.APIAddr(), client.WithTLS(nil), client.WithTokenFile(e.files.AdminToken)), "--tls-ca")
	check("plain HTTP to the TLS port", newClient("http://"+e.p.APIAddr()), "https://")
	check("gRPC without TLS to the TLS port", newClient("http://"+e.p.APIAddr(), client.WithGRPC()), "https://")
	check("wrong name", newClient(e.p.APIAddr(), client.WithTLS(&tls.Config{RootCAs: e.roots, ServerName: "walcast.invalid"})), "--tls-server-name")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	plainSrv := standalone(t, ctx, "plain")
	defer plainSrv.Close()
	check("TLS to a plain port", newClient(plainSrv.APIAddr(), client.WithTLS(&tls.Config{RootCAs: e.roots})), "http://")

	strict := startSecure(t, func(c *server.Config) { c.API.TLS.RequireClientCert = true })
	check("no client certificate where one is required", newClient(strict.p.APIAddr(), client.WithTLS(&tls.Config{RootCAs: strict.roots}),
		client.WithTokenFile(strict.files.AdminToken)), "--tls-cert")
	cert := strict.certs["reader"]
	if _, err := newClient(strict.p.APIAddr(), client.WithTLS(&tls.Config{RootCAs: strict.roots, Certificates: []tls.Certificate{cert}})).ListTasks(ctx, nil); err != nil {
		t.Errorf("with the required certificate: %v", err)
	}
}

// TestR9_8_MetaPrivilegesEnforced: with authentication on, a writer's
// metadata DDL needs the privilege granted to the metadata user named like
// its token, on the object it touches. A user with Query on one collection
// can neither create an index on it nor touch another collection; the
// refusals change nothing; granting the privilege makes the same call
// succeed; admins need no grants.
func TestR9_8_MetaPrivilegesEnforced(t *testing.T) {
	e := startSecure(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := e.client(t, client.WithTokenFile(e.files.AdminToken))
	for _, step := range []func() error{
		func() error {
			_, err := admin.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "shop"})
			return err
		},
		func() error {
			_, err := admin.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "shop", Name: "orders"})
			return err
		},
		func() error {
			_, err := admin.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "shop", Name: "items"})
			return err
		},
		func() error { _, err := admin.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: "alice"}); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	grant := func(priv, db, coll string) {
		t.Helper()
		if _, err := admin.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: &walcastv1.Grant{User: "alice",
			Privilege: priv, Database: db, Collection: coll}}); err != nil {
			t.Fatal(err)
		}
	}
	grant("Query", "shop", "orders")
	aliceTok, _, err := auth.CreateToken(e.files.TokenFile, "alice", auth.Writer, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.p.Reload(); err != nil {
		t.Fatal(err)
	}
	alice := e.client(t, client.WithToken(aliceTok))

	createIndex := func(coll string) error {
		_, err := alice.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "shop", Collection: coll, Name: "idx_" + coll, Field: "vector"})
		return err
	}
	before := catalogOf(t, e.p)
	for name, call := range map[string]func() error{
		"index on the collection she may query": func() error { return createIndex("orders") },
		"index on another collection":           func() error { return createIndex("items") },
		"describe another collection": func() error {
			_, err := alice.DescribeCollection(ctx, "shop", "items")
			return err
		},
		"drop another collection": func() error {
			_, err := alice.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "shop", Name: "items"})
			return err
		},
		"create a collection": func() error {
			_, err := alice.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "shop", Name: "mine"})
			return err
		},
		"create a database": func() error {
			_, err := alice.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "hers"})
			return err
		},
		"import into the collection": func() error {
			_, err := alice.Import(ctx, &walcastv1.ImportRequest{Database: "shop", Collection: "orders", Files: []string{"a.json"}})
			return err
		},
		"grant herself CreateIndex (DCL is admin's)": func() error {
			_, err := alice.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: &walcastv1.Grant{User: "alice",
				Privilege: "CreateIndex", Database: "shop", Collection: "orders"}})
			return err
		},
	} {
		if err := call(); !errors.Is(err, client.ErrPermissionDenied) {
			t.Errorf("%s: %v, want ErrPermissionDenied", name, err)
		}
	}
	if after := catalogOf(t, e.p); !maps.Equal(before, after) {
		t.Fatal("refused metadata calls changed the catalog")
	}
	// Listings need no privilege.
	if _, err := alice.ListCollections(ctx, "shop"); err != nil {
		t.Fatalf("list collections: %v", err)
	}

	grant("CreateIndex", "shop", "orders")
	if err := createIndex("orders"); err != nil {
		t.Fatalf("index after the grant: %v", err)
	}
	if err := createIndex("items"); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("index on items after a grant on orders: %v", err)
	}
	grant("All", "shop", "*")
	if err := createIndex("items"); err != nil {
		t.Fatalf("index on items with All on shop.*: %v", err)
	}
	if _, err := alice.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "shop", Name: "mine"}); err != nil {
		t.Fatalf("create a collection with All on shop.*: %v", err)
	}
	if _, err := alice.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "hers"}); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("create a database with All on shop.*: %v, want ErrPermissionDenied", err)
	}

	// A reader with every privilege is still a reader: the role table
	// comes first.
	if _, err := admin.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: "reader_user"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: &walcastv1.Grant{User: "reader_user",
		Privilege: "All", Database: "*", Collection: "*"}}); err != nil {
		t.Fatal(err)
	}
	reader := e.client(t, client.WithToken(e.tokens["reader"]))
	if _, err := reader.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "shop", Collection: "items", Name: "r", Field: "vector"}); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("reader with All creates an index: %v", err)
	}
	if _, err := reader.DescribeCollection(ctx, "shop", "items"); err != nil {
		t.Fatalf("reader with All describes: %v", err)
	}
}

// A token revoked while the server runs is refused from the next reload
// on (every api.reload_interval, or at once on SIGHUP: Process.Reload).
func TestR9_8_RevokeWhileRunning(t *testing.T) {
	longtest.Require(t)
	e := startSecure(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tok, rec, err := auth.CreateToken(e.files.TokenFile, "temp", auth.Reader, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.p.Reload(); err != nil {
		t.Fatal(err)
	}
	c := e.client(t, client.WithToken(tok))
	if _, err := c.ListTasks(ctx, nil); err != nil {
		t.Fatalf("new token: %v", err)
	}
	if _, err := auth.RevokeTokens(e.files.TokenFile, rec.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.p.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListTasks(ctx, nil); !errors.Is(err, client.ErrUnauthenticated) {
		t.Fatalf("revoked token: %v, want ErrUnauthenticated", err)
	}
	// Without an explicit reload the watcher picks a change up too.
	tok2, _, err := auth.CreateToken(e.files.TokenFile, "temp2", auth.Reader, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	c2 := e.client(t, client.WithToken(tok2))
	waitUntil(t, "the watcher to load the new token", func() bool {
		_, err := c2.ListTasks(ctx, nil)
		return err == nil
	})
}

// TestR9_8_EveryServedServiceIsInTheTable lists, through reflection, every
// service a running secure process serves, and checks that each of its
// methods has a role in the table: a service mounted without entries (a
// new RPC, a new handler) would be refused to everyone, or worse, reveal
// that the table was forgotten. Reflection itself needs a reader.
func TestR9_8_EveryServedServiceIsInTheTable(t *testing.T) {
	e := startSecure(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := e.httpClient(t, nil)
	rc := grpcreflect.NewClient(hc, e.base, connect.WithGRPC())
	if _, err := rc.NewStream(ctx).ListServices(); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("reflection without credentials: %v, want Unauthenticated", err)
	}
	h := http.Header{}
	h.Set("Authorization", "Bearer "+e.tokens["reader"])
	stream := rc.NewStream(ctx, grpcreflect.WithRequestHeaders(h))
	defer stream.Close()
	names, err := stream.ListServices()
	if err != nil {
		t.Fatal(err)
	}
	table := auth.Procedures()
	for _, name := range names {
		prefix := "/" + string(name) + "/"
		n := 0
		for p := range table {
			if strings.HasPrefix(p, prefix) {
				n++
			}
		}
		if n == 0 {
			t.Errorf("served service %s has no procedure in the role table", name)
		}
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
		if err != nil {
			continue // the health and reflection services register under other names
		}
		sd := d.(protoreflect.ServiceDescriptor)
		for i := range sd.Methods().Len() {
			if _, ok := table[prefix+string(sd.Methods().Get(i).Name())]; !ok {
				t.Errorf("%s%s has no role", prefix, sd.Methods().Get(i).Name())
			}
		}
	}
	if len(names) < 6 {
		t.Fatalf("reflection lists %v", names)
	}
}

// metrics.tls serves /metrics with the API's certificate.
func TestR9_8_MetricsOverTLS(t *testing.T) {
	e := startSecure(t, func(c *server.Config) { c.Metrics.Addr = "127.0.0.1:0"; c.Metrics.TLS = true })
	if !strings.Contains(e.p.ReadyLine("standalone"), "metrics=https://") {
		t.Fatalf("ready line: %s", e.p.ReadyLine("standalone"))
	}
	res, err := e.httpClient(t, nil).Get("https://" + e.p.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "go_goroutines") {
		t.Fatalf("metrics over TLS: %d %.200s", res.StatusCode, body)
	}
	res, err = http.Get("http://" + e.p.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Fatalf("plain HTTP to the TLS metrics port: %d", res.StatusCode)
	}
}

// The web console's actions go to the audit log like the RPCs' admin
// actions, refusals included.
func TestR9_8_ConsoleActionsAudited(t *testing.T) {
	e := startSecure(t)
	req, err := http.NewRequest(http.MethodPost, e.base+"/ui/tasks/1/retry", strings.NewReader("csrf=x"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+e.tokens["reader"])
	res, err := e.httpClient(t, nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("a reader's retry: %d", res.StatusCode)
	}
	raw, err := os.ReadFile(e.audit)
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var l map[string]any
		if json.Unmarshal([]byte(line), &l) == nil && l["rpc"] == "/ui/tasks/1/retry" {
			found = l["msg"] == "refused" && l["who"] == "reader_user" && l["role"] == "reader" && l["result"] == "permission_denied"
			if !found {
				t.Fatalf("audit line %s", line)
			}
		}
	}
	if !found {
		t.Fatalf("no audit line for the console action:\n%s", raw)
	}
}

// TestR9_8_MetaPrivilegesFollowTheirObjects: through the API with
// authentication on, a grant on a collection that does not exist is
// refused; a grant survives a rename (it names the collection's id); and
// after a drop and a recreate under the same name the user can no longer
// do what the grant allowed on the old collection.
func TestR9_8_MetaPrivilegesFollowTheirObjects(t *testing.T) {
	e := startSecure(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := e.client(t, client.WithTokenFile(e.files.AdminToken))
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := admin.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "shop"})
	must(err)
	_, err = admin.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "shop", Name: "orders"})
	must(err)
	_, err = admin.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: "alice"})
	must(err)
	grant := func(coll string) error {
		_, err := admin.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: &walcastv1.Grant{User: "alice",
			Privilege: "All", Database: "shop", Collection: coll}})
		return err
	}
	if err := grant("missing"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("grant on a missing collection: %v, want ErrNotFound", err)
	}
	must(grant("orders"))
	tok, _, err := auth.CreateToken(e.files.TokenFile, "alice", auth.Writer, time.Time{})
	must(err)
	must(e.p.Reload())
	alice := e.client(t, client.WithToken(tok))
	index := func(coll, name string) error {
		_, err := alice.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "shop", Collection: coll, Name: name, Field: "vector"})
		return err
	}
	must(index("orders", "i1"))
	_, err = admin.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "shop", OldName: "orders", NewName: "purchases"})
	must(err)
	if _, err := alice.DropIndex(ctx, &walcastv1.DropIndexRequest{Database: "shop", Collection: "purchases", Name: "i1"}); err != nil {
		t.Fatalf("drop an index after a rename: %v (the grant follows the collection)", err)
	}
	_, err = admin.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "shop", Name: "purchases"})
	must(err)
	_, err = admin.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "shop", Name: "purchases"})
	must(err)
	if err := index("purchases", "i3"); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("index on a recreated collection: %v, want ErrPermissionDenied", err)
	}
}
