package wire

import (
	"net"
	"syscall"
)

// Unread returns how many bytes the peer of c sent that wait in the
// kernel, not yet read by this process (0 when it cannot tell: on other
// systems than Linux, or for a connection without a socket, such as a
// net.Pipe). c may be a TLS connection, or any wrapper with a NetConn
// method; the count is then of the raw bytes, records not yet decrypted
// included.
//
// A heartbeat uses it before it declares a peer silent: bytes waiting
// mean the peer spoke and this side's reader is behind, busy or starved
// of CPU (on an overloaded machine, a Go program runs its timers before
// the goroutines the network made ready), and cutting the connection
// then would lose what the peer sent, and what was queued for it, for
// this side's own slowness.
func Unread(c net.Conn) int {
	for {
		w, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = w.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	if err := rc.Control(func(fd uintptr) { n = unreadFD(fd) }); err != nil {
		return 0
	}
	return n
}
