package server

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/wire"
)

// FrameSlack is how much larger than the negotiated maximum a frame from
// the server may be: the broker adds routing fields (member ids) to frames
// it forwards.
const FrameSlack = 64 << 10

// conn is one client connection: a read loop (serve) that hands frames to
// the broker session, and a write loop that batches what the broker sends.
type conn struct {
	s    *Server
	nc   net.Conn
	peer string
	out  *wire.Outbox
	r    *wire.Reader
	sess *broker.Session
	// opened is when the connection was accepted (see [Describe]).
	opened time.Time
	// proto is the transport: [ProtoTCP] or [ProtoWebSocket].
	proto string

	heartbeat atomic.Int64 // agreed interval in ns, set by the handshake
	seen      atomic.Bool  // a frame arrived since the last heartbeat tick
	// handling is set while the read loop is in the broker: a loop held
	// there by backpressure is not a silent client.
	handling atomic.Bool

	// user is counted against Config.MaxConnsPerUser: the authenticated
	// user, or on a server without users the name the HELLO gave; "" for
	// none.
	user string
	// wentAway is set once the client was sent CLOSE by [conn.goAway].
	wentAway atomic.Bool
	// abrupt is set by [conn.cut]: the read loop is not given time to
	// see the peer close its end.
	abrupt atomic.Bool
	// ended is set once the connection's end was counted in one of the
	// server's ConnEnds.
	ended atomic.Bool

	closeOnce sync.Once
	closing   chan struct{} // closed when the connection is to end
	wdone     chan struct{} // closed when the write loop ended for good

	// The write loop runs only while there is something to write (or
	// the connection is closing): an idle connection holds one
	// goroutine, its read loop. writing is set while a write loop runs
	// (and for good once it ended the connection's writes); woken is
	// set by every wake, so that a loop about to stop sees what came
	// meanwhile.
	writing atomic.Bool
	woken   atomic.Bool

	// watch runs the heartbeat apart from the write loop, which a peer
	// that does not read may hold in a write; stopWatch stops it.
	watch     wire.Heartbeat
	stopWatch func()

	// sock is the socket an idle connection's read loop waits on
	// (park.go), nil when it waits in its read; ready and peeked are the
	// waiter's, wakes and wakesSince the read loop's count of its
	// pauses (busyWakes).
	sock       syscall.RawConn
	ready      func(fd uintptr) bool
	peeked     bool
	wakes      int
	wakesSince time.Time

	// used is owned by the read loop; granted grows there and, for a
	// connection held by flow control, in a timer's goroutine.
	used         uint64
	granted      atomic.Uint64
	grantPending atomic.Bool // a grant is held back by flow control

	// lane runs DECLAREs and DELETEs off the read loop in a cluster
	// (catalog.go); nil on a single node, where they take microseconds.
	lane *catalogLane
}

func newConn(s *Server, nc net.Conn) *conn {
	noDelay(nc)
	c := &conn{
		s: s, nc: nc, peer: nc.RemoteAddr().String(), opened: time.Now(), proto: ProtoTCP,
		out:     wire.NewOutbox(nc, wire.HandshakeMaxFrame, s.cfg.OutboxLimit),
		r:       wire.NewReader(nc, wire.HandshakeMaxFrame),
		closing: make(chan struct{}),
		wdone:   make(chan struct{}),
	}
	// Every write has a deadline: a peer that takes nothing for the
	// slow-consumer timeout is cut, however the write loop got there.
	c.out.SetWriteTimeout(s.cfg.SlowTimeout)
	c.out.SetWake(c.wake)
	c.watch = wire.Heartbeat{
		Out:      c.out,
		Interval: func() time.Duration { return time.Duration(c.heartbeat.Load()) },
		Timeout:  func(hb time.Duration) time.Duration { return 3 * hb },
		// A read loop held in the broker by backpressure is not silence,
		// and neither are bytes the client sent that wait in the socket
		// for a read loop that is behind (see wire.Unread).
		Heard: func() bool { return c.seen.Swap(false) || c.handling.Load() || wire.Unread(c.nc) > 0 },
		Silent: func(timeout time.Duration) {
			c.countEnd(&c.s.ends.heartbeat)
			c.s.log.Warn("silent client disconnected: nothing received for the heartbeat timeout", "peer", c.peer, "timeout", timeout)
			c.cut(wire.Errorf(wire.CodeHeartbeat, "nothing received for %s", timeout))
		},
		Done: c.closing,
	}
	return c
}

