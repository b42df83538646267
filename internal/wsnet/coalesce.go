package wsnet

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Coalescer is the connection under a WebSocket whose writes a [Conn]
// gathers: the WebSocket library flushes every message to its
// connection, and a Conn that writes a batch of frames (one message
// each) makes that one write to the socket instead of one per frame.
// Writes outside a batch (the library's pongs and close frames) go
// through at once, or with the batch when one is being gathered.
type Coalescer struct {
	net.Conn
	mu      sync.Mutex // guards holding, buf; held across the socket write of a batch
	holding bool
	buf     []byte
	// lastPong is when a ping was last let through (unix ns).
	lastPong atomic.Int64
	// deadline is the write deadline last set (unix ns, 0: none).
	deadline atomic.Int64
}

// NewCoalescer wraps nc, the connection a WebSocket is opened on.
func NewCoalescer(nc net.Conn) *Coalescer { return &Coalescer{Conn: nc} }

// maxKept bounds a batch buffer given back to batchBufs for the next
// batch; a larger one is let go.
const maxKept = 64 << 10

// batchBufs holds the batch buffers between batches: a connection keeps
// none while it is idle, and thousands of idle connections share the
// few the busy ones use.
var batchBufs = sync.Pool{New: func() any { return new([]byte) }}

// Write writes p to the socket, or adds it to the batch being gathered.
func (c *Coalescer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holding {
		if c.buf == nil {
			c.buf = *batchBufs.Get().(*[]byte)
		}
		c.buf = append(c.buf, p...)
		return len(p), nil
	}
	// The library's own frame (a pong, a close): the write deadline the
	// engine left may have passed long ago (it sets one before each of
	// its writes), and the library bounds the write itself (5 s).
	if d := c.deadline.Load(); d != 0 && time.Now().UnixNano() > d {
		c.Conn.SetWriteDeadline(time.Now().Add(controlWrite))
		defer func() {
			// Back to the engine's, which it may have set meanwhile.
			var t time.Time
			if d := c.deadline.Load(); d != 0 {
				t = time.Unix(0, d)
			}
			c.Conn.SetWriteDeadline(t)
		}()
	}
	return c.Conn.Write(p)
}

// controlWrite bounds a write of the library's own frames when the
// engine's deadline has passed: the library's own bound.
const controlWrite = 5 * time.Second

// SetWriteDeadline sets the write deadline of the connection, and
// notes it for the library's own frames.
func (c *Coalescer) SetWriteDeadline(t time.Time) error {
	if t.IsZero() {
		c.deadline.Store(0)
	} else {
		c.deadline.Store(t.UnixNano())
	}
	return c.Conn.SetWriteDeadline(t)
}

// SetDeadline sets the read and write deadlines of the connection, and
// notes the write deadline as SetWriteDeadline does.
func (c *Coalescer) SetDeadline(t time.Time) error {
	if err := c.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetReadDeadline(t)
}

// pongRoom is how much a socket's send queue may hold for every ping to
// be answered: well under the smallest send buffer Linux gives a socket
// (4,608 bytes), so that a pong (at most 127 bytes) does not wait for
// room. pongEvery is how often a ping is answered whatever the queue.
const (
	pongRoom  = 2 << 10
	pongEvery = time.Second
)

// AnswerPing reports whether a WebSocket ping is to be answered, as
// websocket.AcceptOptions.OnPingReceived. The WebSocket library writes
// pongs from the read loop, under a timeout of 5 s after which it closes
// the connection: a client that floods pings and reads nothing would
// hold the read loop in a pong write that long, and its other frames
// with it. So a ping is answered when the socket's send queue holds
// under pongRoom bytes (on Linux; elsewhere always), and otherwise only
// if none was answered for pongEvery: the pongs of a flood back up to a
// trickle. RFC 6455 lets an endpoint answer only the latest of the pings
// it got; a client that pings at most once a second always gets its
// pong. The heartbeat and the slow-consumer timeout still apply.
func (c *Coalescer) AnswerPing(context.Context, []byte) bool {
	now := time.Now().UnixNano()
	if now-c.lastPong.Load() < int64(pongEvery) && unsent(c.Conn) >= pongRoom {
		return false
	}
	c.lastPong.Store(now)
	return true
}

// unsent returns how many bytes wait in the send queue of the socket
// under nc (through wrappers with a NetConn method), or -1 when it
// cannot tell (other systems than Linux, no socket).
func unsent(nc net.Conn) int {
	for {
		w, ok := nc.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		nc = w.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return -1
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	n := -1
	if err := rc.Control(func(fd uintptr) { n = unsentFD(fd) }); err != nil {
		return -1
	}
	return n
}

// hold starts gathering writes.
func (c *Coalescer) hold() {
	c.mu.Lock()
	c.holding = true
	c.mu.Unlock()
}

// release writes what was gathered in one write and stops gathering.
func (c *Coalescer) release() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.holding = false
	if c.buf == nil {
		return nil
	}
	var err error
	if len(c.buf) > 0 {
		_, err = c.Conn.Write(c.buf)
	}
	if cap(c.buf) <= maxKept {
		b := c.buf[:0]
		batchBufs.Put(&b)
	}
	c.buf = nil
	return err
}

// NetConn returns the connection under c.
func (c *Coalescer) NetConn() net.Conn { return c.Conn }
