package server

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"

	"github.com/courier-mq/courier/internal/wsnet"
)

// An idle connection's read loop does not wait in a read: a read that
// blocks is some twenty calls deep (the frame reader, the WebSocket
// library, the socket), and the goroutine keeps the 8 KiB stack the
// deepest of them grew for as long as it waits, for every idle client.
// Instead, once nothing is buffered above the socket and the socket has
// nothing to read, the read loop starts a fresh goroutine that waits
// for the socket to become readable a few calls deep, within the 2 KiB
// a goroutine starts with, and ends; the waiter runs the read loop
// itself once bytes come, and hands the waiting on again when they are
// worked through. An idle connection then holds one goroutine of 2 KiB
// instead of 8 KiB (docs/benchmarks.md, "Memory per connected user").
//
// The wait honours the socket's read deadline and its closing as a read
// does, and the read it is followed by returns what the wait saw, so
// the heartbeat, the handshake timeout and cut work unchanged.
//
// A connection whose bytes pass through a layer that buffers them out of
// sight (TLS, or a system other than Linux) waits in its read as before.

// errIdle ends a run of the read loop that handed the waiting to a
// waiter (see [conn.await]).
var errIdle = errors.New("server: the connection is idle")

// waitSocket returns the socket under nc that a waiter may wait on, or
// nil when nc's bytes may be buffered where [conn.pending] cannot see
// them.
func waitSocket(nc net.Conn) syscall.RawConn {
	if !canPeek {
		return nil
	}
	if ws, ok := nc.(*wsnet.Conn); ok {
		nc = ws.Socket()
	}
	for range 8 {
		if _, ok := nc.(*tls.Conn); ok {
			return nil
		}
		u, ok := nc.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		nc = u.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// idle reports whether the read loop may hand the waiting to a waiter:
// it waits on a socket, nothing read is buffered above the socket, and
// the socket has nothing to read.
func (c *conn) idle() bool {
	if c.sock == nil {
		return false
	}
	if ws, ok := c.nc.(*wsnet.Conn); ok && ws.Pending() > 0 {
		return false
	}
	ready := true
	if err := c.sock.Control(func(fd uintptr) { ready = readable(fd) }); err != nil {
		return false // closed: the read says so
	}
	return !ready
}

// await waits for the socket to become readable (or for its read
// deadline, or its closing), then runs the read loop on this goroutine.
// It is started on a fresh goroutine, whose stack is the runtime's
// smallest while it waits. A wait that ends in an error (the deadline
// cut sets, a closed socket) is followed by a read, which meets the
// same error and reports it, rather than by another wait.
func (c *conn) await() {
	err := c.sock.Read(readable)
	c.read(false, err == nil)
}
