package main

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/walcast/walcast/auth"
	"github.com/walcast/walcast/internal/pki"
)

func authCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "auth", Short: "Manage API credentials: bearer tokens and client certificates"}
	cmd.AddCommand(tokenCmd(g), certCmd(g))
	return cmd
}

// tokenView is a token record as the CLI shows it: never its hash.
type tokenView struct {
	ID        string
	Name      string
	Role      string
	CreatedAt string
	ExpiresAt string // "" if it never expires
	Expired   bool
	Token     string // only when created
	rec       auth.TokenRecord
}

func viewOf(r auth.TokenRecord, now time.Time) tokenView {
	v := tokenView{ID: r.ID, Name: r.Name, Role: r.Role.String(), CreatedAt: r.CreatedAt.Format(time.RFC3339), Expired: r.Expired(now), rec: r}
	if !r.ExpiresAt.IsZero() {
		v.ExpiresAt = r.ExpiresAt.Format(time.RFC3339)
	}
	return v
}

// value is the machine form of a token view (the token itself only when it
// was just created).
func (v tokenView) value() object {
	o := object{"id": v.ID, "name": v.Name, "role": v.Role, "created_at": goTime(v.rec.CreatedAt), "expires_at": goTime(v.rec.ExpiresAt),
		"expired": v.Expired}
	if v.Token != "" {
		o["token"] = v.Token
	}
	return o
}

func values(vs []tokenView) []any {
	out := make([]any, len(vs))
	for i, v := range vs {
		out[i] = v.value()
	}
	return out
}

func tokenCmd(g *globals) *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Create, list and revoke bearer tokens in a token file (api.auth.token_file)",
		Long: `Bearer tokens live in a token file as salted argon2id hashes, each with a name (the
identity: the metadata user whose privileges a writer's DDL needs), a role (reader,
writer, admin or node) and an optional expiry. A token is shown once, when created.
Running servers reload the file within api.reload_interval (2s) or at once on SIGHUP,
so created and revoked tokens take effect without a restart.`,
	}
	cmd.PersistentFlags().StringVar(&file, "file", "", "token file (required; created if missing)")
	_ = cmd.MarkPersistentFlagRequired("file")

	var name, role string
	var expires time.Duration
	create := &cobra.Command{
		Use:     "create",
		Short:   "Create a token and print it (once: only its hash is kept)",
		Example: "  walcast auth token create --file walcast-data/secure/tokens.json --name ci --role writer --expires 720h",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := auth.ParseRole(role)
			if err != nil {
				return usageError{err}
			}
			if expires < 0 {
				return usageError{errors.New("--expires must not be negative")}
			}
			var at time.Time
			if expires > 0 {
				at = time.Now().Add(expires)
			}
			tok, rec, err := auth.CreateToken(file, name, r, at)
			if err != nil {
				if errors.Is(err, auth.ErrInvalid) {
					return usageError{err}
				}
				return err
			}
			v := viewOf(rec, time.Now())
			v.Token = tok
			if f, err := g.format(); err != nil || f.machine() {
				if err != nil {
					return err
				}
				return emit(cmd.OutOrStdout(), f, v.value())
			}
			w := cmd.OutOrStdout()
			fmt.Fprintln(w, tok)
			exp := "never expires"
			if v.ExpiresAt != "" {
				exp = "expires " + v.ExpiresAt
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s for %s, role %s, %s: shown once, store it now (e.g. in a file for --token-file)\n", rec.ID, rec.Name, rec.Role, exp)
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "", "identity name (required)")
	create.Flags().StringVar(&role, "role", "", "reader, writer, admin or node (required)")
	create.Flags().DurationVar(&expires, "expires", 0, "validity, e.g. 720h (default: never expires)")
	_ = create.MarkFlagRequired("name")
	_ = create.MarkFlagRequired("role")

	list := &cobra.Command{
		Use:   "list",
		Short: "List the tokens of the file (ids, names, roles, expiries; never secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			recs, err := auth.ReadTokens(file)
			if errors.Is(err, fs.ErrNotExist) {
				recs, err = nil, nil
			}
			if err != nil {
				return err
			}
			now := time.Now()
			views := make([]tokenView, len(recs))
			for i, r := range recs {
				views[i] = viewOf(r, now)
			}
			if f, err := g.format(); err != nil || f.machine() {
				if err != nil {
					return err
				}
				return emit(cmd.OutOrStdout(), f, values(views))
			}
			tb := newTable(cmd.OutOrStdout(), "ID", "NAME", "ROLE", "CREATED", "EXPIRES")
			for _, v := range views {
				exp := v.ExpiresAt
				switch {
				case exp == "":
					exp = "never"
				case v.Expired:
					exp += " (expired)"
				}
				tb.row(v.ID, v.Name, v.Role, v.CreatedAt, exp)
			}
			return tb.flush()
		},
	}

	revoke := &cobra.Command{
		Use:   "revoke <id|name>",
		Short: "Revoke the token with this id, or every token with this name",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			removed, err := auth.RevokeTokens(file, args[0])
			if err != nil {
				return err
			}
			now := time.Now()
			views := make([]tokenView, len(removed))
			for i, r := range removed {
				views[i] = viewOf(r, now)
			}
			if f, err := g.format(); err != nil || f.machine() {
				if err != nil {
					return err
				}
				return emit(cmd.OutOrStdout(), f, values(views))
			}
			for _, v := range views {
				fmt.Fprintf(cmd.OutOrStdout(), "revoked token %s (%s, %s)\n", v.ID, v.Name, v.Role)
			}
			return nil
		},
	}
	for _, c := range []*cobra.Command{create, list, revoke} {
		addOutputFlags(c, g)
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}

func certCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "cert", Short: "Issue certificates from a local CA: clients' (a role each), servers' (the API's), the CA itself"}
	var caCert, caKey, name, role, out string
	var hosts []string
	var server bool
	var validity time.Duration
	create := &cobra.Command{
		Use:   "create",
		Short: "Issue a client certificate (CN = --name, OU = walcast:<role>) or, with --server, the API's certificate for --host names",
		Example: `  walcast auth cert create --ca-cert walcast-data/secure/ca.crt --ca-key walcast-data/secure/ca.key \
    --name n1 --role node --out n1       # writes n1.crt and n1.key
  walcast auth cert ca --out ca          # ca.crt, ca.key (deploy/kubernetes: the walcast-api-ca secret)
  walcast auth cert create --ca-cert ca.crt --ca-key ca.key --server \
    --host walcast --host walcast.walcast.svc --out api    # api.crt, api.key: the walcast-api-tls secret`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if caCert == "" || caKey == "" {
				return usageError{errors.New("--ca-cert and --ca-key: the CA that signs (walcast auth cert ca makes one)")}
			}
			leaf := pki.Leaf{NotAfter: time.Now().Add(validity)}
			var r auth.Role
			switch {
			case server:
				if len(hosts) == 0 {
					return usageError{errors.New("--server needs --host: the names (and IP addresses) clients reach the API at")}
				}
				if role != "" {
					return usageError{errors.New("--role is for client certificates, not with --server")}
				}
				if name == "" {
					name = hosts[0]
				}
				leaf.CommonName, leaf.Server = name, true
				for _, h := range hosts {
					if ip := net.ParseIP(h); ip != nil {
						leaf.IPs = append(leaf.IPs, ip)
					} else {
						leaf.DNSNames = append(leaf.DNSNames, h)
					}
				}
			default:
				if name == "" || role == "" {
					return usageError{errors.New("--name and --role: the client's identity and role (or --server for the API's certificate)")}
				}
				var err error
				if r, err = auth.ParseRole(role); err != nil {
					return usageError{err}
				}
				if err := auth.CheckName(name); err != nil {
					return usageError{err}
				}
				leaf.CommonName, leaf.OrganizationalUnits, leaf.Client = name, []string{auth.CertRolePrefix + r.String()}, true
			}
			ca, err := pki.LoadCA(caCert, caKey)
			if err != nil {
				return err
			}
			c, k, err := ca.Issue(leaf)
			if err != nil {
				return err
			}
			if out == "" {
				out = name
			}
			certPath, keyPath := out+".crt", out+".key"
			if err := pki.WriteFile(certPath, c, 0o644); err != nil {
				return err
			}
			if err := pki.WriteFile(keyPath, k, 0o600); err != nil {
				return err
			}
			if f, err := g.format(); err != nil || f.machine() {
				if err != nil {
					return err
				}
				if server {
					return emit(cmd.OutOrStdout(), f, object{"cert": certPath, "key": keyPath, "name": name, "hosts": hosts})
				}
				return emit(cmd.OutOrStdout(), f, object{"cert": certPath, "key": keyPath, "name": name, "role": r.String()})
			}
			abs, _ := filepath.Abs(certPath)
			if server {
				fmt.Fprintf(cmd.OutOrStdout(), "server certificate for %s: %s, key %s\n", strings.Join(hosts, ", "), abs, keyPath)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "client certificate for %s (role %s): %s, key %s\n", name, r, abs, keyPath)
			return nil
		},
	}
	create.Flags().StringVar(&caCert, "ca-cert", "", "CA certificate (required)")
	create.Flags().StringVar(&caKey, "ca-key", "", "CA key (required)")
	create.Flags().StringVar(&name, "name", "", "identity name, the subject CN (required for a client; default the first --host)")
	create.Flags().StringVar(&role, "role", "", "reader, writer, admin or node (required for a client)")
	create.Flags().BoolVar(&server, "server", false, "issue the API's server certificate for --host instead of a client's")
	create.Flags().StringArrayVar(&hosts, "host", nil, "with --server: a DNS name or IP address the certificate is valid for (repeat)")
	create.Flags().StringVar(&out, "out", "", "output path prefix: <out>.crt and <out>.key (default --name)")
	create.Flags().DurationVar(&validity, "validity", 365*24*time.Hour, "validity")
	addOutputFlags(create, g)
	cmd.AddCommand(create, certCACmd(g))
	return cmd
}

