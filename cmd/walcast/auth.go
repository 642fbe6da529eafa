package main

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
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
	cmd := &cobra.Command{Use: "cert", Short: "Issue client certificates from a local CA (walcast standalone --secure makes one)"}
	var caCert, caKey, name, role, out string
	var validity time.Duration
	create := &cobra.Command{
		Use:   "create",
		Short: "Issue a client certificate: subject CN = --name, OU = walcast:<role>",
		Example: `  walcast auth cert create --ca-cert walcast-data/secure/ca.crt --ca-key walcast-data/secure/ca.key \
    --name n1 --role node --out n1       # writes n1.crt and n1.key`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := auth.ParseRole(role)
			if err != nil {
				return usageError{err}
			}
			if err := auth.CheckName(name); err != nil {
				return usageError{err}
			}
			ca, err := pki.LoadCA(caCert, caKey)
			if err != nil {
				return err
			}
			c, k, err := ca.Issue(pki.Leaf{CommonName: name, OrganizationalUnits: []string{auth.CertRolePrefix + r.String()},
				Client: true, NotAfter: time.Now().Add(validity)})
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
				return emit(cmd.OutOrStdout(), f, object{"cert": certPath, "key": keyPath, "name": name, "role": r.String()})
			}
			abs, _ := filepath.Abs(certPath)
			fmt.Fprintf(cmd.OutOrStdout(), "client certificate for %s (role %s): %s, key %s\n", name, r, abs, keyPath)
			return nil
		},
	}
	create.Flags().StringVar(&caCert, "ca-cert", "", "CA certificate (required)")
	create.Flags().StringVar(&caKey, "ca-key", "", "CA key (required)")
	create.Flags().StringVar(&name, "name", "", "identity name, the subject CN (required)")
	create.Flags().StringVar(&role, "role", "", "reader, writer, admin or node (required)")
	create.Flags().StringVar(&out, "out", "", "output path prefix: <out>.crt and <out>.key (default --name)")
	create.Flags().DurationVar(&validity, "validity", 365*24*time.Hour, "validity")
	for _, f := range []string{"ca-cert", "ca-key", "name", "role"} {
		_ = create.MarkFlagRequired(f)
	}
	addOutputFlags(create, g)
	cmd.AddCommand(create)
	return cmd
}
