//go:build linux

package wire

import (
	"syscall"
	"unsafe"
)

// unreadFD returns how many bytes wait in the receive queue of socket
// fd (TIOCINQ, the same request as FIONREAD), or 0 when it cannot tell.
func unreadFD(fd uintptr) int {
	var n int32
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
	if errno != 0 || n < 0 {
		return 0
	}
	return int(n)
}
