package wire

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// A net.Pipe has no buffer at all: a write waits for the other end to
// read, so a peer that does not read stalls every write, whatever the
// machine's socket buffers.

// TestWriteTimeout: the write loop's write to a peer that takes nothing
// fails with ErrWriteStalled once the write timeout passes, rather than
// block for ever; later Flushes fail too.
func TestWriteTimeout(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	o := NewOutbox(a, DefaultMaxFrame, 1<<10)
	const timeout = 200 * time.Millisecond
	o.SetWriteTimeout(timeout)
	if err := o.Put(&Frame{Type: TypeMessage, Body: make([]byte, 100)}, Data, 0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := o.Flush()
	took := time.Since(start)
	if !errors.Is(err, ErrWriteStalled) {
		t.Fatalf("Flush to a peer that does not read: %v, want ErrWriteStalled", err)
	}
	// Tolerance: a second for a loaded machine to run the timer.
	if took < timeout || took > timeout+time.Second {
		t.Fatalf("the stalled write ended after %s, want %s (+1s)", took, timeout)
	}
	o.Put(&Frame{Type: TypeMessage}, Data, 0)
	if _, err := o.Flush(); !errors.Is(err, ErrWriteStalled) {
		t.Fatalf("Flush after a stall: %v", err)
	}
}

// TestWriteTimeoutCountsFromFirstTry: a write a producer began inline
// and left unfinished starts the clock; the write loop's write of the
// rest ends at the same deadline, not a full timeout later.
func TestWriteTimeoutCountsFromFirstTry(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	o := NewOutbox(a, DefaultMaxFrame, 1<<20)
	const timeout = 400 * time.Millisecond
	o.SetWriteTimeout(timeout)
	start := time.Now()
	// Idle: written inline, given up after inlineLimit with the rest left.
	if err := o.Put(&Frame{Type: TypeResponse, Body: make([]byte, 100)}, Urgent, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Flush(); !errors.Is(err, ErrWriteStalled) {
		t.Fatalf("Flush: %v, want ErrWriteStalled", err)
	}
	if took := time.Since(start); took > timeout+time.Second {
		t.Fatalf("stalled after %s, want %s from the first try (+1s)", took, timeout)
	}
}

// TestWriteTimeoutLetsReadersThrough: a peer that reads, however the
// writes are cut into pieces, never meets the write timeout.
func TestWriteTimeoutLetsReadersThrough(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	o := NewOutbox(a, DefaultMaxFrame, 1<<20)
	o.SetWriteTimeout(time.Second)
	go io.Copy(io.Discard, b)
	for i := range 1000 {
		if err := o.Put(&Frame{Type: TypeMessage, Ref: uint64(i), Body: make([]byte, 1000)}, Data, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := o.Flush(); err != nil {
			t.Fatalf("Flush %d: %v", i, err)
		}
	}
}

// TestExpireEndsABlockedWrite: a connection that is to close bounds the
// write the write loop is held in, even with no write timeout.
func TestExpireEndsABlockedWrite(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	o := NewOutbox(a, DefaultMaxFrame, 1<<10)
	o.Put(&Frame{Type: TypeMessage, Body: make([]byte, 100)}, Data, 0)
	done := make(chan error, 1)
	go func() {
		_, err := o.Flush()
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("Flush to a peer that does not read ended: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	o.Expire(time.Now().Add(50 * time.Millisecond))
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Flush after Expire: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Expire did not end the blocked write")
	}
}

// TestOfferNeverWaits: Offer adds past the limit without waiting, and
// refuses at once past eight times the limit and two of the largest
// frames.
func TestOfferNeverWaits(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	const limit, maxFrame = 1 << 10, 4 << 10
	o := NewOutbox(a, maxFrame, limit)
	if o.OfferLimit() != 8*limit+2*maxFrame {
		t.Fatalf("offer limit %d, want %d", o.OfferLimit(), 8*limit+2*maxFrame)
	}
	body := make([]byte, 100)
	var n int
	for ; n < 1000; n++ {
		err := o.Offer(&Frame{Type: TypeRequest, Ref: uint64(n + 1), Body: body}, Urgent)
		if errors.Is(err, ErrOutboxFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	o.mu.Lock()
	held := len(o.buf)
	o.mu.Unlock()
	if n == 1000 || held < o.OfferLimit() || held > o.OfferLimit()+200 {
		t.Fatalf("Offer took %d frames (%d bytes) before refusing; want the refusal just past %d bytes", n, held, o.OfferLimit())
	}
}

// TestWriteTimeoutLetsSlowReadersThrough: the write timeout bounds a
// stall, not a write: a peer that takes a 4 MiB buffer slowly but
// steadily (a chunk in a fifth of the timeout, the whole in three
// timeouts) is not cut. (It was, when the deadline bounded the whole
// write.)
func TestWriteTimeoutLetsSlowReadersThrough(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	o := NewOutbox(a, DefaultMaxFrame, 8<<20)
	o.SetWriteTimeout(time.Second)
	const size = 4 << 20
	if err := o.Put(&Frame{Type: TypeMessage, Body: make([]byte, size-100)}, Data, 0); err != nil {
		t.Fatal(err)
	}
	read := make(chan int, 1)
	go func() {
		buf := make([]byte, 64<<10)
		n := 0
		for {
			m, err := io.ReadFull(b, buf)
			n += m
			if err != nil {
				read <- n
				return
			}
			time.Sleep(50 * time.Millisecond) // 64 KiB in 50 ms: a 256 KiB chunk in 200 ms
		}
	}()
	start := time.Now()
	if _, err := o.Flush(); err != nil {
		t.Fatalf("Flush to a slow reader, after %s: %v", time.Since(start), err)
	}
	if took := time.Since(start); took < time.Second {
		t.Logf("the slow reader took the buffer in %s, within one timeout: the test proves less than it should", took)
	}
	a.Close()
	<-read
}

// TestHeartbeatZeroInterval: a peer that agrees to no interval at all
// (a hostile server's WELCOME with heartbeat_ms 0) does not make the
// watch fire in a busy loop.
func TestHeartbeatZeroInterval(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	var checks atomic.Int64
	done := make(chan struct{})
	h := Heartbeat{
		Out:      NewOutbox(a, DefaultMaxFrame, 1<<10),
		Interval: func() time.Duration { return 0 },
		Timeout:  func(hb time.Duration) time.Duration { return 3 * hb },
		Heard:    func() bool { checks.Add(1); return false },
		Silent:   func(time.Duration) {},
		Done:     done,
	}
	stop := h.Start(0)
	time.Sleep(100 * time.Millisecond)
	close(done)
	stop()
	// At most one check every 5 ms: 20 in 100 ms, and room for a loaded
	// machine's late timers to bunch up.
	if n := checks.Load(); n > 40 {
		t.Fatalf("%d checks in 100 ms with a zero interval: a busy loop", n)
	}
}
