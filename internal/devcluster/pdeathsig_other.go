//go:build !linux

package devcluster

import "os/exec"

// setPdeathsig does nothing where the kernel has no parent-death signal:
// there Close (or the dev-cluster command's Ctrl-C) must stop the members.
func setPdeathsig(*exec.Cmd) {}
