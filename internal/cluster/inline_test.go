package cluster

import (
	"bytes"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier/wire"
)

// writers counts a link's writes by the goroutine that made them: the
// link's write loop or a producer writing inline.
type writers struct{ loop, inline atomic.Int64 }

func (w *writers) hook() {
	buf := make([]byte, 8<<10)
	n := runtime.Stack(buf, false)
	if bytes.Contains(buf[:n], []byte("(*link).writeLoop")) {
		w.loop.Add(1)
	} else {
		w.inline.Add(1)
	}
}

// linkedPair starts two fabrics, with the cluster secret (TLS links) or
// without (plain TCP on loopback), with link heartbeats rare enough that
// none is written while a test counts writes.
func linkedPair(t *testing.T, secret bool) (*Fabric, *Fabric, *recorder) {
	mod := func(c *Config) {
		c.LinkHeartbeat = time.Hour
		if !secret {
			c.Secret = nil
		}
	}
	a, _ := startFabric(t, "a", nil, mod)
	b, rb := startFabric(t, "b", []string{a.Advertise()}, mod)
	waitFor(t, 20*time.Second, "a and b up", func() bool { return allUp(a, "a", "b") && allUp(b, "a", "b") })
	return a, b, rb
}

// sendCounting sends n frames of type typ from a to b one at a time,
// each once the one before was received, and counts who wrote them.
func sendCounting(t *testing.T, a *Fabric, rb *recorder, typ wire.Type, n int) *writers {
	t.Helper()
	w := &writers{}
	hook := w.hook
	testHookWrite.Store(&hook)
	defer testHookWrite.Store(nil)
	base := rb.count("a")
	for i := range n {
		fr := &wire.Frame{Type: typ, Name: "h\x00c1", Ref: uint64(i + 1), Body: []byte("ping")}
		if err := a.Send("b", fr); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		waitFor(t, 10*time.Second, "b received the frame", func() bool { return rb.count("a") == base+i+1 })
	}
	return w
}

// TestRequestsWrittenInline: on an idle plain link, the producer of a
// forwarded request or of a response writes it itself, without waking
// the link's write loop; publications are left to the write loop.
func TestRequestsWrittenInline(t *testing.T) {
	a, _, rb := linkedPair(t, false)
	const n = 20
	for _, typ := range []wire.Type{wire.TypeRReq, wire.TypeResponse} {
		w := sendCounting(t, a, rb, typ, n)
		// A frame finding the link written less than 50 µs before
		// batches instead: one sent after the one before was received
		// almost never does.
		if w.inline.Load() == 0 {
			t.Errorf("%s: none of %d written inline (%d by the write loop)", typ, n, w.loop.Load())
		}
	}
	w := sendCounting(t, a, rb, wire.TypeRPub, n)
	if w.inline.Load() != 0 {
		t.Errorf("RPUB: %d of %d written inline, want every one by the write loop", w.inline.Load(), n)
	}
}

// TestTLSLinkNeverWritesInline: a timed-out write breaks a TLS link
// for good, so on one even requests are left to the write loop, whose
// writes have the slow-consumer timeout.
func TestTLSLinkNeverWritesInline(t *testing.T) {
	a, _, rb := linkedPair(t, true)
	const n = 10
	w := sendCounting(t, a, rb, wire.TypeRReq, n)
	if w.inline.Load() != 0 || w.loop.Load() < n {
		t.Errorf("TLS link: %d written inline, %d by the write loop; want 0 and at least %d", w.inline.Load(), w.loop.Load(), n)
	}
}

// sizes is a writer that records the size of each write.
type sizes struct {
	mu sync.Mutex
	n  []int
}

func (s *sizes) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.n = append(s.n, len(p))
	s.mu.Unlock()
	return len(p), nil
}

func (s *sizes) writes() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.n...)
}

// relay is a LinkHandler that puts every frame into one outbox, as the
// broker puts a forwarded request into its handler's connection.
type relay struct {
	*recorder
	out *wire.Outbox
	n   atomic.Int64
}

func (r *relay) FromPeer(node string, fr *wire.Frame) {
	r.out.Offer(fr, wire.Urgent)
	fr.Release()
	r.n.Add(1)
}

// TestLinkReadBatches: requests read from a link in one read go to the
// connection they are for in one write once the read is worked through,
// not one write for the first and the rest left to a write loop.
func TestLinkReadBatches(t *testing.T) {
	a, b, rb := linkedPair(t, false)
	w := &sizes{}
	rl := &relay{recorder: rb, out: wire.NewOutbox(w, wire.DefaultMaxFrame, 1<<20)}
	b.SetHandler(rl)

	hold := make(chan struct{})
	held := make(chan *link, 1)
	hook := func(l *link) {
		if l.f != b || l.kind != KindLinkData {
			return
		}
		select {
		case held <- l:
		default:
		}
		<-hold
	}
	testHookRead.Store(&hook)
	released := false
	defer func() {
		testHookRead.Store(nil)
		if !released {
			close(hold)
		}
	}()
	// b's data link reader takes this frame, then stops at the hook.
	if err := a.Send("b", &wire.Frame{Type: wire.TypePublish, Name: "first"}); err != nil {
		t.Fatal(err)
	}
	var l *link
	select {
	case l = <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("b's data link reader did not reach the hook")
	}
	waitFor(t, 10*time.Second, "the first frame handed over", func() bool { return rl.n.Load() == 1 })
	before := len(w.writes())
	const n = 10
	var want int
	for i := range n {
		fr := &wire.Frame{Type: wire.TypeRReq, Name: "h\x00c1", Ref: uint64(i + 1), Body: []byte("ping")}
		enc, err := wire.AppendFrame(nil, fr, wire.DefaultMaxFrame)
		if err != nil {
			t.Fatal(err)
		}
		want += len(enc)
		if err := a.Send("b", fr); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	waitFor(t, 10*time.Second, "the requests wait in b's socket", func() bool { return wire.Unread(l.conn) >= want })
	testHookRead.Store(nil)
	close(hold)
	released = true
	waitFor(t, 10*time.Second, "b handed every request over", func() bool { return rl.n.Load() == n+1 })
	// The batch is flushed before the reader waits for more: poll for
	// the write (no write loop runs: what is left to one stays pending).
	for deadline := time.Now().Add(10 * time.Second); len(w.writes()) == before && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if got := w.writes()[before:]; len(got) != 1 || got[0] != want {
		t.Errorf("%d requests read at once were written as %v bytes (%d left for a write loop), want one write of %d",
			n, got, rl.out.Pending(), want)
	}
}
