package engine

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The engine's parts are tested by scripts under testdata, in the format of
// etcd raft's and pebble's data-driven tests (github.com/cockroachdb/datadriven),
// read by the small runner below so that the module needs no dependency
// for it:
//
//	# a comment
//	command key=value key=(a,b) flag
//	----
//	the expected output
//
// A blank line ends a command's output. `go test -run TestScript -rewrite`
// writes the outputs the code gives instead of checking them.

var rewrite = flag.Bool("rewrite", false, "rewrite the expected outputs of testdata scripts")

// scriptCmd is one command of a script.
type scriptCmd struct {
	pos  string // file:line
	name string
	args []scriptArg
}

type scriptArg struct {
	key  string
	vals []string
}

// has reports whether the command has argument key.
func (d *scriptCmd) has(key string) bool {
	for _, a := range d.args {
		if a.key == key {
			return true
		}
	}
	return false
}

// str returns argument key's value; the test fails without one.
func (d *scriptCmd) str(t *testing.T, key string) string {
	t.Helper()
	for _, a := range d.args {
		if a.key == key && len(a.vals) == 1 {
			return a.vals[0]
		}
	}
	t.Fatalf("%s: %s needs %s=", d.pos, d.name, key)
	return ""
}

// strs returns argument key's values (key=(a,b)), nil without it.
func (d *scriptCmd) strs(key string) []string {
	for _, a := range d.args {
		if a.key == key {
			return a.vals
		}
	}
	return nil
}

// uint returns argument key as a number.
func (d *scriptCmd) uint(t *testing.T, key string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(d.str(t, key), 10, 64)
	if err != nil {
		t.Fatalf("%s: %s=%s: %v", d.pos, key, d.str(t, key), err)
	}
	return n
}

// uintOr returns argument key as a number, def without it.
func (d *scriptCmd) uintOr(t *testing.T, key string, def uint64) uint64 {
	t.Helper()
	if !d.has(key) {
		return def
	}
	return d.uint(t, key)
}

func parseScriptCmd(pos, line string) (scriptCmd, error) {
	fields := strings.Fields(line)
	d := scriptCmd{pos: pos, name: fields[0]}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			d.args = append(d.args, scriptArg{key: f})
			continue
		}
		if strings.HasPrefix(v, "(") {
			if !strings.HasSuffix(v, ")") {
				return d, fmt.Errorf("%s: unclosed list in %q", pos, f)
			}
			v = strings.TrimSuffix(strings.TrimPrefix(v, "("), ")")
			var vals []string
			if v != "" {
				vals = strings.Split(v, ",")
			}
			d.args = append(d.args, scriptArg{key: k, vals: vals})
			continue
		}
		d.args = append(d.args, scriptArg{key: k, vals: []string{v}})
	}
	return d, nil
}

// runScript runs every command of the script at path through do and
// compares its output with the one the script expects (or, with -rewrite,
// writes the script back with the outputs do gave).
func runScript(t *testing.T, path string, do func(t *testing.T, d *scriptCmd) string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	var out strings.Builder
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			out.WriteString(line)
			if i < len(lines)-1 {
				out.WriteString("\n")
			}
			continue
		}
		pos := fmt.Sprintf("%s:%d", filepath.Base(path), i+1)
		d, err := parseScriptCmd(pos, trimmed)
		if err != nil {
			t.Fatal(err)
		}
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s: %q is not followed by ----", pos, trimmed)
		}
		i += 2
		var want []string
		for ; i < len(lines) && lines[i] != ""; i++ {
			want = append(want, lines[i])
		}
		got := strings.TrimRight(do(t, &d), "\n")
		out.WriteString(line + "\n----\n")
		if got != "" {
			out.WriteString(got + "\n")
		}
		if i < len(lines)-1 {
			out.WriteString("\n")
		}
		if !*rewrite && got != strings.Join(want, "\n") {
			t.Errorf("%s: %s\ngot:\n%s\nwant:\n%s", pos, trimmed, got, strings.Join(want, "\n"))
		}
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// takeLines returns a script command's output lines, one per line, and
// empties them for the next command.
func takeLines(out *[]string) string {
	s := strings.Join(*out, "\n")
	*out = (*out)[:0]
	return s
}

// scriptClass is the index in ts of the retention class d's "class" names.
func scriptClass(t *testing.T, d *scriptCmd, ts *tombstones) int {
	t.Helper()
	for i, cl := range ts.classes {
		if cl.cfg.Name == d.str(t, "class") {
			return i
		}
	}
	t.Fatalf("%s: no class %s", d.pos, d.str(t, "class"))
	return -1
}
