package tmpfs

import (
	"fmt"
	"syscall"
	"testing"
)

func mount(dir string, size int64) error {
	return syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", size))
}

func unmount(dir string) error { return syscall.Unmount(dir, syscall.MNT_DETACH) }

// Free returns the bytes free in dir's file system.
func Free(tb testing.TB, dir string) uint64 {
	tb.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		tb.Fatal(err)
	}
	return uint64(st.Bavail) * uint64(st.Bsize)
}
