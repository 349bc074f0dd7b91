//go:build !linux

package main

import "os/exec"

// setDeathSignal does nothing: only Linux can kill a child when its parent
// dies. (The benchmark needs Linux's /proc anyway.)
func setDeathSignal(*exec.Cmd) {}
