package wire

import (
	"sync/atomic"
	"time"
)

// Heartbeat watches one connection apart from its write loop, which a
// peer that does not read may hold in a write: every half interval it
// ends a connection that stayed silent for its timeout, and sends a PING
// when nothing was written for an interval. Client and server run the
// same one. Its callbacks run on a timer's goroutine, one at a time;
// they must not block.
type Heartbeat struct {
	// Out is the connection's outbox: PINGs go there, and its writes
	// tell whether the connection was idle.
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

	t                   atomic.Pointer[time.Timer]
	lastSeen, lastWrite time.Time
	writes, nonce       uint64
}

// Start starts watching, with first as the interval until Interval gives
// one; stop ends it.
func (h *Heartbeat) Start(first time.Duration) (stop func()) {
	if first < 10*time.Millisecond {
		first = 10 * time.Millisecond // a peer's zero must not make a busy loop
	}
	now := time.Now()
	h.lastSeen, h.lastWrite, h.writes = now, now, h.Out.Writes()
	t := time.AfterFunc(time.Hour, func() { h.check(first) })
	h.t.Store(t) // before it can fire: check reads it
	t.Reset(first / 2)
	return func() { t.Stop() }
}

func (h *Heartbeat) check(first time.Duration) {
	select {
	case <-h.Done:
		return
	default:
	}
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
	if n := h.Out.Writes(); n != h.writes {
		h.writes, h.lastWrite = n, now
	}
	if hb > 0 && now.Sub(h.lastWrite) >= hb {
		h.nonce++
		h.Out.Put(&Frame{Type: TypePing, Ref: h.nonce}, Control, 0)
	}
	if hb == 0 {
		hb = first
	}
	// Never more often than every 5 ms, whatever a peer agreed to.
	h.t.Load().Reset(max(hb, 10*time.Millisecond) / 2)
}
