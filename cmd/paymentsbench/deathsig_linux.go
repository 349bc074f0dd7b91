package main

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill cmd if the benchmark dies without
// cleaning up, as when it is killed with SIGKILL.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