// noDelay turns off Nagle's algorithm on a TCP connection, or on the
// one under a TLS connection.
func noDelay(nc net.Conn) {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
}

// clientTypes are the frame types a client may send after the handshake.
var clientTypes = func() (t [256]bool) {
	for _, ty := range []wire.Type{
		wire.TypePing, wire.TypePong, wire.TypeClose,
		wire.TypeDeclare, wire.TypeDelete, wire.TypeList, wire.TypeAttach, wire.TypeDetach,
		wire.TypeSubscribe, wire.TypeUnsubscribe, wire.TypeDecision,
		wire.TypeRequest, wire.TypeResponse, wire.TypeCancel, wire.TypeAsk, wire.TypeAnswer,
		wire.TypePublish,
		wire.TypeSubmit, wire.TypeAck, wire.TypeNack, wire.TypeProgress, wire.TypeWatch,
	} {
		t[ty] = true
	}
	return t
}()

// testHookRead, when set, runs before each frame a read loop reads after
// the handshake: tests hold the loop there, as a starved one would be.
var testHookRead atomic.Pointer[func()]

// serve runs the connection: its handshake, then its read loop, which
// hands the waiting for input to a waiter goroutine while the
// connection is idle (park.go); whichever goroutine sees the end ends
// the connection.
func (c *conn) serve() {
	// The heartbeat runs on a timer, apart from the write loop, which a
	// peer that does not read may hold in a write. (Before the
	// handshake ends, HandshakeTimeout applies.)
	c.stopWatch = c.watch.Start(c.s.cfg.Heartbeat)
	c.read(true, true)
}

// read runs the read loop (after the handshake, when first) until the
// connection ends, which it then ends, or idles, when it starts a
// waiter ([conn.await]) and returns. Unless mayIdle, the loop reads at
// least once before it may idle.
func (c *conn) read(first, mayIdle bool) {
	var ended error // why the read loop ended
	parked := false
	defer func() {
		// A bug met while serving this connection ends it alone; the
		// client learns no more than that.
		if p := recover(); p != nil {
			c.s.log.Error("connection panicked: a bug in the server", "peer", c.peer, "panic", p, "stack", string(debug.Stack()))
			c.fail(wire.Errorf(wire.CodeInternal, "internal error; the server's log has the details"), false)
			ended, parked = nil, false
		}
		if !parked {
			c.finish(ended)
		}
	}()
	if first {
		if err := c.handshake(); err != nil {
			c.s.logHandshakeFailed(c.peer, err)
			return
		}
		c.s.log.Info("connection open", "peer", c.peer, "conn", c.sess.ID(), "name", c.sess.Name(), "user", c.sess.User())
		if c.s.b.Clustered() {
			c.lane = newCatalogLane()
		}
		if c.sock = waitSocket(c.nc); c.sock != nil {
			c.ready = c.readyFunc()
		}
	}
	ended = c.readLoop(mayIdle)
	if ended == errIdle {
		parked = true
		go c.await()
	}
}

// finish ends the connection once its read loop ended with ended (nil
// when it never ran or panicked), and takes it off the server's books.
func (c *conn) finish(ended error) {
	defer c.s.wg.Done()
	c.fail(nil, false)
	<-c.wdone
	c.stopWatch()
	c.nc.Close()
	if c.user != "" {
		c.s.dropUser(c.user)
	}
	if c.lane != nil {
		// The declares in flight end within the catalog's timeout;
		// their answers go nowhere now.
		c.lane.wait()
	}
	if c.sess != nil {
		c.sess.Close()
		if vanished(ended, c.wentAway.Load(), c.abrupt.Load()) {
			c.countEnd(&c.s.ends.vanished)
		}
		logClosed(c.s.log.With("peer", c.peer), c.sess.ID(), ended, c.wentAway.Load())
	}
	c.s.forget(c)
}

// countEnd counts the connection's end in n, unless it was counted.
func (c *conn) countEnd(n *atomic.Uint64) {
	if c.ended.CompareAndSwap(false, true) {
		n.Add(1)
	}
}

