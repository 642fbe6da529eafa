package docs

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"

	"github.com/walcast/walcast/server"
)

const (
	configFile  = "configuration.md"
	configStart = "<!-- configuration reference: generated from server/config*.go; go test ./docs checks it, -update rewrites it -->"
	configEnd   = "<!-- end configuration reference -->"
)

// configSource is what the configuration's source says that its values do
// not: the doc comment of each type and field, and the flag of each key.
type configSource struct {
	typeDoc  map[string]string            // by type name
	fieldDoc map[string]map[string]string // by type name, field name
	flags    map[string]string            // key -> flag name
	unique   map[string]string            // Go field name -> key, for names only one setting has
}

// readConfigSource parses the server's configuration types and the
// walcast command's server flags.
func readConfigSource(t *testing.T) configSource {
	t.Helper()
	src := configSource{typeDoc: map[string]string{}, fieldDoc: map[string]map[string]string{}, flags: map[string]string{}}
	files, err := filepath.Glob("../server/config*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, s := range g.Specs {
				ts := s.(*ast.TypeSpec)
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					continue
				}
				typeDoc := ts.Doc
				if typeDoc == nil {
					typeDoc = g.Doc
				}
				src.typeDoc[ts.Name.Name] = typeDoc.Text()
				fields := map[string]string{}
				for _, fl := range st.Fields.List {
					for _, n := range fl.Names {
						fields[n.Name] = fl.Doc.Text()
					}
				}
				src.fieldDoc[ts.Name.Name] = fields
			}
		}
	}
	// The flags: each element of serverFlags starts with the flag's name
	// and its key ({"api-addr", "api.addr", ...}).
	f, err := parser.ParseFile(fset, "../cmd/walcast/config.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "serverFlags" {
			return true
		}
		for _, e := range vs.Values[0].(*ast.CompositeLit).Elts {
			el := e.(*ast.CompositeLit).Elts
			flag, err1 := strconv.Unquote(el[0].(*ast.BasicLit).Value)
			key, err2 := strconv.Unquote(el[1].(*ast.BasicLit).Value)
			if err1 != nil || err2 != nil {
				t.Fatalf("serverFlags: an element does not start with its flag and key")
			}
			src.flags[key] = flag
		}
		return false
	})
	if len(src.flags) == 0 {
		t.Fatal("cmd/walcast/config.go has no serverFlags")
	}
	return src
}

// uniqueNames maps the Go names of the settings of t (at key prefix) that
// only one setting has to their keys.
func uniqueNames(t reflect.Type, prefix string) map[string]string {
	keys := map[string][]string{}
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for i := range t.NumField() {
			f := t.Field(i)
			k := join(prefix, yamlKey(f))
			keys[f.Name] = append(keys[f.Name], k)
			if structType(f.Type) {
				walk(f.Type, k)
			}
		}
	}
	walk(t, prefix)
	out := map[string]string{}
	for name, ks := range keys {
		if len(ks) == 1 {
			out[name] = ks[0]
		}
	}
	return out
}

// configSetting is one key of the reference.
type configSetting struct {
	key, kind, def, doc string
}

// configSection is one named section of the reference: a struct type of the
// configuration and its keys (those of its nested sections apart).
type configSection struct {
	key, typ, doc string
	settings      []configSetting
}

// structType is t's struct type, if it is a section rather than a value.
func structType(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && t != reflect.TypeFor[server.Duration]()
}

// configSections walks v, a value of the struct type t at key prefix, into
// sections: t's own keys, then each nested section's.
func configSections(src configSource, t reflect.Type, v reflect.Value, key string) []configSection {
	sec := configSection{key: key, typ: t.Name(), doc: src.typeDoc[t.Name()]}
	var nested []configSection
	// A field's doc names its siblings (and settings whose Go name is
	// unique, such as DataDir) by their Go names; the reference names them
	// by their keys.
	siblings := maps.Clone(src.unique)
	for i := range t.NumField() {
		f := t.Field(i)
		siblings[f.Name] = join(key, yamlKey(f))
	}
	for i := range t.NumField() {
		f := t.Field(i)
		k := join(key, yamlKey(f))
		if structType(f.Type) {
			nested = append(nested, configSections(src, f.Type, v.Field(i), k)...)
			continue
		}
		sec.settings = append(sec.settings, configSetting{key: k, kind: kindOf(f.Type), def: valueText(v.Field(i)),
			doc: withKeys(src.fieldDoc[t.Name()][f.Name], siblings)})
	}
	return append([]configSection{sec}, nested...)
}

func join(prefix, key string) string {
	if prefix == "" {
		return key
	}
	return prefix + "." + key
}

func yamlKey(f reflect.StructField) string {
	k, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	return k
}

