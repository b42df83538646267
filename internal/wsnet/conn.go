// Package wsnet carries Courier's wire protocol over WebSocket
// (github.com/coder/websocket): a [Conn] is a net.Conn whose byte
// stream is the frames of the protocol, one frame in each binary
// WebSocket message, both ways. The connection engines of the server
// and of the Go client run on it unchanged, as on a TCP connection.
//
// Reading, a Conn checks that every message is binary and holds
// exactly one whole frame: a text message, a message shorter than its
// frame or one holding more than its frame ends the stream with an
// error wrapping [wire.ErrMalformed], which the engines answer as any
// malformed frame (a fatal ERROR, code 1). A frame's length prefix is
// handed to the reader before its body is read, so that a frame over
// the limit is refused from its prefix alone (code 3).
//
// Writing, a Conn cuts what it is given at frame boundaries and writes
// each frame as one message, without copying it; a frame that a write
// hands over in pieces (a write cut at 256 KiB) is gathered first. On a
// [Coalescer] the messages of one write reach the socket in one write.
//
// Deadlines are those of the TCP (or TLS) connection under the
// WebSocket: a read that times out leaves the connection able to
// write, so that the server can still send its fatal ERROR (no HELLO
// in time).
package wsnet

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/courier-mq/courier/wire"
)

// Subprotocol is the WebSocket subprotocol of Courier's wire protocol,
// version 1. A client may ask for it (Sec-WebSocket-Protocol); the
// server agrees to it, and speaks the same without it.
const Subprotocol = "courier.v1"

// maxWrite bounds a frame a Conn writes: the wire format's length is a
// u32, and no Courier limit comes near 1 GiB.
const maxWrite = 1 << 30

// Conn is a net.Conn over a WebSocket, one Courier frame per message.
// Reads are for one goroutine at a time, as are writes; the two may run
// at once.
type Conn struct {
	ws  *websocket.Conn
	src messages // ws, for reading
	raw net.Conn // under the WebSocket: deadlines and addresses
	// br is the buffered reader the library reads raw through, when
	// known (see [Conn.ReadsThrough]). The read side uses it, and the
	// closing handshake CloseWrite starts, holding brMu, which Pending
	// only tries.
	br   *bufio.Reader
	brMu sync.Mutex

	// The read side: the message being read, its frame's length prefix
	// (handed out first) and what is left of its frame.
	msg    io.Reader
	prefix [4]byte
	handed int // bytes of prefix handed out
	left   int // bytes of the frame's body not yet handed out

	wmu   sync.Mutex
	carry []byte // a frame given in pieces, until it is whole

	closeOnce sync.Once
}

// NewConn returns a Conn on ws, whose deadlines and addresses are those
// of raw, the connection under it. readLimit bounds a message (with
// slack for its prefix): at least the largest frame the reader accepts
// plus 5 bytes.
func NewConn(ws *websocket.Conn, raw net.Conn, readLimit int64) *Conn {
	ws.SetReadLimit(readLimit)
	return &Conn{ws: ws, src: ws, raw: raw}
}

// ReadsThrough tells c the buffered reader the WebSocket library reads
// the connection under it through (the one a hijacked connection was
// handed with), so that [Conn.Pending] counts what that holds.
func (c *Conn) ReadsThrough(br *bufio.Reader) { c.br = br }

// Pending returns how many bytes a Read can hand out without reading the
// socket: a frame's length prefix not yet handed out, and what the
// library's buffered reader holds (when [Conn.ReadsThrough] named it).
// With none, a Read waits for the socket, unless the WebSocket library
// is inside a message or a control frame, whose rest comes from the
// socket too. A connection's read loop may then wait for the socket to
// become readable on a goroutine with a small stack, rather than in a
// Read twenty calls deep.
//
// Pending is for the reading goroutine. While the closing handshake
// that [Conn.CloseWrite] started reads the connection, it returns 1:
// what comes next is for a Read to see.
func (c *Conn) Pending() int {
	if !c.brMu.TryLock() {
		return 1
	}
	defer c.brMu.Unlock()
	n := 0
	if c.msg != nil {
		n += len(c.prefix) - c.handed
	}
	if c.br != nil {
		n += c.br.Buffered()
	}
	return n
}

// Socket returns the connection under the WebSocket.
func (c *Conn) Socket() net.Conn { return c.raw }

// messages is where a Conn reads its messages from: the WebSocket, or
// a test's list.
type messages interface {
	Reader(ctx context.Context) (websocket.MessageType, io.Reader, error)
}

// FragileWrites reports that a write cut by its deadline breaks the
// WebSocket for good ([wire.FragileWriter]).
func (c *Conn) FragileWrites() bool { return true }

