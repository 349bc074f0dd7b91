//go:build !linux

package proc

import "os/exec"

// setDeathSignal does nothing: only Linux can kill a child when its parent
// dies.
func setDeathSignal(*exec.Cmd) {}