// kindOf names a setting's type as a user writes it.
func kindOf(t reflect.Type) string {
	switch {
	case t == reflect.TypeFor[server.Duration]():
		return "duration"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		return "list of " + t.Elem().Name()
	case t.Kind() == reflect.Slice:
		return "list of " + kindOf(t.Elem())
	case t.Kind() == reflect.Float64:
		return "number"
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		return "integer"
	}
	return t.Kind().String()
}

// valueText is a default as one line of YAML, as a file would give it.
func valueText(v reflect.Value) string {
	var n yaml.Node
	if err := n.Encode(v.Interface()); err != nil {
		return fmt.Sprint(v.Interface())
	}
	flow(&n)
	out, err := yaml.Marshal(&n)
	if err != nil {
		return fmt.Sprint(v.Interface())
	}
	return strings.TrimSpace(string(out))
}

func flow(n *yaml.Node) {
	n.Style |= yaml.FlowStyle
	for _, c := range n.Content {
		flow(c)
	}
}

// goName matches a Go field name in a doc comment; acronyms (TLS, URL) are
// left alone, being words of the prose as often as names.
var goName = regexp.MustCompile(`\b[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*\b`)

// withKeys writes doc as one paragraph, naming the settings it names by Go
// name (siblings) by their keys.
func withKeys(text string, siblings map[string]string) string {
	text = strings.Join(strings.Fields(text), " ")
	return goName.ReplaceAllStringFunc(text, func(w string) string {
		if k, ok := siblings[w]; ok {
			return "`" + k + "`"
		}
		return w
	})
}

// sectionRef is a type comment's "(section api.tls)", or "(section
// broadcast.tombstone; R6)".
var sectionRef = regexp.MustCompile(`\s*\(section [^);]*(?:; ([^)]*))?\)`)

// sectionSummary is the first sentence of sec's type comment, without the
// type's name and the section's key, which the reference shows.
func sectionSummary(sec configSection) string {
	s := strings.TrimPrefix(new(doc.Package).Synopsis(sec.doc), sec.typ+" is ")
	s = sectionRef.ReplaceAllStringFunc(s, func(m string) string {
		if r := sectionRef.FindStringSubmatch(m)[1]; r != "" {
			return " (" + r + ")"
		}
		return ""
	})
	return strings.ToUpper(s[:1]) + s[1:]
}

// configReference is the generated part of configuration.md.
func configReference(t *testing.T) string {
	src := readConfigSource(t)
	src.unique = uniqueNames(reflect.TypeFor[server.Config](), "")
	var b bytes.Buffer
	for _, sec := range configSections(src, reflect.TypeFor[server.Config](), reflect.ValueOf(server.Default()), "") {
		if len(sec.settings) == 0 {
			continue
		}
		title := "`" + sec.key + "`"
		if sec.key == "" {
			title = "Top level"
		}
		fmt.Fprintf(&b, "\n### %s\n\n", title)
		if sec.key != "" {
			fmt.Fprintf(&b, "%s Its type: `server.%s`.\n\n", sectionSummary(sec), sec.typ)
		}
		b.WriteString("| key | type | default | environment, flag |\n|---|---|---|---|\n")
		for _, s := range sec.settings {
			env := "`WALCAST_" + strings.ToUpper(strings.ReplaceAll(s.key, ".", "_")) + "`"
			if strings.HasPrefix(s.kind, "list of ") && !strings.Contains(s.kind, " of string") && !strings.Contains(s.kind, " of integer") {
				env = "file only"
			}
			if f, ok := src.flags[s.key]; ok {
				env += ", `--" + f + "`"
			}
			def := "`" + s.def + "`"
			if s.def == `""` || s.def == "[]" {
				def = "—"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", s.key, s.kind, strings.ReplaceAll(def, "|", `\|`), env)
		}
		b.WriteString("\n")
		for _, s := range sec.settings {
			switch {
			case s.doc == "":
				t.Errorf("%s has no doc comment in server/config*.go", s.key)
			case strings.HasPrefix(s.doc, "`"+s.key+"`"):
				fmt.Fprintf(&b, "- %s\n", s.doc)
			default:
				fmt.Fprintf(&b, "- `%s`: %s\n", s.key, s.doc)
			}
		}
	}
	return b.String()
}

// TestConfigurationReference: configuration.md lists every setting of the
// server's configuration with its type, default, environment variable,
// flag and doc comment, as the types say. Run with -update to rewrite it.
func TestConfigurationReference(t *testing.T) {
	data, err := os.ReadFile(configFile)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	i, j := strings.Index(text, configStart), strings.Index(text, configEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no reference between %q and %q", configFile, configStart, configEnd)
	}
	generated(t, configFile, text, text[:i+len(configStart)]+"\n"+configReference(t)+text[j:],
		"has a configuration reference that does not match the server's configuration types", "TestConfigurationReference")
}
