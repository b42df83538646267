package wire

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// ErrOutboxFull is returned by [Outbox.Put] when a data frame waited the
// whole timeout for room: the peer does not read.
var ErrOutboxFull = errors.New("wire: peer is not reading (outbox full)")

// ErrOutboxClosed is returned by [Outbox.Put] after [Outbox.Close].
var ErrOutboxClosed = errors.New("wire: connection closed")

// ErrWriteStalled is returned by [Outbox.Flush] when the peer took less
// than a chunk of what was buffered within the write timeout
// ([Outbox.SetWriteTimeout]): it does not read. It wraps
// [os.ErrDeadlineExceeded].
var ErrWriteStalled = fmt.Errorf("wire: peer is not reading (write stalled): %w", os.ErrDeadlineExceeded)

// Mode says how [Outbox.Put] treats a frame.
type Mode uint8

const (
	// Control frames never wait for room.
	Control Mode = iota
	// Data frames wait while the outbox is over its limit.
	Data
	// Urgent frames are data frames on a latency path (requests and
	// responses): when the connection is idle, the producer writes them
	// itself rather than hand them to the write loop. On a busy
	// connection they batch like data frames.
	Urgent
)

// busyGap is how recently a connection must have written to count as
// busy: then frames wait for the write loop's next batch, as a burst of
// small writes would cost more than the handoff.
const busyGap = 50 * time.Microsecond

// maxSpare is the largest write buffer an outbox keeps for reuse once
// idleWrites writes in a row no longer filled it to a quarter.
const (
	maxSpare   = 1 << 20
	idleWrites = 8
)

// Outbox buffers encoded frames between many producers and a connection.
// The write loop takes everything buffered in one write ([Outbox.Flush]);
// an urgent frame put while the connection is idle is written at once by
// its producer, saving a goroutine handoff. Data frames wait while more
// than a limit is buffered; control frames never wait, so the buffer is
// bounded by the limit plus the control frames in flight.
type Outbox struct {
	w      io.Writer
	writes atomic.Uint64 // completed writes, for heartbeat decisions
	// writeStart is when the chunk being written was first handed to a
	// write (unix ns; 0: no write in progress).
	writeStart atomic.Int64
	// lastWrite is when the last write ended (unix ns): a connection that
	// wrote within busyGap is busy, and urgent frames batch instead.
	lastWrite atomic.Int64

	mu      sync.Mutex // guards buf, spare, writing, closed, err, waiters, room
	buf     []byte
	spare   []byte
	idle    int  // writes in a row that filled less than a quarter of their buffer
	writing bool // someone is in w.Write
	closed  bool
	err     error
	waiters int
	room    chan struct{} // closed and replaced when room is made
	batch   *Batch        // the last Batch that deferred a write here
	ready   chan struct{}
	wake    func() // called instead of signalling ready, when set
	max     int
	limit   int
	// writeTimeout bounds every write of the write loop; pendingSince
	// is when the oldest byte still buffered was first handed to a
	// write that did not take it all (unix ns, 0: none); expiry, set by
	// [Outbox.Expire], is a deadline no write may pass (0: none).
	writeTimeout time.Duration
	pendingSince int64
	expiry       time.Time
	// fragile is set for a TLS connection, which a timed-out write
	// breaks for good: producers do not write inline on it.
	fragile bool
	// written, made by a Close that found a write in progress, is
	// signalled when the write ends.
	written *sync.Cond
}

// NewOutbox returns an outbox writing to w frames of at most maxFrame
// bytes, holding data frames back while more than limit bytes wait.
func NewOutbox(w io.Writer, maxFrame, limit int) *Outbox {
	return &Outbox{w: w, room: make(chan struct{}), ready: make(chan struct{}, 1), max: maxFrame, limit: limit, fragile: fragile(w)}
}

// fragile reports whether a timed-out write would break w for good: a
// [FragileWriter] that says so (a WebSocket), or a TLS connection, itself
// or under wrappers with a NetConn method (a node link's counting
// connection).
func fragile(w io.Writer) bool {
	for {
		if f, ok := w.(FragileWriter); ok && f.FragileWrites() {
			return true
		}
		switch c := w.(type) {
		case *tls.Conn:
			return true
		case interface{ NetConn() net.Conn }:
			w = c.NetConn()
		default:
			return false
		}
	}
}

// FragileWriter is a writer that a timed-out write breaks for good, as
// a TLS connection or a WebSocket: an [Outbox] on one never lets a
// producer write inline under a short deadline.
type FragileWriter interface {
	FragileWrites() bool
}

