package amqp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// closeWait is how long a connection waits for connection.close-ok after
// it sent connection.close, before it closes the socket anyway.
const closeWait = 3 * time.Second

// conn is one AMQP connection. Its read loop (serve) owns the channels and
// the negotiated settings; writes from any goroutine go through the
// outbox, which the write loop writes (outbox.go).
type conn struct {
	s      *Server
	nc     net.Conn
	peer   string
	r      *Reader
	opened time.Time // when it was accepted

	// Guarded by s.mu.
	inHandshake bool
	counted     bool

	// Owned by the read loop; set by the handshake.
	user       string
	frameMax   uint32
	channelMax uint16
	heartbeat  time.Duration
	channels   map[uint16]*channel
	// clientProps are the client's properties from start-ok.
	clientProps Table
	// gw is the broker side; nil when the server has no broker.
	gw *gateway
	// sessionClosed is set once closeSession ran.
	sessionClosed bool
	// owned are the exclusive queues the connection declared.
	owned map[string]bool
	// nextAttach is the id of the last worker attachment.
	nextAttach uint32
	// buffered counts the body octets of publications not yet whole, on
	// all channels: at most twice Config.MaxMessage.
	buffered int

	out       *outbox
	wdone     chan struct{} // closed when the write loop ends
	cutting   chan struct{} // closed by cut
	cutOnce   sync.Once
	dmu       sync.Mutex   // guards closeBy and setting the write deadline
	closeBy   time.Time    // set by close: the last writes' deadline
	lastWrite atomic.Int64 // unix ns of the last write

	closeOnce sync.Once
	done      chan struct{} // closed when the connection ends
	forced    atomic.Bool   // Server.Shutdown sent connection.close
}

func newConn(s *Server, nc net.Conn) *conn {
	return &conn{
		s: s, nc: nc, peer: nc.RemoteAddr().String(), r: NewReader(nc), opened: time.Now(),
		inHandshake: true, frameMax: FrameMinSize, channels: make(map[uint16]*channel),
		done: make(chan struct{}), out: newOutbox(s.cfg.OutboxLimit),
		wdone: make(chan struct{}), cutting: make(chan struct{}),
	}
}

// serve runs the connection to its end.
func (c *conn) serve() {
	go c.writeLoop()
	defer c.close()
	if err := c.handshake(); err != nil {
		c.fail(err, "handshake")
		return
	}
	c.openSession()
	defer c.closeSession()
	c.s.log.Info("amqp connection opened", "peer", c.peer, "user", c.user, "heartbeat", c.heartbeat, "frame_max", c.frameMax)
	if c.heartbeat > 0 {
		go c.beat(c.heartbeat)
	}
	err := c.readLoop()
	c.fail(err, "connection")
}

// fail ends the connection after err: an AMQP exception is sent in
// connection.close first; a closed peer or a missed heartbeat is logged.
func (c *conn) fail(err error, during string) {
	var ae *Error
	switch {
	case err == nil, errors.Is(err, errClosed):
	case errors.As(err, &ae):
		c.s.log.Info("amqp connection closed with an error", "peer", c.peer, "user", c.user, "during", during, "code", ae.Code, "text", ae.Text)
		c.closeWith(ae)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		if !c.forced.Load() {
			c.s.log.Info("amqp connection closed by the peer without connection.close", "peer", c.peer, "during", during)
		}
	case isTimeout(err):
		c.s.log.Info("amqp connection timed out", "peer", c.peer, "during", during, "heartbeat", c.heartbeat)
	default:
		c.s.log.Info("amqp connection failed", "peer", c.peer, "during", during, "err", err)
	}
}

// errClosed is returned by the read loop when the connection was closed in
// good order (connection.close and close-ok).
var errClosed = errors.New("amqp: connection closed")

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// close ends the connection: what the outbox holds is written, within
// closeGrace, then the socket is closed.
func (c *conn) close() {
	c.closeOnce.Do(func() {
		c.dmu.Lock()
		c.closeBy = time.Now().Add(closeGrace)
		c.nc.SetWriteDeadline(c.closeBy)
		c.dmu.Unlock()
		c.out.close()
		<-c.wdone
		c.nc.Close()
		close(c.done)
	})
}

// send queues one method frame on channel for the write loop.
func (c *conn) send(channel uint16, m Method) error {
	return c.put(func(b []byte) ([]byte, error) { return AppendMethod(b, channel, m) }, false, nil)
}

