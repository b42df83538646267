//go:build linux

package main

import "syscall"

// On Linux, children get SIGKILL if the test binary dies without running
// its cleanups (a -timeout panic, a crash), so no server outlives it.
func init() {
	cliSysProcAttr = func() *syscall.SysProcAttr {
		return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
}