// vanished reports whether a connection whose read loop ended with
// ended was closed or reset by its client without CLOSE, rather than
// cut by the server (abrupt) or ended by its going away.
func vanished(ended error, wentAway, abrupt bool) bool {
	if ended == nil || wentAway || abrupt {
		return false
	}
	return errors.Is(ended, io.EOF) || errors.Is(ended, syscall.ECONNRESET)
}

// logClosed logs a connection's end in one line: a normal close (the
// client's CLOSE, the client closing the socket, or after the server told
// it to go away) with its reason, any other end with err.
func logClosed(log *slog.Logger, id string, ended error, wentAway bool) {
	switch {
	case ended == nil:
		log.Info("connection closed", "conn", id)
	case wentAway:
		log.Info("connection closed", "conn", id, "reason", "the server is shutting down")
	case errors.Is(ended, errClientClosed):
		log.Info("connection closed", "conn", id, "reason", ended.Error())
	case errors.Is(ended, io.EOF):
		log.Info("connection closed", "conn", id, "reason", "the client closed the socket without CLOSE")
	default:
		log.Info("connection closed", "conn", id, "err", ended)
	}
}

func (c *conn) handshake() error {
	defer c.s.endHandshake(c)
	deadline := time.Now().Add(c.s.cfg.HandshakeTimeout)
	c.nc.SetReadDeadline(deadline)
	f := wire.NewFrame(0)
	defer f.Release()
	if err := c.r.Next(f); err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			c.fail(wire.Errorf(wire.CodeProtocol, "no HELLO within %s", c.s.cfg.HandshakeTimeout), false)
			return err
		}
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) && rh.Conn != nil && looksHTTP(rh.RecordHeader[:]) {
			answerHTTP(rh.Conn, c.s.wrongPortReason())
			return fmt.Errorf("an HTTP client on the client port: %w", err)
		}
		if errors.As(err, &rh) && rh.Conn != nil {
			// A plain client on the TLS port: tell it in its own terms.
			refuse(rh.Conn, wire.Errorf(wire.CodeProtocol, "this port speaks TLS: connect with a courier+tls:// URL"))
			return fmt.Errorf("plain-text client on the TLS port: %w", err)
		}
		if errors.Is(err, wire.ErrFrameTooLarge) && c.proto == ProtoTCP && looksHTTP(c.r.Head()) {
			answerHTTP(c.nc, c.s.wrongPortReason())
			return fmt.Errorf("an HTTP client on the client port: %w", err)
		}
		c.badInput(err)
		return err
	}
	c.nc.SetReadDeadline(time.Time{})
	if f.Type != wire.TypeHello {
		err := wire.Errorf(wire.CodeProtocol, "expected HELLO as the first frame, got %s", f.Type)
		c.fail(err, false)
		return err
	}
	var h wire.Hello
	if err := json.Unmarshal(f.Body, &h); err != nil {
		e := wire.Errorf(wire.CodeProtocol, "bad HELLO body: %v", err)
		c.fail(e, false)
		return e
	}
	if !slices.Contains(h.Versions, wire.Version) {
		e := wire.Errorf(wire.CodeVersion, "client speaks versions %v, server speaks %d", h.Versions, wire.Version)
		c.fail(e, false)
		return e
	}
	if err := h.Check(); err != nil {
		e := wire.Errorf(wire.CodeBadOptions, "HELLO: %v", err)
		c.fail(e, false)
		return e
	}
	heartbeat := c.s.cfg.Heartbeat
	if hb := time.Duration(h.HeartbeatMS) * time.Millisecond; hb > 0 && hb < heartbeat {
		heartbeat = max(hb, 10*time.Millisecond)
	}
	maxFrame := c.s.cfg.MaxFrame
	name := h.Name
	if name == "" {
		name = c.peer
	}
	// user counts against the limit per user: the authenticated user, or
	// without users the name the client gave.
	user := h.User
	if c.s.full() {
		// Refused before it costs a password check.
		e := tooManyConns(c.s.cfg.MaxConns)
		c.s.logRefused(c.nc, e)
		c.fail(e, false)
		return e
	}
	var policy auth.Policy
	var authed string // the session's user: "" while there are no users
	if st := c.s.cfg.Users; st != nil {
		var err error
		if authed, err = c.login(st, h, deadline); err != nil {
			return err
		}
		if authed != "" {
			user = authed
		}
		policy = st
	}
	if e := c.s.establish(c, user); e != nil {
		c.s.logRefused(c.nc, e)
		c.fail(e, false)
		return e
	}
	c.user = user
	if policy != nil {
		c.sess = c.s.b.OpenAs(c, name, authed, policy)
	} else {
		c.sess = c.s.b.Open(c, name)
	}
	c.granted.Store(c.s.cfg.Credit)
	w := wire.Welcome{
		Version: wire.Version, Server: c.s.cfg.Version, Node: c.s.b.Node(), Conn: c.sess.ID(),
		HeartbeatMS: int(heartbeat / time.Millisecond), TimeoutMS: int(3 * heartbeat / time.Millisecond),
		MaxFrame: maxFrame, Credit: c.granted.Load(), ConnectURLs: c.s.cfg.connectURLs(),
		Dedup: true,
	}
	body, _ := json.Marshal(w)
	c.out.Put(&wire.Frame{Type: wire.TypeWelcome, Body: body}, wire.Control, 0)
	c.out.SetMax(maxFrame + FrameSlack)
	c.r.SetMax(maxFrame)
	c.heartbeat.Store(int64(heartbeat))
	c.watch.Kick() // the agreed interval applies from now
	return nil
}

