package server

import (
	"crypto/tls"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestBusyConnectionsWaitInTheirReads: a connection's read loop hands
// its waiting to a waiter at each pause until it paused more than
// busyWakes times within busyWindow; then it waits in its read until its
// pauses are that far apart again.
func TestBusyConnectionsWaitInTheirReads(t *testing.T) {
	now := time.Unix(1000, 0)
	c := &conn{}
	for i := range busyWakes {
		if c.busy(now) {
			t.Fatalf("pause %d of %d within %s: busy, want idle", i+1, busyWakes, busyWindow)
		}
		now = now.Add(busyWindow / (2 * busyWakes))
	}
	if !c.busy(now) {
		t.Fatalf("pause %d within %s: idle, want busy", busyWakes+1, busyWindow)
	}
	now = now.Add(busyWindow + time.Millisecond)
	if c.busy(now) {
		t.Fatalf("a pause %s after the last: busy, want idle", busyWindow+time.Millisecond)
	}
}

// TestIdleNeedsASocket: without a socket to wait on (TLS), a read loop
// never idles; with one, it does at a pause.
func TestIdleNeedsASocket(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if (&conn{nc: a}).idle() {
		t.Fatal("a connection without a socket to wait on is idle")
	}
	if !(&conn{nc: a, sock: fakeRaw{}}).idle() {
		t.Fatal("a connection with a socket to wait on, at its first pause: not idle")
	}
}

// fakeRaw stands for a socket a waiter could wait on.
type fakeRaw struct{ syscall.RawConn }

// TestWaitSocket: a plain TCP connection, also under wrappers that name
// it (NetConn), has a socket to wait on; one under TLS, which keeps
// decrypted bytes out of sight, has none.
func TestWaitSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if waitSocket(nc) == nil {
		t.Error("a TCP connection: no socket to wait on")
	}
	if waitSocket(wrapped{nc}) == nil {
		t.Error("a wrapped TCP connection: no socket to wait on")
	}
	if waitSocket(tls.Client(nc, &tls.Config{})) != nil {
		t.Error("a TLS connection: a socket to wait on")
	}
	if waitSocket(wrapped{tls.Client(nc, &tls.Config{})}) != nil {
		t.Error("a wrapped TLS connection: a socket to wait on")
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if waitSocket(a) != nil {
		t.Error("a pipe: a socket to wait on")
	}
}

// wrapped is a connection wrapper that names the connection it wraps.
type wrapped struct{ net.Conn }

func (w wrapped) NetConn() net.Conn { return w.Conn }
