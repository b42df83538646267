package wire

import (
	"errors"
	"io"
	"net"
	"os"
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
// refuses at once past eight times the limit.
func TestOfferNeverWaits(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	const limit = 1 << 10
	o := NewOutbox(a, DefaultMaxFrame, limit)
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
	if n == 1000 || held < 8*limit || held > 8*limit+200 {
		t.Fatalf("Offer took %d frames (%d bytes) before refusing; want the refusal just past %d bytes", n, held, 8*limit)
	}
}
