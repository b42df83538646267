//go:build linux

package server

import (
	"syscall"
	"unsafe"
)

// canPeek is set where [readable] can tell.
const canPeek = true

// readable reports whether a read of socket fd would not block: it has
// a byte to read, its peer closed it, or it has an error. It peeks at
// one byte without taking it.
func readable(fd uintptr) bool {
	var b [1]byte
	_, _, errno := syscall.Syscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	return errno != syscall.EAGAIN && errno != syscall.EWOULDBLOCK
}
