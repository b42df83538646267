package wire

import (
	"crypto/tls"
	"net"
	"runtime"
	"testing"
	"time"
)

// TestUnread: bytes a peer wrote and this side has not read are counted,
// through a TLS wrapper too, and none once they are read.
func TestUnread(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Unread counts on Linux only")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	defer s.Close()
	if n := Unread(s); n != 0 {
		t.Fatalf("Unread before any write = %d, want 0", n)
	}
	if _, err := c.Write(make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for Unread(s) != 100 {
		if time.Now().After(deadline) {
			t.Fatalf("Unread = %d, want 100", Unread(s))
		}
		time.Sleep(time.Millisecond)
	}
	// A wrapper with NetConn (a TLS connection) counts its socket's.
	if n := Unread(tls.Server(s, &tls.Config{})); n != 100 {
		t.Fatalf("Unread through tls.Conn = %d, want 100", n)
	}
	buf := make([]byte, 100)
	if _, err := s.Read(buf); err != nil {
		t.Fatal(err)
	}
	if n := Unread(s); n != 0 {
		t.Fatalf("Unread after reading everything = %d, want 0", n)
	}
	// A connection without a socket: 0.
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	if n := Unread(p1); n != 0 {
		t.Fatalf("Unread of a pipe = %d, want 0", n)
	}
}

// wrapped is a connection wrapper that names what it wraps, as a node
// link's counting connection does.
type wrapped struct{ net.Conn }

func (w wrapped) NetConn() net.Conn { return w.Conn }

// TestOutboxFragileUnderWrappers: an outbox writing to a TLS connection
// under wrappers is fragile (no inline writes with a short deadline,
// which break TLS for good), as one writing to the TLS connection itself
// is. Node links write through two wrappers: their inline writes broke
// TLS under load, the next write failed at once as "stalled", and the
// link was cut with its publications lost.
func TestOutboxFragileUnderWrappers(t *testing.T) {
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	tc := tls.Client(p1, &tls.Config{InsecureSkipVerify: true})
	for _, c := range []struct {
		name string
		w    net.Conn
		want bool
	}{
		{"tls", tc, true},
		{"wrapped tls", wrapped{wrapped{tc}}, true},
		{"plain", p1, false},
		{"wrapped plain", wrapped{p1}, false},
	} {
		if got := NewOutbox(c.w, 1<<16, 1<<16).fragile; got != c.want {
			t.Errorf("%s: fragile %v, want %v", c.name, got, c.want)
		}
	}
}
