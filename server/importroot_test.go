package server_test

import (
	"path/filepath"
	"testing"

	"github.com/walcast/walcast/server"
)

// TestR9_7_ImportRootDefaultsUnderDataDir: meta.import_root, the directory
// the metadata service reads import files from, defaults to
// "<data_dir>/imports" and is overridden by the setting.
func TestR9_7_ImportRootDefaultsUnderDataDir(t *testing.T) {
	c := server.Default()
	c.DataDir = "/var/lib/walcast"
	if got := c.ImportRoot(); got != filepath.Join("/var/lib/walcast", "imports") {
		t.Fatalf("default import root %q", got)
	}
	c.Meta.ImportRoot = "/srv/imports"
	if got := c.ImportRoot(); got != "/srv/imports" {
		t.Fatalf("configured import root %q", got)
	}
	c, err := server.Load("", []string{"WALCAST_META_IMPORT_ROOT=/mnt/bulk"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.ImportRoot(); got != "/mnt/bulk" {
		t.Fatalf("import root from the environment %q", got)
	}
}