// SetWriteTimeout bounds the write loop's writes ([Outbox.Flush]): they
// hand the writer at most 256 KiB at a time, and a piece it has not
// taken in full d after it was first handed to a write fails the Flush
// with [ErrWriteStalled], and every Flush after it. So a peer that reads
// steadily is never cut, however large the buffer, and one that does
// not is cut on time. The writer must have a SetWriteDeadline method (a
// net.Conn); zero means no bound.
func (o *Outbox) SetWriteTimeout(d time.Duration) {
	o.mu.Lock()
	o.writeTimeout = d
	o.mu.Unlock()
}

// Expire bounds the write in progress, and every write after it, to end
// by t: a connection that is to close gives its last writes that long,
// however the peer reads. It applies to writers with a SetWriteDeadline
// method only.
func (o *Outbox) Expire(t time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.expiry.IsZero() && o.expiry.Before(t) {
		return
	}
	o.expiry = t
	if d, ok := o.w.(deadliner); ok && o.writing {
		d.SetWriteDeadline(t)
	}
}

// quietBuf is the largest buffer [Outbox.Trim] leaves to a quiet
// connection.
const quietBuf = 4 << 10

// Trim gives back the outbox's buffers when nothing waits in them and
// no write is in progress: a connection gone quiet after a burst (a
// subscriber after a fan-out) keeps no buffers of hundreds of KiB.
// [Heartbeat] calls it once nothing was written for an interval.
func (o *Outbox) Trim() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.writing || len(o.buf) > 0 {
		return
	}
	if cap(o.buf) > quietBuf {
		o.buf = nil
	}
	if cap(o.spare) > quietBuf {
		o.spare = nil
	}
	o.idle = 0
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
func (o *Outbox) Put(f *Frame, mode Mode, timeout time.Duration) error {
	return o.put(f, mode, timeout, nil)
}

// PutCancel is Put for a producer that may give up: a data frame waits for
// room until cancel is closed, then fails with ErrOutboxFull.
func (o *Outbox) PutCancel(f *Frame, mode Mode, cancel <-chan struct{}) error {
	return o.put(f, mode, 0, cancel)
}

// Offer is Put for a producer that must never wait for this peer (a
// request on its way to a handler: its requester has other work): it
// does not wait for room, and fails at once with [ErrOutboxFull] when
// the outbox holds more than [Outbox.OfferLimit].
func (o *Outbox) Offer(f *Frame, mode Mode) error {
	return o.put(f, mode, -1, nil)
}

// OfferLimit is what an outbox may hold before [Outbox.Offer] refuses:
// eight times its limit and two of the largest frames, so that a peer
// that reads is never refused for the size of the frames it is sent.
func (o *Outbox) OfferLimit() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.offerLimit()
}

func (o *Outbox) offerLimit() int { return 8*o.limit + 2*o.max }

func (o *Outbox) put(f *Frame, mode Mode, timeout time.Duration, cancel <-chan struct{}) error {
	o.mu.Lock()
	if timeout < 0 {
		if len(o.buf) > o.offerLimit() && !o.closed {
			o.mu.Unlock()
			return ErrOutboxFull
		}
	} else if mode != Control && len(o.buf) > o.limit && !o.closed {
		if f.Batch != nil && f.Batch.Pending() {
			// Do not hold other connections' frames while waiting.
			o.mu.Unlock()
			f.Batch.Flush()
			o.mu.Lock()
		}
		if err := o.waitRoom(timeout, cancel); err != nil {
			return err
		}
	}
	if o.closed {
		o.mu.Unlock()
		return ErrOutboxClosed
	}
	was := len(o.buf)
	var err error
	o.buf, err = AppendFrame(o.buf, f, o.max)
	if err != nil {
		o.mu.Unlock()
		return fmt.Errorf("put %s: %w", f.Type, err)
	}
	if f.Batch != nil && mode != Control {
		f.Batch.add(o)
		o.mu.Unlock()
		return nil // written when the batch ends
	}
	if was != 0 || o.writing {
		kick := o.batch != nil && !o.writing
		o.mu.Unlock()
		if kick {
			// What is buffered waits for a batch that may not end soon
			// (its producer blocked on backpressure): this frame does not
			// wait with it, and takes the deferred ones along.
			o.kick()
		}
		return nil // else the writer in progress, or the kick already sent, covers it
	}
	if mode == Urgent && !o.fragile && time.Now().UnixNano()-o.lastWrite.Load() > int64(busyGap) {
		o.writeLocked(true)
		return nil
	}
	o.mu.Unlock()
	o.kick()
	return nil
}

