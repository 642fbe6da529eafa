//go:build linux || darwin || freebsd

package diskspace

import "syscall"

// statfs returns the bytes available to unprivileged writers and the size
// of the file system holding path.
func statfs(path string) (free, total uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, 0, err
	}
	return uint64(st.Bavail) * uint64(st.Bsize), uint64(st.Blocks) * uint64(st.Bsize), nil
}
