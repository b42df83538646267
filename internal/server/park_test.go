package server

import (
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