// waitRoom waits, with o.mu held (and held again on a nil return), until
// the buffer is under its limit.
func (o *Outbox) waitRoom(timeout time.Duration, cancel <-chan struct{}) error {
	o.mu.Unlock()
	o.kick() // the write loop may not know of deferred frames
	o.mu.Lock()
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
		gaveUp := false
		select {
		case <-room:
		case <-deadline:
			gaveUp = true
		case <-cancel:
			gaveUp = true
		}
		if gaveUp {
			o.mu.Lock()
			o.waiters--
			o.mu.Unlock()
			return ErrOutboxFull
		}
		o.mu.Lock()
		o.waiters--
	}
	return nil
}

// flushBatch starts the write of frames deferred by b: from this
// goroutine when inline and the connection is idle, else by a kick.
func (o *Outbox) flushBatch(b *Batch, inline bool) {
	o.mu.Lock()
	if o.batch == b {
		o.batch = nil
	}
	if len(o.buf) == 0 || o.writing || o.closed {
		// Closed: what is buffered is the write loop's last write.
		o.mu.Unlock()
		return
	}
	if inline && !o.fragile && time.Now().UnixNano()-o.lastWrite.Load() > int64(busyGap) {
		o.writeLocked(true)
		return
	}
	o.mu.Unlock()
	o.kick()
}

func (o *Outbox) kick() {
	if o.wake != nil {
		o.wake()
		return
	}
	select {
	case o.ready <- struct{}{}:
	default:
	}
}

// writeLocked writes what is buffered; o.mu is held on entry and released
// on return. What others add meanwhile is left to the write loop.
func (o *Outbox) writeLocked(inline bool) {
	p := o.buf
	next := o.spare[:0]
	if cap(next) < len(p) {
		// The producers outpace the writes: give them room for as much
		// as this write at once, rather than grow a buffer by copying
		// it over and over while the write goes on.
		next = make([]byte, 0, len(p)+len(p)/2)
	}
	o.buf, o.spare = next, nil
	o.writing = true
	if o.waiters > 0 && !o.closed { // Close closed room already
		close(o.room)
		o.room = make(chan struct{})
	}
	since := time.Now()
	if o.pendingSince != 0 && !inline {
		since = time.Unix(0, o.pendingSince)
	}
	o.mu.Unlock()
	n, why, last, err := o.writeChunks(p, inline, since)
	end := time.Now()
	o.writeStart.Store(0)
	o.writes.Add(1)
	o.lastWrite.Store(end.UnixNano())
	o.mu.Lock()
	if _, ok := o.w.(deadliner); ok && errors.Is(err, os.ErrDeadlineExceeded) {
		if !o.expiry.IsZero() && !end.Before(o.expiry) {
			why = expiryBound // set by Expire during the write
		}
		switch why {
		case inlineBound:
			err = nil
		case stallBound:
			err = ErrWriteStalled
		}
	}
	o.writing = false
	if o.written != nil {
		o.written.Broadcast()
	}
	if n < len(p) && o.pendingSince == 0 {
		o.pendingSince = last.UnixNano()
	} else if n == len(p) {
		o.pendingSince = 0
	}
	if n < len(p) && err == nil {
		// Cut short: what was not written goes first, before what others
		// added meanwhile. It moves to the front of p, which keeps its
		// capacity, so that the appends that follow do not grow a new
		// buffer; the other one becomes the spare.
		rest := append(p[:copy(p, p[n:])], o.buf...)
		o.buf, p = rest, o.buf
	}
	o.spare = p[:0]
	if cap(p) > maxSpare {
		if len(p) < cap(p)/4 {
			o.idle++
		} else {
			o.idle = 0
		}
		if o.idle >= idleWrites {
			// A burst is over: let its buffer go. While it lasts, both
			// buffers are kept, so that a connection writing a megabyte
			// at a time does not grow a new one for every write.
			o.spare, o.idle = nil, 0
		}
	}
	if err != nil && o.err == nil {
		o.err = err
	}
	more := len(o.buf) > 0 || err != nil
	o.mu.Unlock()
	if more {
		o.kick()
	}
}

// writeChunk is the most the write loop hands the socket at once when
// it has a write timeout: each chunk gets the whole timeout, so that a
// peer that reads slowly but steadily is not taken for one that stalled.
const writeChunk = 256 << 10

