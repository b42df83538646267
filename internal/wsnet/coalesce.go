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

// maxKept bounds the batch buffer kept between batches.
const maxKept = 64 << 10

// Write writes p to the socket, or adds it to the batch being gathered.
func (c *Coalescer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holding {
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
	if len(c.buf) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.buf)
	c.buf = c.buf[:0]
	if cap(c.buf) > maxKept {
		c.buf = nil
	}
	return err
}

// NetConn returns the connection under c.
func (c *Coalescer) NetConn() net.Conn { return c.Conn }
