package wire

import (
	"bytes"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// countingWriter records each Write call separately.
type countingWriter struct {
	mu     sync.Mutex
	writes [][]byte
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = append(w.writes, bytes.Clone(p))
	return len(p), nil
}

func (w *countingWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.writes)
}

func TestOutboxUrgentIdleWritesInline(t *testing.T) {
	w := &countingWriter{}
	o := NewOutbox(w, DefaultMaxFrame, 1<<20)
	if err := o.Put(&Frame{Type: TypeResponse, Ref: 1}, Urgent, 0); err != nil {
		t.Fatal(err)
	}
	if w.count() != 1 {
		t.Fatalf("an urgent frame on an idle outbox made %d writes, want 1 inline", w.count())
	}
	// Right after a write the connection counts as busy: the next urgent
	// frame waits for the write loop.
	o.Put(&Frame{Type: TypeResponse, Ref: 2}, Urgent, 0)
	if w.count() != 1 {
		t.Fatal("an urgent frame on a busy outbox was written inline")
	}
	select {
	case <-o.Ready():
	default:
		t.Fatal("the write loop was not kicked")
	}
	if wrote, err := o.Flush(); !wrote || err != nil || w.count() != 2 {
		t.Fatalf("Flush: wrote %v, err %v, writes %d", wrote, err, w.count())
	}
}

func TestBatchDefersWrites(t *testing.T) {
	w := &countingWriter{}
	o := NewOutbox(w, DefaultMaxFrame, 1<<20)
	var b Batch
	for i := range 50 {
		if err := o.Put(&Frame{Type: TypeRequest, Ref: uint64(i + 1), Batch: &b}, Urgent, 0); err != nil {
			t.Fatal(err)
		}
	}
	if w.count() != 0 {
		t.Fatalf("%d writes before the batch ended", w.count())
	}
	select {
	case <-o.Ready():
		t.Fatal("the write loop was kicked before the batch ended")
	default:
	}
	time.Sleep(2 * busyGap) // let the outbox count as idle: Flush then writes inline
	b.Flush()
	if w.count() != 1 {
		t.Fatalf("the batch ended in %d writes, want 1", w.count())
	}
	r := NewReader(bytes.NewReader(w.writes[0]), DefaultMaxFrame)
	for i := range 50 {
		var f Frame
		if err := r.Next(&f); err != nil || f.Ref != uint64(i+1) {
			t.Fatalf("frame %d: %+v %v", i, f, err)
		}
	}
}

func TestBatchOfManyKicksWriteLoops(t *testing.T) {
	var b Batch
	var outs []*Outbox
	for range 3 {
		o := NewOutbox(&countingWriter{}, DefaultMaxFrame, 1<<20)
		o.Put(&Frame{Type: TypeMessage, Attach: 1, Batch: &b}, Data, 0)
		outs = append(outs, o)
	}
	b.Flush()
	for i, o := range outs {
		select {
		case <-o.Ready():
		default:
			t.Fatalf("outbox %d was not kicked at the end of the batch", i)
		}
	}
	if b.Pending() {
		t.Fatal("batch still pending after Flush")
	}
}

// TestBatchFlushesBeforeWaiting: a producer that must wait for room first
// lets go of the frames it deferred elsewhere.
func TestBatchFlushesBeforeWaiting(t *testing.T) {
	var b Batch
	ow := &countingWriter{}
	other := NewOutbox(ow, DefaultMaxFrame, 1<<20)
	other.Put(&Frame{Type: TypeMessage, Attach: 1, Batch: &b}, Data, 0)
	full := NewOutbox(&countingWriter{}, DefaultMaxFrame, 0)
	full.Put(&Frame{Type: TypeMessage, Attach: 1}, Data, 0) // over the limit of 0 now
	err := full.Put(&Frame{Type: TypeMessage, Attach: 2, Batch: &b}, Data, 10*time.Millisecond)
	if !errors.Is(err, ErrOutboxFull) {
		t.Fatalf("want ErrOutboxFull, got %v", err)
	}
	select {
	case <-other.Ready():
	default:
		if ow.count() == 0 {
			t.Fatal("the deferred frame of another connection stayed held while waiting")
		}
	}
}