// certCACmd makes a local CA: the files auth cert create signs with, and the
// CA certificate clients and nodes verify the API's certificate with.
func certCACmd(g *globals) *cobra.Command {
	var out, cn string
	var validity time.Duration
	cmd := &cobra.Command{
		Use:     "ca",
		Short:   "Make a local CA: <out>.crt (give it to clients: --tls-ca, api.tls.client_ca_file) and <out>.key (keep it safe)",
		Example: "  walcast auth cert ca --out ca       # ca.crt, ca.key",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			certPath, keyPath := out+".crt", out+".key"
			for _, p := range []string{certPath, keyPath} {
				if _, err := os.Stat(p); err == nil {
					return usageError{fmt.Errorf("%s exists: a new CA would not verify the certificates the old one signed (choose another --out)", p)}
				}
			}
			ca, err := pki.NewCA(cn, validity)
			if err != nil {
				return err
			}
			if err := pki.WriteFile(certPath, ca.CertPEM, 0o644); err != nil {
				return err
			}
			if err := pki.WriteFile(keyPath, ca.KeyPEM(), 0o600); err != nil {
				return err
			}
			if f, err := g.format(); err != nil || f.machine() {
				if err != nil {
					return err
				}
				return emit(cmd.OutOrStdout(), f, object{"cert": certPath, "key": keyPath, "name": cn})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "CA %q: certificate %s, key %s\n", cn, certPath, keyPath)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "ca", "output path prefix: <out>.crt and <out>.key")
	cmd.Flags().StringVar(&cn, "name", "walcast CA", "the CA's subject CN")
	cmd.Flags().DurationVar(&validity, "validity", 10*365*24*time.Hour, "validity")
	addOutputFlags(cmd, g)
	return cmd
}
