package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	yaml "go.yaml.in/yaml/v3"
)

func contextCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "context",
		Short: "Named connection settings of the client configuration file",
		Long: `Client commands read named contexts from the client configuration file
(WALCAST_CLIENT_CONFIG, else $XDG_CONFIG_HOME/walcast/config.yaml, else
~/.config/walcast/config.yaml), like kubectl's contexts:

  current-context: prod
  contexts:
    prod:
      addr: https://10.0.0.11:7070,https://10.0.0.12:7070
      tls-ca: /etc/walcast/ca.crt
      token-file: ~/.config/walcast/prod.token   # also token, tls-cert, tls-key, tls-server-name
      timeout: 60s
    local:
      addr: 127.0.0.1:7070

Each setting of a command comes from its flag, else its environment variable
(WALCAST_ADDR, WALCAST_TOKEN_FILE), else the context (--context, WALCAST_CONTEXT,
or current-context), else the default (127.0.0.1:7070). Relative paths in the
file are relative to its directory; credentials (token or token-file, the
tls-* settings) are taken from one place as a whole.`,
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the contexts (the current one marked *)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := g.format()
			if err != nil {
				return err
			}
			cfg, err := readClientConfig()
			if err != nil {
				return err
			}
			if f.machine() {
				ctxs := object{}
				for name, c := range cfg.Contexts {
					ctxs[name] = object{"addr": c.Addr, "token_file": c.TokenFile, "tls_ca": c.TLSCA, "tls_cert": c.TLSCert,
						"tls_key": c.TLSKey, "tls_server_name": c.TLSServerName, "timeout": c.Timeout, "token_set": c.Token != ""}
				}
				return emit(cmd.OutOrStdout(), f, object{"file": cfg.path, "current_context": cfg.CurrentContext, "contexts": ctxs})
			}
			tb := newTable(cmd.OutOrStdout(), "CURRENT", "NAME", "ADDR", "CREDENTIALS")
			for _, name := range sortedKeys(cfg.Contexts) {
				c := cfg.Contexts[name]
				cur := ""
				if name == cfg.CurrentContext {
					cur = "*"
				}
				var creds []string
				switch {
				case c.TokenFile != "":
					creds = append(creds, "token file")
				case c.Token != "":
					creds = append(creds, "token")
				}
				if c.TLSCert != "" {
					creds = append(creds, "client certificate")
				}
				if c.TLSCA != "" || strings.Contains(c.Addr, "https://") {
					creds = append(creds, "TLS")
				}
				if len(creds) == 0 {
					creds = []string{"-"}
				}
				tb.row(cur, name, c.Addr, strings.Join(creds, ", "))
			}
			return tb.flush()
		},
	}
	use := &cobra.Command{
		Use:   "use NAME",
		Short: "Make NAME the current context (writes current-context in the file)",
		Args:  cobra.ExactArgs(1),
		ValidArgsFunction: func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			cfg, err := readClientConfig()
			if err != nil {
				return nil, cobra.ShellCompDirectiveError
			}
			return sortedKeys(cfg.Contexts), cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := readClientConfig()
			if err != nil {
				return err
			}
			if _, ok := cfg.Contexts[args[0]]; !ok {
				return usageError{fmt.Errorf("no context %q in %s (walcast context list)", args[0], cfg.path)}
			}
			if err := setCurrentContext(cfg.path, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "current context: %s (%s)\n", args[0], cfg.path)
			return nil
		},
	}
	show := &cobra.Command{
		Use:   "show",
		Short: "Show the connection a client command would use, and where each setting comes from",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := g.format()
			if err != nil {
				return err
			}
			r, err := g.resolve(cmd)
			if err != nil {
				return err
			}
			rows := [][2]string{{"addr", strings.Join(r.addrs(), ",")}, {"token-file", r.tokenFile}, {"tls-ca", r.tlsCA},
				{"tls-cert", r.tlsCert}, {"tls-key", r.tlsKey}, {"tls-server-name", r.tlsServerName}, {"timeout", r.timeout.String()}}
			if r.token != "" {
				rows = append(rows, [2]string{"token", "(set)"})
			}
			if f.machine() {
				out := object{"context": r.ctxName, "file": clientConfigPath()}
				for _, row := range rows {
					out[strings.ReplaceAll(row[0], "-", "_")] = object{"value": row[1], "from": r.from[row[0]]}
				}
				return emit(cmd.OutOrStdout(), f, out)
			}
			ctx := r.ctxName
			if ctx == "" {
				ctx = "-"
			}
			tb := newTable(cmd.OutOrStdout(), "SETTING", "VALUE", "FROM")
			tb.row("context", ctx, clientConfigPath())
			for _, row := range rows {
				if row[1] == "" {
					continue
				}
				tb.row(row[0], row[1], r.from[row[0]])
			}
			return tb.flush()
		},
	}
	addConnFlags(show.Flags(), &g.conn)
	show.Flags().StringVar(&g.timeout, "timeout", "", "overall deadline of a command")
	for _, c := range []*cobra.Command{list, show} {
		addOutputFlags(c, g)
	}
	cmd.AddCommand(list, use, show)
	return cmd
}

// setCurrentContext rewrites current-context in the file at path, keeping
// the rest of it (comments included).
func setCurrentContext(path, name string) error {
	raw, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return usageError{fmt.Errorf("client configuration %s: %w", path, err)}
	}
	if doc.Kind == 0 {
		doc = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode}}}
	}
	m := doc.Content[0]
	set := false
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == "current-context" {
			m.Content[i+1].Value, m.Content[i+1].Tag, set = name, "!!str", true
		}
	}
	if !set {
		m.Content = append([]*yaml.Node{{Kind: yaml.ScalarNode, Value: "current-context"}, {Kind: yaml.ScalarNode, Value: name}}, m.Content...)
	}
	out, err := yaml.Marshal(&doc)
	if err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