// writeChunks writes p, a chunk at a time for the write loop, each with
// its deadline: the first counted from since, when its oldest byte was
// first handed to a write, the others from the end of the chunk before.
// It returns what the last deadline was and when its chunk began.
func (o *Outbox) writeChunks(p []byte, inline bool, since time.Time) (n int, why bound, last time.Time, err error) {
	dl, hasDeadline := o.w.(deadliner)
	for {
		chunk := p[n:]
		o.mu.Lock()
		if !inline && o.writeTimeout > 0 && len(chunk) > writeChunk {
			chunk = chunk[:writeChunk]
		}
		var d time.Time
		d, why = o.deadline(since, inline)
		if hasDeadline {
			// Set (or cleared) every time: an earlier write's may
			// linger. Under mu, so that Expire is never overwritten.
			dl.SetWriteDeadline(d)
		}
		o.mu.Unlock()
		o.writeStart.Store(since.UnixNano())
		last = since
		var m int
		m, err = o.w.Write(chunk)
		n += m
		if err != nil || n == len(p) {
			return n, why, last, err
		}
		since = time.Now()
	}
}

// deadliner is the part of net.Conn that bounds a write.
type deadliner interface {
	SetWriteDeadline(t time.Time) error
}

// bound says what ends a write at its deadline.
type bound uint8

const (
	unbounded   bound = iota
	inlineBound       // a producer's inline write: the rest is the write loop's
	stallBound        // the write timeout: the peer does not read
	expiryBound       // the connection is closing
)

// deadline returns when a write whose bytes were first handed to a
// write at since must end (zero: never), and what that deadline is; o.mu
// is held. A producer's inline write ends after inlineLimit; the write
// loop's after the write timeout. Neither passes the expiry.
func (o *Outbox) deadline(since time.Time, inline bool) (time.Time, bound) {
	var d time.Time
	b := unbounded
	switch {
	case inline:
		d, b = since.Add(inlineLimit), inlineBound
	case o.writeTimeout > 0:
		d, b = since.Add(o.writeTimeout), stallBound
	}
	if !o.expiry.IsZero() && (d.IsZero() || !d.Before(o.expiry)) {
		d, b = o.expiry, expiryBound
	}
	return d, b
}

// inlineLimit bounds how long a producer writes for the write loop.
const inlineLimit = 20 * time.Millisecond

// Pending returns how many bytes wait to be written: those buffered, not
// counting a write in progress.
func (o *Outbox) Pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.buf)
}

// Blocked returns how long the write in progress has gone without
// taking a chunk (0: no write in progress).
func (o *Outbox) Blocked() time.Duration {
	if s := o.writeStart.Load(); s != 0 {
		return max(time.Since(time.Unix(0, s)), 1)
	}
	return 0
}

// Writes returns how many writes completed so far.
func (o *Outbox) Writes() uint64 { return o.writes.Load() }

// Ready receives a value when there is something for [Outbox.Flush].
func (o *Outbox) Ready() <-chan struct{} { return o.ready }

// SetWake makes the outbox call wake instead of signalling [Outbox.Ready]
// whenever there is something for [Outbox.Flush], and when it is closed:
// for a connection whose write loop runs only while there is something
// to write, so that an idle connection holds no goroutine for it. wake
// is called without the outbox's lock, from producers' goroutines; it
// must not block. Set it before the outbox is used.
func (o *Outbox) SetWake(wake func()) { o.wake = wake }

// Flush writes everything buffered, unless a producer is writing (it
// kicks the write loop again when done). It returns the first write error
// the outbox met, and whether it wrote anything.
func (o *Outbox) Flush() (wrote bool, err error) {
	o.mu.Lock()
	if o.err != nil {
		err = o.err
		o.mu.Unlock()
		return false, err
	}
	if o.writing || len(o.buf) == 0 {
		o.mu.Unlock()
		return false, nil
	}
	o.writeLocked(false)
	o.mu.Lock()
	err = o.err
	o.mu.Unlock()
	return true, err
}

// Close makes Put fail from now on, wakes any waiting producer and
// returns what was still buffered, for a last write. The write loop
// calls it: a producer writing inline meanwhile (for at most
// inlineLimit) finishes first, so that the last write comes after its.
func (o *Outbox) Close() []byte {
	o.mu.Lock()
	if !o.closed {
		o.closed = true
		close(o.room)
	}
	for o.writing {
		if o.written == nil {
			o.written = sync.NewCond(&o.mu)
		}
		o.written.Wait()
	}
	rest := o.buf
	o.buf = nil
	o.mu.Unlock()
	o.kick()
	return rest
}
