package wire

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrOutboxFull is returned by [Outbox.Put] when a data frame waited the
// whole timeout for room: the peer does not read.
var ErrOutboxFull = errors.New("wire: peer is not reading (outbox full)")

// ErrOutboxClosed is returned by [Outbox.Put] after [Outbox.Close].
var ErrOutboxClosed = errors.New("wire: connection closed")

// Outbox buffers encoded frames between many producers and the one
// goroutine that writes them to a connection, which takes everything
// buffered in one write. Data frames wait while more than a limit is
// buffered; control frames never wait, so the buffer is bounded by the
// limit plus the control frames in flight.
type Outbox struct {
	mu      sync.Mutex // guards buf, closed, waiters, room
	buf     []byte
	closed  bool
	waiters int
	room    chan struct{} // closed and replaced when the writer takes
	ready   chan struct{}
	max     int
	limit   int
}

// NewOutbox returns an outbox for frames of at most maxFrame bytes that
// holds data frames back while more than limit bytes wait.
func NewOutbox(maxFrame, limit int) *Outbox {
	return &Outbox{room: make(chan struct{}), ready: make(chan struct{}, 1), max: maxFrame, limit: limit}
}

// SetMax changes the largest frame accepted, after a handshake.
func (o *Outbox) SetMax(maxFrame int) {
	o.mu.Lock()
	o.max = maxFrame
	o.mu.Unlock()
}

// Put encodes f into the outbox; it does not take ownership of f. A data
// frame waits while the outbox is over its limit, at most timeout (zero:
// as long as it takes).
func (o *Outbox) Put(f *Frame, data bool, timeout time.Duration) error {
	o.mu.Lock()
	if data && len(o.buf) > o.limit && !o.closed {
		var deadline <-chan time.Time
		if timeout > 0 {
			t := time.NewTimer(timeout)
			defer t.Stop()
			deadline = t.C
		}
		for len(o.buf) > o.limit && !o.closed {
			room := o.room
			o.waiters++
			o.mu.Unlock()
			select {
			case <-room:
			case <-deadline:
				o.mu.Lock()
				o.waiters--
				o.mu.Unlock()
				return ErrOutboxFull
			}
			o.mu.Lock()
			o.waiters--
		}
	}
	if o.closed {
		o.mu.Unlock()
		return ErrOutboxClosed
	}
	was := len(o.buf)
	var err error
	o.buf, err = AppendFrame(o.buf, f, o.max)
	kick := was == 0 && len(o.buf) > 0
	o.mu.Unlock()
	if err != nil {
		return fmt.Errorf("put %s: %w", f.Type, err)
	}
	if kick {
		select {
		case o.ready <- struct{}{}:
		default:
		}
	}
	return nil
}

// Ready receives a value when the outbox goes from empty to non-empty.
func (o *Outbox) Ready() <-chan struct{} { return o.ready }

// Take moves everything buffered out and returns it; spare, emptied, is
// kept as the next buffer so that two slices alternate without garbage.
func (o *Outbox) Take(spare []byte) []byte {
	o.mu.Lock()
	out := o.buf
	o.buf = spare[:0]
	if o.waiters > 0 {
		close(o.room)
		o.room = make(chan struct{})
	}
	o.mu.Unlock()
	return out
}

// Close makes Put fail from now on and wakes any waiting producer.
func (o *Outbox) Close() {
	o.mu.Lock()
	if !o.closed {
		o.closed = true
		close(o.room)
	}
	o.mu.Unlock()
	select {
	case o.ready <- struct{}{}:
	default:
	}
}
