package wsnet

import (
	"net"
	"sync"
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
	return c.Conn.Write(p)
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