// readLoop hands frames to the broker until the connection ends, or
// until it is idle (errIdle: nothing buffered to read, see park.go; not
// before its first read unless mayIdle). Frames routed while more input
// is buffered are written once the buffer is worked through, one write
// per destination connection.
func (c *conn) readLoop(mayIdle bool) error {
	half := c.s.cfg.Credit / 2
	var batch wire.Batch
	defer batch.Flush()
	for {
		if !c.r.Buffered() {
			batch.Flush()
			if mayIdle && c.idle() {
				return errIdle
			}
		}
		mayIdle = true
		if h := testHookRead.Load(); h != nil {
			(*h)()
		}
		f := wire.NewFrame(0)
		if err := c.r.Next(f); err != nil {
			f.Release()
			c.badInput(err)
			return err
		}
		c.seen.Store(true)
		f.Batch = &batch
		if !clientTypes[f.Type] {
			err := wire.Errorf(wire.CodeProtocol, "a client may not send %s", f.Type)
			f.Release()
			c.fail(err, false)
			return err
		}
		if c.lane != nil {
			if done, err := c.catalogFrame(f); done {
				if err != nil {
					return err
				}
				continue
			}
		}
		switch f.Type {
		case wire.TypePing:
			f.Type = wire.TypePong
			c.Deliver(f)
		case wire.TypePong:
			f.Release()
		case wire.TypeClose:
			reason := f.Tag
			f.Release()
			c.fail(nil, false)
			return fmt.Errorf("%w: %s", errClientClosed, reason)
		case wire.TypePublish, wire.TypeRequest, wire.TypeSubmit:
			c.used++
			if c.used > c.granted.Load() {
				err := wire.Errorf(wire.CodeLimit, "%s sent without credit (window %d)", f.Type, c.s.cfg.Credit)
				f.Release()
				c.fail(err, false)
				return err
			}
			c.handling.Store(true)
			c.sess.Handle(f)
			c.handling.Store(false)
			if c.granted.Load()-c.used <= half && !c.grantPending.Load() {
				c.grant(half)
			}
		default:
			c.handling.Store(true)
			c.sess.Handle(f)
			c.handling.Store(false)
		}
	}
}

// catalogFrame runs a DECLARE or DELETE off the read loop, and holds a
// frame that names an exchange being declared or deleted (or a LIST)
// until that is answered (catalog.go). done is set when f was taken;
// err when the connection is closing.
func (c *conn) catalogFrame(f *wire.Frame) (done bool, err error) {
	c.handling.Store(true)
	defer c.handling.Store(false)
	ok := true
	switch {
	case f.Type == wire.TypeDeclare || f.Type == wire.TypeDelete:
		if !c.lane.start(f, c.sess.Handle, c.closing) {
			return true, errClosing
		}
		return true, nil
	case f.Type == wire.TypeList:
		ok = c.lane.waitAll(c.closing)
	case ordered(f.Type):
		ok = c.lane.waitFor(f.Name, c.closing)
	}
	if !ok {
		f.Release()
		return true, errClosing
	}
	return false, nil
}