// TestInlineWriteGivesUp: a producer writing for an idle connection whose
// peer does not read gives up after inlineLimit and leaves the rest to
// the write loop; nothing is lost or reordered.
func TestInlineWriteGivesUp(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	o := NewOutbox(a, DefaultMaxFrame, 1<<20)
	start := time.Now()
	if err := o.Put(&Frame{Type: TypeResponse, Ref: 1, Body: []byte("first")}, Urgent, 0); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 10*inlineLimit {
		t.Fatalf("the producer was held %s by a peer that does not read", d)
	}
	o.Put(&Frame{Type: TypeResponse, Ref: 2, Body: []byte("second")}, Data, 0)
	go func() { // the write loop
		for range o.Ready() {
			if _, err := o.Flush(); err != nil {
				return
			}
		}
	}()
	r := NewReader(b, DefaultMaxFrame)
	for want := uint64(1); want <= 2; want++ {
		var f Frame
		if err := r.Next(&f); err != nil || f.Ref != want {
			t.Fatalf("frame %d: got %+v, %v", want, f, err)
		}
	}
}

// trickleWriter takes at most 100 bytes of a write made under a
// deadline and says the deadline passed, as a socket with a full buffer
// does; other writes it takes whole.
type trickleWriter struct {
	mu       sync.Mutex
	buf      bytes.Buffer
	deadline bool
	put      func() // called during each cut-short write, as other producers would
}

func (w *trickleWriter) SetWriteDeadline(t time.Time) error {
	w.mu.Lock()
	w.deadline = !t.IsZero()
	w.mu.Unlock()
	return nil
}

func (w *trickleWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	short := w.deadline && len(p) > 100
	put := w.put
	if short {
		p = p[:100]
	}
	w.buf.Write(p)
	w.mu.Unlock()
	if short {
		if put != nil {
			put()
		}
		return len(p), os.ErrDeadlineExceeded
	}
	return len(p), nil
}

// TestCutShortWritesKeepOrder: what an inline write could not write goes
// out first, before the frames put meanwhile, write after write.
func TestCutShortWritesKeepOrder(t *testing.T) {
	w := &trickleWriter{}
	o := NewOutbox(w, DefaultMaxFrame, 1<<20)
	ref := uint64(0)
	put := func(mode Mode) {
		ref++
		if err := o.Put(&Frame{Type: TypeResponse, Ref: ref, Body: bytes.Repeat([]byte{byte(ref)}, 300)}, mode, 0); err != nil {
			t.Error(err)
		}
	}
	w.put = func() { put(Data); put(Data) } // frames added while a write goes on
	for i := 0; i < 50; i++ {
		o.lastWrite.Store(0) // idle: the next urgent frame is written inline
		put(Urgent)
		for {
			if wrote, err := o.Flush(); err != nil {
				t.Fatal(err)
			} else if !wrote {
				break
			}
		}
	}
	r := NewReader(bytes.NewReader(w.buf.Bytes()), DefaultMaxFrame)
	for want := uint64(1); want <= ref; want++ {
		var f Frame
		if err := r.Next(&f); err != nil || f.Ref != want || len(f.Body) != 300 || f.Body[299] != byte(want) {
			t.Fatalf("frame %d: got ref %d, %d bytes, %v", want, f.Ref, len(f.Body), err)
		}
	}
}

// gateWriter holds each Write until gate is closed, and records the bytes
// in the order the writes end.
type gateWriter struct {
	gate    chan struct{}
	entered chan struct{}
	mu      sync.Mutex
	buf     bytes.Buffer
}

func (w *gateWriter) Write(p []byte) (int, error) {
	select {
	case w.entered <- struct{}{}:
	default:
	}
	<-w.gate
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	return len(p), nil
}

