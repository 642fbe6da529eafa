// Package tmpfs gives tests a small file system of their own that they can
// fill up: a tmpfs mounted for the test (Linux, as root: CI runs so), or a
// skip that says why not. Disk-full tests need a real full disk; those that
// cannot have one inject the fault instead (a Statfs of diskspace, a
// disabled JetStream) and run everywhere.
package tmpfs

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Mount mounts a tmpfs of size bytes on a new directory for tb and unmounts
// it when tb ends (after the cleanups registered later, such as the
// processes using it). It skips tb when the machine cannot mount one.
func Mount(tb testing.TB, size int64) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := mount(dir, size); err != nil {
		tb.Skipf("cannot mount a %d-byte tmpfs (disk-full tests need root on Linux; the fault-injected variants run anyway): %v", size, err)
	}
	tb.Cleanup(func() {
		if err := unmount(dir); err != nil {
			tb.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// Fill writes a file in dir until the file system has no space left and
// returns its path: remove it to free the space again.
func Fill(tb testing.TB, dir string) string {
	tb.Helper()
	return FillTo(tb, dir, 0)
}

// FillTo writes a file in dir until the file system has at most leave
// bytes free and returns its path: remove it to free the space again.
// Others writing meanwhile can leave less.
func FillTo(tb testing.TB, dir string, leave uint64) string {
	tb.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for size := len(buf); size > 0; {
		if leave > 0 {
			free := Free(tb, dir)
			if free <= leave {
				break
			}
			size = min(size, int(free-leave))
		}
		if _, err := f.Write(buf[:size]); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				tb.Fatal(err)
			}
			size /= 2 // fill the last pages too
		}
	}
	if err := f.Sync(); err != nil && !errors.Is(err, syscall.ENOSPC) {
		tb.Fatal(err)
	}
	return path
}
