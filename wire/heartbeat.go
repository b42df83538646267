package wire

import (
	"sync"
	"sync/atomic"
	"time"
)

// Heartbeat watches one connection apart from its write loop, which a
// peer that does not read may hold in a write: it ends a connection that
// stayed silent for its timeout, and sends a PING once nothing was
// written for an interval. Client and server run the same one. Its
// callbacks run on a timer's goroutine, one at a time; they must not
// block.
type Heartbeat struct {
	// Out is the connection's outbox: PINGs go there, and its last write
	// tells whether the connection was idle.
	Out *Outbox
	// Interval returns the heartbeat interval in force; zero means none
	// yet (the handshake is not over): no check, no PING.
	Interval func() time.Duration
	// Timeout returns the silence after which the connection is dead,
	// for an interval.
	Timeout func(interval time.Duration) time.Duration
	// Heard reports whether the peer counts as heard from since the last
	// call: a frame arrived, or the connection is busy on its behalf.
	Heard func() bool
	// Silent ends the connection; it is called once, with the timeout.
	Silent func(timeout time.Duration)
	// Done is closed when the connection ends.
	Done <-chan struct{}

	t     atomic.Pointer[time.Timer]
	first time.Duration
	mu    sync.Mutex // guards the fields below, and serialises checks
	// lastSeen is the first check that found the peer heard from (or
	// the start, or the last Kick): up to one check interval after the
	// frame that made it heard.
	lastSeen time.Time
	started  time.Time
	nonce    uint64
}

// minCheck is the shortest time between two checks, whatever interval
// a peer agreed to: a zero or tiny one must not make a busy loop.
const minCheck = 5 * time.Millisecond

// Start starts watching, with first as the interval until Interval gives
// one; stop ends it.
func (h *Heartbeat) Start(first time.Duration) (stop func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.first = max(first, 2*minCheck)
	h.started = time.Now()
	h.lastSeen = h.started
	t := time.AfterFunc(time.Hour, h.check)
	h.t.Store(t) // before it can fire: check reads it
	// An interval agreed already (a Kick that came first) applies.
	t.Reset(h.every(h.Interval(), h.started))
	return func() { t.Stop() }
}

// Kick restarts the watch from now, with the interval Interval gives:
// the end of a handshake calls it, so that a shorter interval agreed
// there applies at once, counted from the handshake.
func (h *Heartbeat) Kick() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastSeen = time.Now()
	if t := h.t.Load(); t != nil {
		t.Reset(h.every(h.Interval(), h.lastSeen))
	}
}

func (h *Heartbeat) check() {
	select {
	case <-h.Done:
		return
	default:
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	hb := h.Interval()
	if h.Heard() || hb == 0 {
		h.lastSeen = now
	} else if timeout := h.Timeout(hb); now.Sub(h.lastSeen) >= timeout-hb/2 {
		// lastSeen is the first check after the last frame, up to half
		// an interval late: the real silence is now within the timeout
		// less half an interval and the timeout, never more.
		h.Silent(timeout)
		return
	}
	if hb > 0 && now.Sub(h.lastWrite()) >= hb {
		h.Out.Trim() // quiet for an interval: let a burst's buffers go
		h.nonce++
		h.Out.Put(&Frame{Type: TypePing, Ref: h.nonce}, Control, 0)
	}
	h.t.Load().Reset(h.every(hb, now))
}

// lastWrite is when the outbox last wrote, or the start.
func (h *Heartbeat) lastWrite() time.Time {
	if ns := h.Out.lastWrite.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return h.started
}

// every returns when to check next, after now: every half interval,
// and sooner when a PING falls due before, so that it goes out one
// interval after the last write.
func (h *Heartbeat) every(hb time.Duration, now time.Time) time.Duration {
	if hb == 0 {
		return h.first / 2
	}
	d := max(hb/2, minCheck)
	if due := h.lastWrite().Add(hb).Sub(now); due > 0 && due < d {
		d = max(due, minCheck)
	}
	return d
}