// Read reads the byte stream of the frames, one message at a time.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if c.msg == nil {
		if err := c.next(); err != nil {
			return 0, err
		}
	}
	if c.handed < len(c.prefix) {
		n := copy(p, c.prefix[c.handed:])
		c.handed += n
		if c.handed == len(c.prefix) && c.left == 0 {
			if err := c.end(); err != nil {
				return 0, err
			}
		}
		return n, nil
	}
	n, err := c.msg.Read(p[:min(len(p), c.left)])
	c.left -= n
	switch {
	case errors.Is(err, io.EOF) && c.left > 0:
		return 0, fmt.Errorf("%w: a WebSocket message ends inside its frame, %d bytes short", wire.ErrMalformed, c.left)
	case err != nil && !errors.Is(err, io.EOF):
		return 0, readErr(err)
	}
	if c.left == 0 {
		if err := c.end(); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// next opens the next message and reads its frame's length prefix.
func (c *Conn) next() error {
	typ, r, err := c.src.Reader(context.Background())
	if err != nil {
		return readErr(err)
	}
	if typ != websocket.MessageBinary {
		return fmt.Errorf("%w: a text WebSocket message; frames travel in binary messages", wire.ErrMalformed)
	}
	n, err := io.ReadFull(r, c.prefix[:])
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: a WebSocket message of %d bytes, shorter than a frame", wire.ErrMalformed, n)
	}
	if err != nil {
		return readErr(err)
	}
	c.msg, c.handed = r, 0
	c.left = int(binary.BigEndian.Uint32(c.prefix[:]))
	return nil
}

// end checks that the message ends with its frame.
func (c *Conn) end() error {
	var b [1]byte
	for {
		n, err := c.msg.Read(b[:])
		if n > 0 {
			return fmt.Errorf("%w: a WebSocket message holds more than one frame", wire.ErrMalformed)
		}
		if errors.Is(err, io.EOF) {
			c.msg = nil
			return nil
		}
		if err != nil {
			return readErr(err)
		}
	}
}

// readErr translates the WebSocket's read errors: a close from the
// peer is the end of the stream, a deadline a timeout.
func readErr(err error) error {
	if s := websocket.CloseStatus(err); s != -1 {
		if s == websocket.StatusNormalClosure || s == websocket.StatusGoingAway {
			return io.EOF
		}
		return fmt.Errorf("%w: the peer closed the WebSocket: %w", io.EOF, err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return os.ErrDeadlineExceeded
	}
	if errors.Is(err, net.ErrClosed) {
		return net.ErrClosed
	}
	return err
}

// Write writes the frames of p, each as one binary message. p may end
// inside a frame: the rest of it comes with the next Write.
func (c *Conn) Write(p []byte) (n int, err error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if co, ok := c.raw.(*Coalescer); ok {
		// One socket write for the frames of p, not one per message.
		co.hold()
		defer func() {
			if rerr := co.release(); rerr != nil && err == nil {
				n, err = 0, writeErr(rerr)
			}
		}()
	}
	return c.write(p)
}

// write writes the frames of p, as Write.
func (c *Conn) write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		if len(c.carry) == 0 && len(p) >= 4 {
			n := 4 + int(binary.BigEndian.Uint32(p))
			if n > maxWrite {
				return total - len(p), fmt.Errorf("wsnet: a frame of %d bytes", n)
			}
			if n <= len(p) {
				if err := c.send(p[:n]); err != nil {
					return total - len(p), err
				}
				p = p[n:]
				continue
			}
		}
		take := min(c.missing(), len(p))
		c.carry = append(c.carry, p[:take]...)
		p = p[take:]
		if len(c.carry) >= 4 && c.missing() == 0 {
			err := c.send(c.carry)
			c.carry = c.carry[:0]
			if cap(c.carry) > 64<<10 {
				c.carry = nil
			}
			if err != nil {
				return total - len(p), err
			}
		}
	}
	return total, nil
}

// missing returns how many bytes the frame gathered in carry lacks: of
// its length prefix, else of its whole.
func (c *Conn) missing() int {
	if len(c.carry) < 4 {
		return 4 - len(c.carry)
	}
	return min(4+int(binary.BigEndian.Uint32(c.carry)), maxWrite) - len(c.carry)
}

// send writes one frame as a message.
func (c *Conn) send(frame []byte) error {
	return writeErr(c.ws.Write(context.Background(), websocket.MessageBinary, frame))
}

// writeErr translates a write's deadline into os.ErrDeadlineExceeded,
// which the outbox tells from other errors.
func writeErr(err error) error {
	if err == nil {
		return nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return os.ErrDeadlineExceeded
	}
	return err
}

// CloseWrite starts the WebSocket's closing handshake: the peer is told
// the stream ends (status 1000) and answers with its own close, which
// ends the reads here.
func (c *Conn) CloseWrite() error {
	go func() {
		// The handshake reads the library's buffered reader, which
		// Pending looks at.
		c.brMu.Lock()
		defer c.brMu.Unlock()
		c.ws.Close(websocket.StatusNormalClosure, "")
	}()
	return nil
}

// Close closes the connection at once.
func (c *Conn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		// The socket first: a closing handshake CloseWrite started
		// may be waiting on it.
		err = c.raw.Close()
		c.ws.CloseNow()
	})
	return err
}

// LocalAddr returns the local address of the connection under the
// WebSocket.
func (c *Conn) LocalAddr() net.Addr { return c.raw.LocalAddr() }

// RemoteAddr returns the peer's address, as the connection under the
// WebSocket has it (not what a proxy in front may say).
func (c *Conn) RemoteAddr() net.Addr { return c.raw.RemoteAddr() }

// SetDeadline sets the read and write deadlines of the connection under
// the WebSocket.
func (c *Conn) SetDeadline(t time.Time) error { return c.raw.SetDeadline(t) }

// SetReadDeadline sets the read deadline of the connection under the
// WebSocket.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.raw.SetReadDeadline(t) }

// SetWriteDeadline sets the write deadline of the connection under the
// WebSocket.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.raw.SetWriteDeadline(t) }
