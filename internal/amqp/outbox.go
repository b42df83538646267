package amqp

import (
	"errors"
	"sync"
	"time"
)

// The outbound side of a connection: every goroutine that writes (the
// read loop's replies, the broker's deliveries and confirms, heartbeats)
// appends whole frames to the connection's outbox and returns at once;
// one write loop writes what the outbox holds. So a client that stops
// reading holds up nobody but itself: the broker's goroutine that
// delivers to it never waits on its socket.

// writeChunk is the most handed to one write: a peer that takes a chunk
// within the write timeout is never cut, however much is buffered.
const writeChunk = 256 << 10

// closeGrace bounds the last writes of a connection that closes.
const closeGrace = time.Second

var (
	// errSlowConsumer is returned by outbox.put when what waits for the
	// client would pass the outbox's limit: it does not read.
	errSlowConsumer = errors.New("amqp: slow consumer: the client does not read what is sent to it")
	// errOutboxClosed is returned by outbox.put once the connection ends.
	errOutboxClosed = errors.New("amqp: connection closed")
)

// outbox holds the encoded frames waiting for the write loop, and the
// functions to run once they are written.
type outbox struct {
	mu     sync.Mutex // guards buf, spare, after, closed
	buf    []byte
	spare  []byte
	after  []func()
	closed bool
	ready  chan struct{} // signalled when buf or closed changes
	// limit bounds the bytes of deliveries waiting; control frames may
	// take the buffer to twice limit.
	limit int
}

func newOutbox(limit int) *outbox {
	return &outbox{ready: make(chan struct{}, 1), limit: limit}
}

// put appends what encode appends to the buffer. A delivery (data) that
// would take the buffer past the limit is not added: errSlowConsumer,
// and so is a control frame past twice the limit. after, if not nil,
// runs on the write loop once the frames are written.
func (o *outbox) put(encode func([]byte) ([]byte, error), data bool, after func()) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return errOutboxClosed
	}
	n := len(o.buf)
	b, err := encode(o.buf)
	if err != nil {
		o.buf = b[:n]
		return err
	}
	limit := o.limit
	if !data {
		limit *= 2
	}
	if len(b) > limit && n > 0 {
		// Always let one frame through an empty buffer: a message
		// larger than the limit still goes to a client that reads.
		o.buf = b[:n]
		return errSlowConsumer
	}
	o.buf = b
	if after != nil {
		o.after = append(o.after, after)
	}
	o.signal()
	return nil
}

func (o *outbox) signal() {
	select {
	case o.ready <- struct{}{}:
	default:
	}
}

// take returns what is buffered and the functions to run once it is
// written; closed reports the outbox closed (what is returned is the
// last).
func (o *outbox) take() (b []byte, after []func(), closed bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	b, after = o.buf, o.after
	o.buf, o.spare, o.after = o.spare[:0], nil, nil
	return b, after, o.closed
}

// give hands back a buffer the write loop is done with, for reuse; a
// large one is let go.
func (o *outbox) give(b []byte) {
	if cap(b) > 4*writeChunk {
		return
	}
	o.mu.Lock()
	if o.spare == nil && len(o.buf) == 0 {
		o.spare = b[:0]
	}
	o.mu.Unlock()
}

// buffered returns the bytes waiting.
func (o *outbox) buffered() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.buf)
}

// close refuses what is put after it; the write loop writes what is
// already buffered and ends.
func (o *outbox) close() {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	o.signal()
}

// writeLoop writes what the outbox holds until the connection ends: each
// chunk within the write timeout (or the close grace once closing),
// else the connection is cut. It runs the functions put with the frames
// once they are written.
func (c *conn) writeLoop() {
	defer close(c.wdone)
	for {
		select {
		case <-c.out.ready:
		case <-c.cutting:
			return
		}
		b, after, closed := c.out.take()
		if err := c.writeAll(b); err != nil {
			if isTimeout(err) && !closed {
				c.s.log.Warn("amqp slow consumer disconnected: it took nothing for the write timeout", "peer", c.peer, "user", c.user, "timeout", c.s.cfg.WriteTimeout, "waiting", len(b)+c.out.buffered())
			}
			c.cut()
			return
		}
		c.out.give(b)
		for _, f := range after {
			f()
		}
		if closed {
			return
		}
	}
}

// writeAll writes b in chunks, each with its deadline.
func (c *conn) writeAll(b []byte) error {
	for len(b) > 0 {
		n := min(len(b), writeChunk)
		c.dmu.Lock()
		deadline := time.Now().Add(c.s.cfg.WriteTimeout)
		if !c.closeBy.IsZero() && c.closeBy.Before(deadline) {
			deadline = c.closeBy
		}
		c.nc.SetWriteDeadline(deadline)
		c.dmu.Unlock()
		w, err := c.nc.Write(b[:n])
		c.lastWrite.Store(time.Now().UnixNano())
		if err != nil {
			return err
		}
		b = b[w:]
	}
	return nil
}

// cut ends the connection at once, without its last writes: the peer
// does not read, or is gone. The read loop sees the socket closed.
func (c *conn) cut() {
	c.cutOnce.Do(func() {
		close(c.cutting)
		c.out.close()
		c.nc.Close()
	})
}
