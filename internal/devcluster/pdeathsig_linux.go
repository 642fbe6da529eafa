package devcluster

import (
	"os/exec"
	"syscall"
)

// setPdeathsig makes the kernel kill the child when the thread that starts
// it ends.
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
