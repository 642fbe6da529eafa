package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

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
		Use:               "use NAME",
		Short:             "Make NAME the current context (writes current-context in the file)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeContextNames,
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
	cmd.AddCommand(list, use, show, contextSetCmd("set", false), contextSetCmd("add", true), contextDeleteCmd())
	return cmd
}

// contextKeys are the settings of a context as flags of context set and
// add, in the file's order; the path ones are made absolute.
var contextKeys = []struct {
	key, help string
	path      bool
}{
	{"addr", "coordinator address(es), comma separated", false},
	{"token", "bearer token (prefer --token-file: the file holds it in clear)", false},
	{"token-file", "file with the bearer token", true},
	{"tls-ca", "CA bundle that verifies the coordinators' certificates", true},
	{"tls-cert", "client certificate (mTLS)", true},
	{"tls-key", "client certificate's key (mTLS)", true},
	{"tls-server-name", "server name to verify the certificates with", false},
	{"timeout", "the commands' overall deadline (a Go duration: 30s, 2m)", false},
}

// contextSetCmd is context set (create or change a context: only the
// settings given change) or, with add, context add (create one; an existing
// name is refused).
func contextSetCmd(use string, add bool) *cobra.Command {
	vals := make([]string, len(contextKeys))
	var makeCurrent bool
	short := "Create or change a context: the settings given replace its own, the others stay"
	if add {
		short = "Add a context (refused if one has that name)"
	}
	cmd := &cobra.Command{
		Use:     use + " NAME",
		Short:   short,
		Example: "  walcast context " + use + " prod --addr https://10.0.0.11:7070,https://10.0.0.12:7070 --tls-ca ca.crt --token-file prod.token --use",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if strings.TrimSpace(name) == "" || strings.ContainsAny(name, " \t\n:") {
				return usageError{fmt.Errorf("context name %q: no spaces or colons", name)}
			}
			cfg, err := readClientConfig()
			if err != nil {
				return err
			}
			if cfg.path == "" {
				return usageError{errors.New("no client configuration file: set WALCAST_CLIENT_CONFIG or HOME")}
			}
			_, exists := cfg.Contexts[name]
			if add && exists {
				return usageError{fmt.Errorf("context %q exists in %s: change it with walcast context set", name, cfg.path)}
			}
			set := map[string]string{}
			for i, k := range contextKeys {
				if !cmd.Flags().Changed(k.key) {
					continue
				}
				v := vals[i]
				switch {
				case k.key == "addr" && v != "":
					if err := checkAddrs(v); err != nil {
						return usageError{fmt.Errorf("--addr: %w", err)}
					}
				case k.key == "timeout" && v != "":
					if d, err := time.ParseDuration(v); err != nil || d <= 0 {
						return usageError{fmt.Errorf("--timeout: %q is not a positive duration", v)}
					}
				case k.path && v != "":
					if v, err = filepath.Abs(v); err != nil {
						return usageError{err}
					}
				}
				set[k.key] = v
			}
			if !exists && set["addr"] == "" {
				return usageError{fmt.Errorf("--addr: a new context needs the coordinators' address")}
			}
			if err := editClientConfig(cfg.path, func(root *yaml.Node) {
				c := mappingAt(mappingAt(root, "contexts"), name)
				for _, k := range contextKeys {
					if v, ok := set[k.key]; ok {
						setScalar(c, k.key, v)
					}
				}
				if makeCurrent {
					setScalar(root, "current-context", name)
				}
			}); err != nil {
				return err
			}
			verb := "changed"
			if !exists {
				verb = "added"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "context %s %s in %s\n", name, verb, cfg.path)
			if makeCurrent {
				fmt.Fprintf(cmd.OutOrStdout(), "current context: %s\n", name)
			}
			return nil
		},
	}
	for i, k := range contextKeys {
		cmd.Flags().StringVar(&vals[i], k.key, "", k.help+" (empty: remove it)")
	}
	cmd.Flags().BoolVar(&makeCurrent, "use", false, "make it the current context too")
	return cmd
}

// completeContextNames completes the names of the file's contexts.
func completeContextNames(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	cfg, err := readClientConfig()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	return sortedKeys(cfg.Contexts), cobra.ShellCompDirectiveNoFileComp
}

// contextDeleteCmd removes a context (and current-context, if it named it).
func contextDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "delete NAME",
		Short:             "Delete a context (current-context too, if it names it)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeContextNames,
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			cfg, err := readClientConfig()
			if err != nil {
				return err
			}
			if _, ok := cfg.Contexts[name]; !ok {
				return usageError{fmt.Errorf("no context %q in %s (walcast context list)", name, cfg.path)}
			}
			if err := editClientConfig(cfg.path, func(root *yaml.Node) {
				deleteKey(mappingAt(root, "contexts"), name)
				if cfg.CurrentContext == name {
					deleteKey(root, "current-context")
				}
			}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "context %s deleted from %s\n", name, cfg.path)
			if cfg.CurrentContext == name {
				fmt.Fprintln(cmd.OutOrStdout(), "no current context now (walcast context use NAME)")
			}
			return nil
		},
	}
}

// mappingAt returns the mapping under key in mapping m, adding an empty
// one if there is none.
func mappingAt(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			v := m.Content[i+1]
			if v.Kind != yaml.MappingNode {
				*v = yaml.Node{Kind: yaml.MappingNode}
			}
			return v
		}
	}
	v := &yaml.Node{Kind: yaml.MappingNode}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: key}, v)
	return v
}

// setScalar sets key in mapping m to the string v; an empty v removes key.
func setScalar(m *yaml.Node, key, v string) {
	if v == "" {
		deleteKey(m, key)
		return
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1].Kind, m.Content[i+1].Value, m.Content[i+1].Tag = yaml.ScalarNode, v, "!!str"
			return
		}
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: key}, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v})
}

// deleteKey removes key from mapping m.
func deleteKey(m *yaml.Node, key string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content = append(m.Content[:i], m.Content[i+2:]...)
			return
		}
	}
}

// setCurrentContext rewrites current-context in the file at path, keeping
// the rest of it (comments included).
func setCurrentContext(path, name string) error {
	return editClientConfig(path, func(root *yaml.Node) { setScalar(root, "current-context", name) })
}

// editClientConfig applies edit to the top mapping of the file at path (an
// empty one if the file is missing) and writes it back atomically, keeping
// the rest of the file, comments included. The file is only readable by
// its owner: it may hold tokens.
func editClientConfig(path string, edit func(root *yaml.Node)) error {
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
	edit(doc.Content[0])
	out, err := yaml.Marshal(&doc)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