// put queues frames on the outbox; a client that does not read what is
// sent to it is cut off.
func (c *conn) put(encode func([]byte) ([]byte, error), data bool, after func()) error {
	err := c.out.put(encode, data, after)
	if errors.Is(err, errSlowConsumer) {
		c.s.log.Warn("amqp slow consumer disconnected: too much waits for it", "peer", c.peer, "user", c.user, "limit", c.out.limit)
		c.cut()
	}
	if err != nil {
		return fmt.Errorf("amqp: write to %s: %w", c.peer, err)
	}
	return nil
}

// beat sends a heartbeat frame whenever nothing was written for half the
// heartbeat interval, until the connection ends.
func (c *conn) beat(interval time.Duration) {
	half := interval / 2
	t := time.NewTicker(half)
	defer t.Stop()
	hb := AppendHeartbeat(nil)
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		if time.Since(time.Unix(0, c.lastWrite.Load())) < half {
			continue
		}
		if err := c.put(func(b []byte) ([]byte, error) { return append(b, hb...), nil }, false, nil); err != nil {
			return
		}
	}
}

// readFrame reads the next frame, with a read deadline of two heartbeat
// intervals once they are agreed (RabbitMQ's rule), or the handshake's
// deadline before.
func (c *conn) readFrame() (Frame, error) {
	if c.heartbeat > 0 {
		c.nc.SetReadDeadline(time.Now().Add(2 * c.heartbeat))
	}
	return c.r.ReadFrame()
}

// closeWith sends connection.close with e and waits, at most closeWait,
// for the client's close-ok; then the socket is closed.
func (c *conn) closeWith(e *Error) {
	if err := c.send(0, &ConnectionClose{ReplyCode: e.Code, ReplyText: truncate(e.Text), ClassID: e.ClassID, MethodID: e.MethodID}); err != nil {
		return
	}
	c.nc.SetReadDeadline(time.Now().Add(closeWait))
	c.heartbeat = 0 // keep the deadline just set
	for {
		f, err := c.r.ReadFrame()
		if err != nil {
			return
		}
		if f.Type == FrameMethod && f.Channel == 0 {
			if m, err := DecodeMethod(f.Payload); err == nil {
				switch m.(type) {
				case *ConnectionCloseOK:
					return
				case *ConnectionClose:
					c.send(0, &ConnectionCloseOK{})
					return
				}
			}
		}
	}
}

// shutdown closes the connection from Server.Shutdown: connection.close
// 320, and the socket after closeWait if the read loop has not ended it
// by then.
func (c *conn) shutdown() {
	c.forced.Store(true)
	c.send(0, &ConnectionClose{ReplyCode: ConnectionForced, ReplyText: "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"})
	t := time.AfterFunc(closeWait, c.close)
	go func() {
		<-c.done
		t.Stop()
	}()
}

// truncate cuts a reply text to the 255 octets of a short string.
func truncate(s string) string {
	if len(s) > 255 {
		return s[:255]
	}
	return s
}

