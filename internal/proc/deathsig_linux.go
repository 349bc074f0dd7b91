package proc

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill cmd if its parent dies without
// cleaning up, as when it is killed with SIGKILL.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
