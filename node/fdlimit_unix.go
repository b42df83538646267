//go:build unix

package node

import "syscall"

// fdLimit returns the process's soft and hard RLIMIT_NOFILE.
func fdLimit() (soft, hard uint64, ok bool) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, 0, false
	}
	return uint64(r.Cur), uint64(r.Max), true
}