// handshake runs the protocol header, start, tune and open, all within
// the handshake timeout.
func (c *conn) handshake() error {
	deadline := time.Now().Add(c.s.cfg.HandshakeTimeout)
	c.nc.SetReadDeadline(deadline)
	var hdr [8]byte
	if _, err := io.ReadFull(c.nc, hdr[:]); err != nil {
		return err
	}
	if !bytes.Equal(hdr[:], ProtocolHeader) {
		// The spec's answer: the header of the protocol we speak, then close.
		c.put(func(b []byte) ([]byte, error) { return append(b, ProtocolHeader...), nil }, false, nil)
		c.s.log.Info("amqp connection refused: not AMQP 0-9-1", "peer", c.peer, "header", fmt.Sprintf("%q", hdr[:]))
		return errClosed
	}
	if err := c.send(0, c.start()); err != nil {
		return err
	}
	var startOK ConnectionStartOK
	if err := c.expect(&startOK); err != nil {
		return err
	}
	c.clientProps = startOK.ClientProperties
	user, password, aerr := credentials(startOK.Mechanism, startOK.Response)
	if aerr != nil {
		return aerr
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	name, aerr := c.s.login(ctx, startOK.Mechanism, user, password, c.peer)
	cancel()
	if aerr != nil {
		return aerr
	}
	c.user = name
	if err := c.tune(); err != nil {
		return err
	}
	var open ConnectionOpen
	if err := c.expect(&open); err != nil {
		return err
	}
	if open.VirtualHost != "/" && open.VirtualHost != "" {
		return Errorf(NotAllowed, "vhost %s not found: Courier has the one virtual host \"/\"", open.VirtualHost)
	}
	if e := c.s.opened(c); e != nil {
		return e
	}
	c.nc.SetReadDeadline(time.Time{})
	return c.send(0, &ConnectionOpenOK{})
}

// start is the server's connection.start.
func (c *conn) start() *ConnectionStart {
	return &ConnectionStart{
		VersionMajor: 0, VersionMinor: 9,
		ServerProperties: Table{
			"product":     "Courier",
			"version":     c.s.cfg.Version,
			"platform":    "Go",
			"copyright":   "the Courier authors",
			"information": "AMQP 0-9-1 gateway of the Courier message broker; see docs/amqp.md",
			"capabilities": Table{
				"authentication_failure_close": true,
				"connection.blocked":           true,
				"publisher_confirms":           true,
				"basic.nack":                   true,
				"consumer_cancel_notify":       true,
				"per_consumer_qos":             true,
			},
		},
		Mechanisms: Mechanisms,
		Locales:    "en_US",
	}
}

// tune offers the server's limits and applies the client's tune-ok.
func (c *conn) tune() error {
	cfg := &c.s.cfg
	hb := uint16(cfg.Heartbeat / time.Second)
	if err := c.send(0, &ConnectionTune{ChannelMax: cfg.ChannelMax, FrameMax: cfg.FrameMax, Heartbeat: hb}); err != nil {
		return err
	}
	var ok ConnectionTuneOK
	if err := c.expect(&ok); err != nil {
		return err
	}
	switch {
	case ok.FrameMax != 0 && ok.FrameMax < FrameMinSize:
		return Errorf(NotAllowed, "frame_max=%d < %d min size", ok.FrameMax, FrameMinSize)
	case ok.FrameMax > cfg.FrameMax:
		return Errorf(NotAllowed, "frame_max=%d > %d max size", ok.FrameMax, cfg.FrameMax)
	case ok.ChannelMax > cfg.ChannelMax:
		return Errorf(NotAllowed, "channel_max=%d > %d max", ok.ChannelMax, cfg.ChannelMax)
	}
	c.frameMax = cfg.FrameMax
	if ok.FrameMax != 0 {
		c.frameMax = ok.FrameMax
	}
	c.channelMax = cfg.ChannelMax
	if ok.ChannelMax != 0 {
		c.channelMax = ok.ChannelMax
	}
	c.heartbeat = time.Duration(ok.Heartbeat) * time.Second
	c.r.SetFrameMax(c.frameMax)
	return nil
}

// expect reads the next handshake method into want. A connection.close
// from the client is answered with close-ok and ends the connection;
// anything else is 503 (command invalid) or 505 (unexpected frame).
func (c *conn) expect(want Method) error {
	for {
		f, err := c.r.ReadFrame()
		if err != nil {
			return err
		}
		switch {
		case f.Type == FrameHeartbeat:
			continue
		case f.Type != FrameMethod:
			return Errorf(UnexpectedFrame, "frame of type %d during the handshake, waiting for %s", f.Type, want.Name())
		case f.Channel != 0:
			return Errorf(CommandInvalid, "method on channel %d during the handshake, waiting for %s", f.Channel, want.Name())
		}
		if err := decodeInto(f.Payload, want); err != nil {
			if m, derr := DecodeMethod(f.Payload); derr == nil {
				if _, ok := m.(*ConnectionClose); ok {
					c.send(0, &ConnectionCloseOK{})
					return errClosed
				}
			}
			return err
		}
		return nil
	}
}

// decodeInto decodes p into m, or fails with 503 if p is another method.
func decodeInto(p []byte, m Method) error {
	got, err := DecodeMethod(p)
	if err != nil {
		return err
	}
	wc, wm := m.ClassMethod()
	if gc, gm := got.ClassMethod(); gc != wc || gm != wm {
		return &Error{Code: CommandInvalid, ClassID: gc, MethodID: gm, Text: fmt.Sprintf("expected %s, got %s", m.Name(), got.Name())}
	}
	d := getDecoder(p[4:])
	m.decode(d)
	putDecoder(d)
	return nil
}