// TestCloseWaitsForInlineWrite: a producer writing inline when the write
// loop closes the outbox finishes first, so that the last write (what
// Close returns) follows it. Else a response put just before a
// connection closes can reach the peer after the close, or not at all.
func TestCloseWaitsForInlineWrite(t *testing.T) {
	w := &gateWriter{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	o := NewOutbox(w, DefaultMaxFrame, 1<<20)
	go o.Put(&Frame{Type: TypeResponse, Ref: 1, Body: []byte("answer")}, Urgent, 0)
	<-w.entered // the producer is in its inline write
	o.Put(&Frame{Type: TypeClose, Tag: "bye"}, Control, 0)
	rest := make(chan []byte)
	go func() { rest <- o.Close() }()
	select {
	case <-rest:
		t.Fatal("Close returned while a producer was still writing")
	case <-time.After(50 * time.Millisecond):
	}
	close(w.gate)
	last := <-rest
	w.mu.Lock()
	all := append(bytes.Clone(w.buf.Bytes()), last...)
	w.mu.Unlock()
	r := NewReader(bytes.NewReader(all), DefaultMaxFrame)
	for _, want := range []Type{TypeResponse, TypeClose} {
		var f Frame
		if err := r.Next(&f); err != nil || f.Type != want {
			t.Fatalf("want %s next, got %s (%v)", want, f.Type, err)
		}
	}
}

// TestFlushBatchWhileClosing: a batch that ends while Close waits for an
// inline write leaves what is buffered to the write loop's last write;
// it must not write it itself, nor close the room channel that Close
// closed already (that panicked). Found in review; the sleeps only order
// the goroutines.
func TestFlushBatchWhileClosing(t *testing.T) {
	w := &gateWriter{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	o := NewOutbox(w, DefaultMaxFrame, 1<<20)
	var b Batch
	go o.Put(&Frame{Type: TypeResponse, Ref: 1}, Urgent, 0) // written inline
	<-w.entered
	o.Put(&Frame{Type: TypeResponse, Ref: 2, Batch: &b}, Urgent, 0)
	o.mu.Lock()
	o.waiters++ // a producer waiting for room, which Close wakes but which has not run yet
	o.mu.Unlock()
	rest := make(chan []byte)
	go func() { rest <- o.Close() }()
	for waiting := false; !waiting; {
		time.Sleep(time.Millisecond)
		o.mu.Lock()
		waiting = o.written != nil
		o.mu.Unlock()
	}
	o.mu.Lock()
	close(w.gate)                    // the inline write ends and waits for o.mu
	time.Sleep(2 * time.Millisecond) // so the connection counts as idle for the batch
	flushed := make(chan any)
	go func() {
		defer func() { flushed <- recover() }()
		b.Flush()
	}()
	time.Sleep(time.Millisecond)
	o.mu.Unlock()
	if p := <-flushed; p != nil {
		t.Fatalf("Batch.Flush while the outbox closed: %v", p)
	}
	last := <-rest
	w.mu.Lock()
	all := append(bytes.Clone(w.buf.Bytes()), last...)
	w.mu.Unlock()
	r := NewReader(bytes.NewReader(all), DefaultMaxFrame)
	for want := uint64(1); want <= 2; want++ {
		var f Frame
		if err := r.Next(&f); err != nil || f.Ref != want {
			t.Fatalf("frame %d: got %+v, %v", want, f, err)
		}
	}
}

// TestTrimGivesBackBurstBuffers checks that a quiet outbox lets go of
// the buffers a burst grew, and keeps working after.
func TestTrimGivesBackBurstBuffers(t *testing.T) {
	w := &countingWriter{}
	o := NewOutbox(w, DefaultMaxFrame, 1<<20)
	body := bytes.Repeat([]byte{'x'}, 1000)
	for range 2 { // two bursts, so that both buffers are grown
		for i := range 200 {
			if err := o.Put(&Frame{Type: TypeMessage, Ref: uint64(i), Body: body}, Data, 0); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := o.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	o.mu.Lock()
	held := cap(o.buf) + cap(o.spare)
	o.mu.Unlock()
	if held < 100<<10 {
		t.Fatalf("after the bursts the outbox holds %d bytes of buffers; the test wants them grown", held)
	}
	o.Trim()
	o.mu.Lock()
	held = cap(o.buf) + cap(o.spare)
	o.mu.Unlock()
	if held > 2*quietBuf {
		t.Errorf("after Trim the outbox holds %d bytes of buffers, want at most %d", held, 2*quietBuf)
	}
	before := w.count()
	if err := o.Put(&Frame{Type: TypeMessage, Ref: 1, Body: body}, Data, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Flush(); err != nil {
		t.Fatal(err)
	}
	if w.count() <= before {
		t.Error("nothing written after Trim")
	}
}

// fragileWriter is a countingWriter that a timed-out write would break.
type fragileWriter struct{ countingWriter }

func (*fragileWriter) FragileWrites() bool { return true }

// TestOutboxFragileNeverInline: on a FragileWriter (a WebSocket) a
// producer never writes inline: the write loop does, without a short
// deadline that would break the stream.
func TestOutboxFragileNeverInline(t *testing.T) {
	w := &fragileWriter{}
	o := NewOutbox(w, DefaultMaxFrame, 1<<20)
	if err := o.Put(&Frame{Type: TypeResponse, Ref: 1}, Urgent, 0); err != nil {
		t.Fatal(err)
	}
	if w.count() != 0 {
		t.Fatalf("an urgent frame on a fragile writer made %d writes inline", w.count())
	}
	select {
	case <-o.Ready():
	default:
		t.Fatal("the write loop was not kicked")
	}
	if _, err := o.Flush(); err != nil || w.count() != 1 {
		t.Fatalf("flush: %v, %d writes", err, w.count())
	}
}
