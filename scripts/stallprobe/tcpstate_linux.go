package main

import (
	"net"
	"syscall"
	"unsafe"
)

// tcpState is the kernel's state of our end of c (TCP_INFO), such as
// "ESTABLISHED", or "CLOSE" once the peer reset it and "CLOSE_WAIT" once
// it sent a FIN. It needs no read, so it sees a peer's close even while
// the client reads nothing.
func tcpState(c net.Conn) string {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return "?"
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return "closed"
	}
	var info [232]byte // struct tcp_info; its first byte is tcpi_state
	n := uint32(len(info))
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_INFO,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&n)), 0)
	}); err != nil {
		return "closed"
	}
	if errno != 0 {
		return "?"
	}
	states := []string{1: "ESTABLISHED", "SYN_SENT", "SYN_RECV", "FIN_WAIT1", "FIN_WAIT2", "TIME_WAIT",
		"CLOSE", "CLOSE_WAIT", "LAST_ACK", "LISTEN", "CLOSING"}
	if s := int(info[0]); s < len(states) && states[s] != "" {
		return states[s]
	}
	return "?"
}
