//go:build !(linux || darwin || freebsd)

package diskspace

import "errors"

func statfs(string) (free, total uint64, err error) {
	return 0, 0, errors.ErrUnsupported
}