// maxCreditDelay is how long a grant of credit is held back at most while
// the session's queues are under pressure; at full pressure it is held
// until the pressure falls, looked at this often.
const maxCreditDelay = 50 * time.Millisecond

// grant gives the client n more credits, at once unless the queues it
// submits to are under memory or disk pressure (broker.Session.Pressure):
// then fewer, later, and none while the pressure is full. Publishers are
// slowed by credit, never dropped, and the read loop goes on reading, so
// the connection's acks keep flowing.
func (c *conn) grant(n uint64) {
	p := c.sess.Pressure()
	if p <= 0 {
		c.credit(n)
		return
	}
	c.grantPending.Store(true)
	var later func()
	later = func() {
		select {
		case <-c.closing:
			return
		default:
		}
		p := c.sess.Pressure()
		if p >= 1 {
			time.AfterFunc(maxCreditDelay, later)
			return
		}
		c.grantPending.Store(false)
		c.credit(max(uint64(float64(n)*(1-p)), 1))
	}
	time.AfterFunc(time.Duration(min(p, 1)*float64(maxCreditDelay)), later)
}

// credit sends a CREDIT frame of n.
func (c *conn) credit(n uint64) {
	c.granted.Add(n)
	cr := wire.NewFrame(wire.TypeCredit)
	cr.Aux = n
	c.Deliver(cr)
}

// badInput ends the connection after a read error, telling the client
// why when the error is its fault.
func (c *conn) badInput(err error) {
	switch {
	case errors.Is(err, wire.ErrFrameTooLarge):
		c.fail(wire.Errorf(wire.CodeFrameTooLarge, "%v", err), false)
	case errors.Is(err, wire.ErrMalformed):
		c.fail(wire.Errorf(wire.CodeProtocol, "%v", err), false)
	default:
		c.fail(nil, false)
	}
}

// modeOf tells how a frame to the client is written: requests and
// responses go out at once when the connection is idle, messages are
// batched, and control frames never wait for a slow reader.
func modeOf(t wire.Type) wire.Mode {
	switch t {
	case wire.TypeRequest, wire.TypeResponse, wire.TypeAsk, wire.TypeAnswer:
		return wire.Urgent
	case wire.TypeMessage, wire.TypeTask:
		return wire.Data
	}
	return wire.Control
}

// Deliver sends a frame from the broker to the client (broker.Sink).
//
// A REQUEST for a handler never waits for room: its requester's other
// traffic must not wait for a handler that does not read. Past the
// outbox's offer limit (eight times its limit and two of the largest
// frames) the request fails at once with code 19, and the handler, if
// it reads nothing, is cut by the write timeout.
func (c *conn) Deliver(f *wire.Frame) {
	var err error
	if f.Type == wire.TypeRequest {
		if err = c.out.Offer(f, wire.Urgent); errors.Is(err, wire.ErrOutboxFull) {
			c.sess.Refuse(f, wire.Errorf(wire.CodeSlowConsumer, "the handler's connection is not reading: more than %d bytes wait for it", c.out.OfferLimit()))
			return
		}
	} else {
		err = c.out.Put(f, modeOf(f.Type), c.s.cfg.SlowTimeout)
	}
	t := f.Type
	f.Release()
	switch {
	case err == nil, errors.Is(err, wire.ErrOutboxClosed):
	case errors.Is(err, wire.ErrOutboxFull):
		c.countEnd(&c.s.ends.slow)
		c.s.log.Warn("slow consumer disconnected", "peer", c.peer, "waited", c.s.cfg.SlowTimeout)
		c.cut(wire.Errorf(wire.CodeSlowConsumer, "not reading for %s", c.s.cfg.SlowTimeout))
	default:
		c.s.log.Warn("frame dropped", "peer", c.peer, "type", t, "err", err)
	}
}

