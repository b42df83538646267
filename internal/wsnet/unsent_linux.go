//go:build linux

package wsnet

import (
	"syscall"
	"unsafe"
)

// unsentFD returns how many bytes wait in the send queue of socket fd,
// not yet acknowledged by the peer (TIOCOUTQ), or -1 when it cannot
// tell.
func unsentFD(fd uintptr) int {
	var n int32
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&n)))
	if errno != 0 || n < 0 {
		return -1
	}
	return int(n)
}
