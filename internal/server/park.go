package server

import (
	"crypto/tls"
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/courier-mq/courier/internal/wsnet"
)

// An idle connection's read loop does not wait in a read: a read that
// blocks is some twenty calls deep (the frame reader, the WebSocket
// library, the socket), and the goroutine keeps the 8 KiB stack the
// deepest of them grew for as long as it waits, for every idle client.
// Instead, once nothing is buffered above the socket, the read loop
// starts a fresh goroutine and ends; the fresh goroutine waits for the
// socket to become readable a few calls deep, within the 2 KiB a
// goroutine starts with, then runs the read loop itself, which hands
// the waiting on again when the bytes are worked through. An idle connection then holds one goroutine of 2 KiB
// instead of 8 KiB (docs/benchmarks.md, "Memory per connected user").
// A wake costs a goroutine start and the read loop's stack growing
// again (2 to 8 KiB), and one system call, the waiter's peek; a busy
// connection waits in its read (see busyWakes).
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

// noPark, set by a benchmark, has the connections accepted from then
// on wait in their reads, as before park.go.
var noPark atomic.Bool

// waitSocket returns the socket under nc that a waiter may wait on, or
// nil when nc's bytes may be buffered where neither the frame reader
// nor [wsnet.Conn.Pending] can see them (TLS), or nc has no socket.
func waitSocket(nc net.Conn) syscall.RawConn {
	if !canPeek || noPark.Load() {
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

// A connection that wakes often is busy: handing its waiting on at every
// pause would cost a goroutine start and its stack's growth each time
// (some microseconds of CPU on every request of a sequential caller),
// to save memory for moments. Past busyWakes wakes within busyWindow,
// its read loop waits in its read, as before park.go, until its input
// pauses for longer (its next wake after that hands the waiting on).
const (
	busyWakes  = 8
	busyWindow = 100 * time.Millisecond
)

// idle reports whether the read loop may hand the waiting to a waiter:
// it waits on a socket, nothing read is buffered above the socket, and
// the connection is not busy. Whether the socket has bytes is the
// waiter's to see (its first peek): a check here would cost a system
// call on every read, for a goroutine start saved on some.
func (c *conn) idle() bool {
	if c.sock == nil {
		return false
	}
	if ws, ok := c.nc.(*wsnet.Conn); ok && ws.Pending() > 0 {
		return false
	}
	return !c.busy(time.Now())
}

// busy counts a pause of the read loop at now and reports whether the
// connection paused more than busyWakes times within busyWindow.
func (c *conn) busy(now time.Time) bool {
	if now.Sub(c.wakesSince) > busyWindow {
		c.wakesSince, c.wakes = now, 0
	}
	c.wakes++
	return c.wakes > busyWakes
}

// await waits for the socket to become readable (or for its read
// deadline, or its closing), then runs the read loop on this goroutine.
// It is started on a fresh goroutine, whose stack is the runtime's
// smallest while it waits. The wait is followed by a read, before the
// read loop may idle again: the socket has bytes, or the wait ended in
// an error (the deadline cut sets, a closed socket), which the read
// meets too and reports.
func (c *conn) await() {
	c.peeked = false
	c.sock.Read(c.ready) // an error is the read's to report: it meets the same
	c.read(false, false)
}

// readyFunc returns the callback of the waiter's RawConn.Read. Its first
// call, made once the poller has forgotten what it saw of the socket,
// peeks at it; the poller calls it again only once it woke the waiter
// for the socket being readable, which it need not check again.
func (c *conn) readyFunc() func(fd uintptr) bool {
	return func(fd uintptr) bool {
		if c.peeked {
			return true
		}
		c.peeked = true
		return readable(fd)
	}
}