// goAway tells the client the server is going (a CLOSE with e and the
// drain time in ms) and leaves the connection open.
func (c *conn) goAway(e *wire.Error, drainMS uint64) {
	select {
	case <-c.closing:
		return
	default:
	}
	if c.heartbeat.Load() == 0 {
		// Still in its handshake: nothing of it is in flight.
		c.fail(e, true)
		return
	}
	if !c.wentAway.Swap(true) {
		c.out.Put(&wire.Frame{Type: wire.TypeClose, Ref: drainMS, Aux: uint64(e.Code), Tag: e.Msg}, wire.Control, 0)
	}
}

// fail ends the connection. With e, the client first gets a fatal ERROR
// (or, when graceful, a CLOSE) saying why; a client already sent CLOSE by
// goAway gets nothing more when graceful.
func (c *conn) fail(e *wire.Error, graceful bool) {
	c.closeOnce.Do(func() {
		if graceful && c.wentAway.Load() {
			e = nil
		}
		if e != nil {
			f := &wire.Frame{Type: wire.TypeError, Flags: wire.FlagFatal, Aux: uint64(e.Code), Tag: e.Msg}
			if graceful {
				f = &wire.Frame{Type: wire.TypeClose, Aux: uint64(e.Code), Tag: e.Msg}
			}
			c.out.Put(f, wire.Control, 0)
		}
		close(c.closing)
		c.wake() // for the last writes
		// The write loop may be held in a write to a peer that does not
		// read: the last writes get a second, then the socket closes;
		// none at all when a write has waited that long already.
		grace := closeGrace
		if c.out.Blocked() >= closeGrace {
			grace = 0
		}
		c.out.Expire(time.Now().Add(grace))
	})
}

// cut ends the connection as fail does, and its session at once: the
// peer is silent or does not read, so the read loop does not wait for
// it to close its end before the attachments go (and a new leader is
// appointed).
func (c *conn) cut(e *wire.Error) {
	c.abrupt.Store(true) // before fail closes closing: lastWrites sees it
	c.fail(e, false)
	c.nc.SetReadDeadline(time.Now())
}

// closeGrace is how long a closing connection's last writes may take.
const closeGrace = time.Second

// wake runs the write loop unless it runs: the outbox has something to
// write, or the connection is closing ([wire.Outbox.SetWake]).
func (c *conn) wake() {
	c.woken.Store(true)
	if c.writing.CompareAndSwap(false, true) {
		go c.writeLoop()
	}
}

// writeLoop writes what the outbox holds until it holds nothing, then
// ends; a wake starts it again. Once the connection is to end it makes
// the last writes, closes wdone and leaves writing set, so that no loop
// runs after it.
func (c *conn) writeLoop() {
	for {
		c.woken.Store(false)
		select {
		case <-c.closing:
			// Closing wins over a peer that keeps the loop writing.
			c.lastWrites()
			close(c.wdone)
			return
		default:
		}
		if _, err := c.out.Flush(); err != nil {
			if errors.Is(err, wire.ErrWriteStalled) {
				c.countEnd(&c.s.ends.slow)
				c.s.log.Warn("slow consumer disconnected: it took nothing for the timeout", "peer", c.peer, "timeout", c.s.cfg.SlowTimeout)
			}
			// The peer is gone: producers waiting for room must not
			// wait out the slow-consumer timeout for it.
			c.out.Close()
			c.fail(nil, false)
			c.nc.Close()
			close(c.wdone)
			return
		}
		if c.woken.Load() {
			continue
		}
		// Nothing more: stop, unless a wake came after the check above
		// and found this loop still running.
		c.writing.Store(false)
		if !c.woken.Load() || !c.writing.CompareAndSwap(false, true) {
			return
		}
	}
}

// lastWrites writes what is left for a closing connection, within
// closeGrace, and half-closes it.
func (c *conn) lastWrites() {
	if rest := c.out.Close(); len(rest) > 0 {
		c.nc.SetWriteDeadline(time.Now().Add(closeGrace))
		c.nc.Write(rest)
	}
	// Half-close so the client reads the last frames, then let the
	// read loop see the end. (TLS sends close_notify first.)
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	grace := closeGrace
	if c.abrupt.Load() {
		grace = 0
	}
	c.nc.SetReadDeadline(time.Now().Add(grace))
}
