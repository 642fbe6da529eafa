package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestR9_5_ContextSetAddDelete: contexts are made with commands, like
// kubectl's: add (refusing a name taken), set (changing only the settings
// given, paths made absolute), use, delete (clearing current-context); the
// file keeps its comments, stays readable only by its owner, and client
// commands read what was written.
func TestR9_5_ContextSetAddDelete(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "walcast", "config.yaml")
	t.Setenv("WALCAST_CLIENT_CONFIG", file)
	t.Chdir(dir)
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("# my contexts\ncontexts:\n  old:\n    addr: 127.0.0.1:7000 # the old one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun := func(args ...string) string {
		t.Helper()
		out, err := run(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	mustRun("context", "add", "lab", "--addr", "https://10.0.0.11:7070,https://10.0.0.12:7070", "--tls-ca", "ca.crt", "--token-file", "lab.token", "--use")
	if _, err := run(t, "context", "add", "lab", "--addr", "127.0.0.1"); err == nil || !strings.Contains(err.Error(), "exit status 2") {
		t.Errorf("adding a context whose name is taken: %v", err)
	}
	if _, err := run(t, "context", "add", "nowhere"); err == nil || !strings.Contains(err.Error(), "--addr") {
		t.Errorf("adding a context without an address: %v", err)
	}
	mustRun("context", "set", "lab", "--timeout", "45s", "--token-file", "")
	show := mustRun("context", "show", "-o", "json")
	for _, want := range []string{`"addr": {`, `https://10.0.0.11:7070,https://10.0.0.12:7070`, filepath.Join(dir, "ca.crt"), `"45s"`, `"context": "lab"`} {
		if !strings.Contains(show, want) {
			t.Errorf("context show lacks %s:\n%s", want, show)
		}
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if s := string(raw); !strings.Contains(s, "# my contexts") || !strings.Contains(s, "# the old one") || strings.Contains(s, "token-file") ||
		!strings.Contains(s, "current-context: lab") {
		t.Errorf("the file after add and set:\n%s", s)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the file's mode: %v %v", fi.Mode(), err)
	}
	mustRun("context", "delete", "lab")
	list := mustRun("context", "list")
	if strings.Contains(list, "lab") || !strings.Contains(list, "old") || strings.Contains(list, "*") {
		t.Errorf("context list after delete:\n%s", list)
	}
	if _, err := run(t, "context", "delete", "lab"); err == nil {
		t.Error("deleting a context twice succeeded")
	}
}
