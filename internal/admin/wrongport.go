package admin

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/courier-mq/courier/wire"
)

// errCourierClient ends a management connection whose client speaks the
// Courier protocol.
var errCourierClient = errors.New("admin: a Courier client on the management port")

// sniffListener answers Courier clients that reached the management port
// (a courier:// URL with the HTTP port) with an ERROR frame naming the
// client port, at once, instead of leaving them to wait for an HTTP
// answer that never comes.
type sniffListener struct {
	net.Listener
	reason func() string
}

func (l *sniffListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &sniffConn{Conn: c, reason: l.reason}, nil
}

// sniffConn looks at the first bytes read: a Courier frame starts with a
// big-endian length, whose first byte is 0 for any frame a HELLO can be,
// and then the type, HELLO (1); an HTTP request starts with a letter and
// a TLS handshake with 0x16.
type sniffConn struct {
	net.Conn
	reason  func() string
	once    sync.Once
	head    []byte // the first bytes, until decided
	read    int    // bytes read until decided
	decided bool
}

// NetConn returns the connection under c.
func (c *sniffConn) NetConn() net.Conn { return c.Conn }

func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.decided || n == 0 {
		return n, err
	}
	c.read += n
	c.head = append(c.head, p[:min(n, 5-len(c.head))]...)
	if c.head[0] != 0 {
		c.decided, c.head = true, nil
		return n, err
	}
	if len(c.head) < 5 {
		return n, err
	}
	c.decided = true
	if wire.Type(c.head[4]) != wire.TypeHello {
		return n, err
	}
	c.refuse(int(binary.BigEndian.Uint32(c.head)) + 4 - c.read)
	return 0, errCourierClient
}

// refuse writes a fatal ERROR frame that says where clients connect,
// after reading the rest of the HELLO (left bytes, at most 64 KiB), so
// that closing with unread input does not reset the connection before
// the client reads the answer.
func (c *sniffConn) refuse(left int) {
	c.once.Do(func() {
		c.Conn.SetDeadline(time.Now().Add(time.Second))
		if left > 0 {
			io.CopyN(io.Discard, c.Conn, int64(min(left, 64<<10)))
		}
		e := wire.Errorf(wire.CodeProtocol, "%s", c.reason())
		f := &wire.Frame{Type: wire.TypeError, Flags: wire.FlagFatal, Aux: uint64(e.Code), Tag: e.Msg}
		b, _ := wire.AppendFrame(nil, f, 0)
		c.Conn.Write(b)
	})
}

// wrongPortReason tells a Courier client where clients connect.
func (s *Server) wrongPortReason() string {
	for _, l := range s.listeners() {
		if l.Protocol == "courier" || l.Protocol == "courier+tls" {
			return "this is Courier's management HTTP port (API and dashboard); clients connect to " + l.Protocol + "://" + l.Address
		}
	}
	return "this is Courier's management HTTP port (API and dashboard); clients connect to the server's --listen address (default courier://127.0.0.1:7400)"
}
