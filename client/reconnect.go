package client

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/wire"
)

// transport carries a Conn's frames over one [link] at a time. When the
// link is lost and reconnecting is on, its supervisor (run) reconnects,
// has the Conn resume, and sends what it held meanwhile:
//
//   - PUBLISH and SUBMIT frames sent while there is no link are held, in
//     order, up to Options.ReconnectBufSize bytes;
//   - confirmed ones (FlagReply) sent on a link are tracked until their OK
//     or ERROR, and those still unanswered when the link is lost are held
//     again, ahead of the rest (at-least-once);
//   - anything else sent while there is no link fails with
//     [courier.ErrConnectionLost]: the Conn makes new calls wait for the
//     link, so what reaches the transport then belongs to the lost one
//     (answers, acks, decisions).
type transport struct {
	list URLs
	opts Options
	conn *courier.Conn
	recv func(*wire.Frame)

	up       atomic.Pointer[link] // the link in use; nil while reconnecting
	resuming atomic.Pointer[link] // the new link while the Conn resumes on it

	mu         sync.Mutex // guards the fields below
	cur        *link      // the latest link, live or not
	closed     bool       // Close was called, or the transport gave up
	closeErr   error
	discovered []string // connect_urls of the latest WELCOME
	held       []*wire.Frame
	heldBytes  int
	tracked    map[uint64]trackedFrame // confirmed frames sent, not yet answered
	seq        uint64                  // orders tracked
	closing    chan struct{}           // closed by Close and when giving up
	done       chan struct{}           // closed when run ends
}

// trackedFrame is a copy of a confirmed frame, kept to be sent again.
type trackedFrame struct {
	seq uint64
	f   *wire.Frame
}

var (
	_ courier.Transport     = (*transport)(nil)
	_ courier.ContextSender = (*transport)(nil)
)

func newTransport(list URLs, opts Options) *transport {
	return &transport{
		list: list, opts: opts,
		tracked: make(map[uint64]trackedFrame),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
}

// start makes the Conn over the first link and starts the supervisor.
func (t *transport) start(l *link) {
	t.cur = l
	t.up.Store(l)
	t.conn = courier.NewConn(t, courier.ConnOptions{ID: l.welcome.Conn, Log: t.opts.Log, OnConnEvent: t.opts.OnConnEvent, ProducerID: t.producerID(l)})
	l.run()
	go t.run(l)
}

func (t *transport) Start(recv func(*wire.Frame)) { t.recv = recv }

// producerID returns the id for the Conn's submits over a first link l:
// Options.ProducerID, or a random one; "" if deduplication is off or
// the server does not offer it.
func (t *transport) producerID(l *link) string {
	if t.opts.NoDedup || !l.welcome.Dedup {
		return ""
	}
	if t.opts.ProducerID != "" {
		return t.opts.ProducerID
	}
	return "c-" + crand.Text() // 26 characters of base32: 130 random bits
}

// receive takes a frame from a link: an answer to a confirmed frame ends
// its tracking.
func (t *transport) receive(f *wire.Frame) {
	if f.Ref != 0 && (f.Type == wire.TypeOK || f.Type == wire.TypeError) && !t.opts.NoReconnect {
		t.mu.Lock()
		if tf, ok := t.tracked[f.Ref]; ok {
			delete(t.tracked, f.Ref)
			tf.f.Release()
		}
		t.mu.Unlock()
	}
	t.recv(f)
}

// Send encodes f for the server. PUBLISH and REQUEST wait for credit.
func (t *transport) Send(f *wire.Frame) error {
	return t.SendContext(context.Background(), f)
}

// SendContext is Send for a caller that may give up: waiting for credit
// or for room in the outbox ends with ctx, before f was sent.
func (t *transport) SendContext(ctx context.Context, f *wire.Frame) error {
	for {
		l := t.up.Load()
		if l == nil {
			if r := t.resuming.Load(); r != nil && !isData(f) {
				l = r // an answer to what the new link brought
			}
		}
		if l == nil {
			err := t.hold(f, nil)
			if err == errRetry {
				continue
			}
			return err
		}
		if h := testHookSend.Load(); h != nil && isConfirmed(f) {
			(*h)()
		}
		tracked, gone := t.track(f, l)
		if gone {
			// Lost since it was loaded: as if sent while reconnecting.
			if err := t.hold(f, l); err != errRetry {
				return err
			}
			continue
		}
		err := l.send(ctx, f)
		if err == nil {
			f.Release()
			return nil
		}
		if tracked {
			t.untrack(f.Ref)
		}
		var de *downError
		var ae *awayError
		switch {
		case t.opts.NoReconnect:
			if errors.As(err, &de) {
				err = de.err
			}
		case errors.As(err, &de):
			// Lost under the send: as if sent while reconnecting.
			if err = t.hold(f, l); err == errRetry {
				continue
			}
			return err
		case errors.As(err, &ae) && isData(f):
			// The server drains: the next one takes it.
			if err = t.hold(f, l); err == errRetry {
				continue
			}
			return err
		}
		f.Release()
		return err
	}
}

// testHookSend, when set, runs in SendContext between taking the link
// and sending a confirmed frame on it: tests lose the link there.
var testHookSend atomic.Pointer[func()]

// errRetry tells SendContext that a link came up meanwhile.
var errRetry = errors.New("client: retry")

// errLinkGone fails a resume whose link was lost under it.
var errLinkGone = fmt.Errorf("client: link lost while resuming: %w", courier.ErrConnectionLost)

// isData reports whether f is held while reconnecting.
func isData(f *wire.Frame) bool {
	return f.Type == wire.TypePublish || f.Type == wire.TypeSubmit
}

// isConfirmed reports whether f waits for an OK that must come.
func isConfirmed(f *wire.Frame) bool {
	return isData(f) && f.Flags&wire.FlagReply != 0
}

// hold keeps f for the next link, or fails it; it takes ownership of f
// unless it returns errRetry. from is the link the send failed on, if
// any: the link in use may have changed since.
func (t *transport) hold(f *wire.Frame, from *link) error {
	t.mu.Lock()
	if t.closed {
		err := t.closeErr
		t.mu.Unlock()
		f.Release()
		if err == nil {
			err = courier.ErrClosed
		}
		return err
	}
	if u := t.up.Load(); u != nil && u != from {
		t.mu.Unlock()
		return errRetry
	}
	if !isData(f) {
		t.mu.Unlock()
		typ := f.Type // f goes back to the pool: read it first
		f.Release()
		return fmt.Errorf("client: %s: %w", typ, courier.ErrConnectionLost)
	}
	n := frameSize(f)
	if t.opts.ReconnectBufSize < 0 || t.heldBytes+n > t.opts.ReconnectBufSize {
		t.mu.Unlock()
		f.Release()
		return fmt.Errorf("%w: %d bytes held while reconnecting (Options.ReconnectBufSize)", ErrReconnectBufferFull, t.heldBytes)
	}
	f.Batch = nil
	t.held = append(t.held, f)
	t.heldBytes += n
	t.mu.Unlock()
	return nil
}

// frameSize approximates what f costs held.
func frameSize(f *wire.Frame) int {
	n := 64 + len(f.Name) + len(f.Key) + len(f.Tag) + len(f.Body)
	for k, v := range f.Header {
		n += len(k) + len(v) + 2
	}
	return n
}

// track keeps a copy of a confirmed frame until its answer, about to be
// sent on l; it reports whether it did, and whether l is out of use
// already (then nothing is tracked: a frame tracked after [transport.lose]
// took l's would wait for an answer that never comes).
func (t *transport) track(f *wire.Frame, l *link) (tracked, gone bool) {
	if t.opts.NoReconnect || !isConfirmed(f) {
		return false, false
	}
	c := f.Clone()
	c.Batch = nil
	t.mu.Lock()
	if t.up.Load() != l && t.resuming.Load() != l {
		t.mu.Unlock()
		c.Release()
		return false, true
	}
	t.seq++
	t.tracked[f.Ref] = trackedFrame{seq: t.seq, f: c}
	t.mu.Unlock()
	return true, false
}

func (t *transport) untrack(ref uint64) {
	t.mu.Lock()
	if tf, ok := t.tracked[ref]; ok {
		delete(t.tracked, ref)
		tf.f.Release()
	}
	t.mu.Unlock()
}

// Close tells the server and closes the connection; it stops
// reconnecting.
func (t *transport) Close() error {
	t.mu.Lock()
	if !t.closed {
		t.closed, t.closeErr = true, courier.ErrClosed
		close(t.closing)
	}
	l := t.cur
	t.mu.Unlock()
	if l != nil {
		l.out.Put(&wire.Frame{Type: wire.TypeClose, Tag: "client closed"}, wire.Control, 0)
		l.end(courier.ErrClosed, courier.ErrClosed)
	}
	<-t.done
	return nil
}

func (t *transport) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// run is the supervisor: it waits for the link in use to end, then
// reconnects, or closes the Conn.
func (t *transport) run(l *link) {
	defer close(t.done)
	for {
		<-l.done
		if t.isClosed() {
			t.finish(courier.ErrClosed)
			return
		}
		if !t.reconnects(l.cause) {
			t.finish(l.closeErr)
			return
		}
		lostAt := time.Now()
		was := t.conn.ID()
		lost := fmt.Errorf("%w with %s: %w", courier.ErrConnectionLost, l.addr, l.cause)
		t.lose(l, lost)
		t.opts.Log.Info("courier: connection lost; reconnecting", "server", l.addr, "conn", was, "err", l.cause)
		t.conn.ReportConnEvent(courier.ConnEvent{Kind: courier.ConnDisconnected, Err: lost, Was: was, URL: l.addr})
		attempts := 0
		for {
			next, n, err := t.redial(l.addr, attempts)
			attempts = n
			if next == nil {
				t.finish(err)
				return
			}
			refused, err := t.resume(next)
			if err != nil {
				if t.isClosed() {
					t.finish(courier.ErrClosed)
					return
				}
				// The new link died while resuming: lose it too.
				<-next.done
				t.lose(next, fmt.Errorf("%w with %s: %w", courier.ErrConnectionLost, next.addr, next.cause))
				continue
			}
			l = next
			ev := courier.ConnEvent{
				Kind: courier.ConnReconnected, URL: l.addr, ID: t.conn.ID(), Was: was,
				Attempts: attempts, Down: time.Since(lostAt), Err: errors.Join(refused...),
			}
			t.opts.Log.Info("courier: reconnected", "server", l.addr, "conn", ev.ID, "was", was, "attempts", attempts, "down", ev.Down)
			t.conn.Reconnected(ev)
			break
		}
	}
}

// reconnects reports whether a link that ended with cause is worth
// reconnecting after: not when the server said the client is wrong (a
// protocol error, a limit it broke, bad credentials).
func (t *transport) reconnects(cause error) bool {
	if t.opts.NoReconnect {
		return false
	}
	var we *wire.Error
	if errors.As(cause, &we) && we.Fatal {
		switch we.Code {
		case wire.CodeProtocol, wire.CodeVersion, wire.CodeFrameTooLarge, wire.CodeLimit, wire.CodeUnauthorized:
			return false
		}
	}
	return true
}

// lose takes l out of use: the confirmed frames it left unanswered are
// held again, ahead of what was held since, and the Conn fails its
// calls in flight.
func (t *transport) lose(l *link, err error) {
	t.mu.Lock()
	t.up.CompareAndSwap(l, nil)
	t.resuming.CompareAndSwap(l, nil)
	again := make([]trackedFrame, 0, len(t.tracked))
	for _, tf := range t.tracked {
		again = append(again, tf)
		t.heldBytes += frameSize(tf.f)
	}
	clear(t.tracked)
	slices.SortFunc(again, func(a, b trackedFrame) int { return cmp.Compare(a.seq, b.seq) })
	frames := make([]*wire.Frame, 0, len(again)+len(t.held))
	for _, tf := range again {
		frames = append(frames, tf.f)
	}
	t.held = append(frames, t.held...)
	t.mu.Unlock()
	t.conn.Interrupted(err, true)
}

// finish closes the Conn for good with err.
func (t *transport) finish(err error) {
	t.mu.Lock()
	if !t.closed {
		t.closed, t.closeErr = true, err
		close(t.closing)
	}
	if t.closeErr != nil {
		err = t.closeErr
	}
	for _, f := range t.held {
		f.Release()
	}
	t.held, t.heldBytes = nil, 0
	for _, tf := range t.tracked {
		tf.f.Release()
	}
	clear(t.tracked)
	l := t.up.Swap(nil)
	t.mu.Unlock()
	if l != nil {
		l.end(err, err)
	}
	t.conn.Closed(err)
	t.conn.ReportConnEvent(courier.ConnEvent{Kind: courier.ConnClosed, Err: err, Was: t.conn.ID()})
}

// redial tries the known servers in rounds until one answers; it returns
// nil when closed or out of rounds, with why. lost, the server just
// lost, comes last in the first round. attempts counts on from done.
func (t *transport) redial(lost string, done int) (*link, int, error) {
	var last error
	for round := 0; ; round++ {
		if t.opts.MaxReconnects >= 0 && round >= t.opts.MaxReconnects {
			return nil, done, fmt.Errorf("%w: no server answered in %d rounds of reconnecting (%d attempts): %w", courier.ErrClosed, round, done, last)
		}
		if round > 0 && !t.sleep(t.backoff(round)) {
			return nil, done, courier.ErrClosed
		}
		for _, addr := range t.order(lost, round) {
			if t.isClosed() {
				return nil, done, courier.ErrClosed
			}
			done++
			l, err := t.attempt(addr)
			if err == nil {
				return l, done, nil
			}
			last = err
			t.opts.Log.Debug("courier: reconnect attempt failed", "server", addr, "err", err)
			if errors.Is(err, courier.ErrUnauthorized) {
				return nil, done, fmt.Errorf("%w: reconnecting: %w", courier.ErrClosed, err)
			}
		}
	}
}

// attempt dials addr within DialTimeout, or until Close.
func (t *transport) attempt(addr string) (*link, error) {
	ctx, cancel := context.WithTimeout(context.Background(), t.opts.DialTimeout)
	defer cancel()
	go func() {
		select {
		case <-t.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	l, err := t.dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		l.nc.Close()
		return nil, courier.ErrClosed
	}
	t.cur = l
	t.mu.Unlock()
	return l, nil
}

// backoff is the wait before round (≥ 1): ReconnectWait doubled with each
// round up to ReconnectWaitMax, jittered to between half and all of it.
func (t *transport) backoff(round int) time.Duration {
	d := t.opts.ReconnectWaitMax
	if round < 30 {
		d = min(t.opts.ReconnectWait<<(round-1), d)
	}
	return d/2 + rand.N(d/2+1)
}

// sleep waits d; false if closed meanwhile.
func (t *transport) sleep(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-t.closing:
		return false
	}
}

// order returns the known servers in a random order, lost last in the
// first round.
func (t *transport) order(lost string, round int) []string {
	t.mu.Lock()
	addrs := slices.Clone(t.list.Addrs)
	for _, a := range t.discovered {
		if !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	t.mu.Unlock()
	rand.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })
	if round == 0 {
		if i := slices.Index(addrs, lost); i >= 0 {
			addrs = append(slices.Delete(addrs, i, i+1), lost)
		}
	}
	return addrs
}

// resume has the Conn declare and re-attach on l, then sends what was
// held and puts l in use.
func (t *transport) resume(l *link) ([]error, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-l.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	t.resuming.Store(l)
	l.run()
	send := func(f *wire.Frame) error {
		defer f.Release()
		return l.send(ctx, f)
	}
	refused, err := t.conn.Resume(ctx, l.welcome.Conn, send)
	if err != nil {
		l.end(err, err)
		return nil, err
	}
	if err := t.flush(ctx, l); err != nil {
		l.end(err, err)
		return nil, err
	}
	return refused, nil
}

// flush sends what was held on l, in order, and puts l in use once
// nothing is left.
func (t *transport) flush(ctx context.Context, l *link) error {
	for {
		t.mu.Lock()
		if len(t.held) == 0 {
			t.up.Store(l)
			t.resuming.Store(nil)
			t.mu.Unlock()
			return nil
		}
		batch := t.held
		t.held, t.heldBytes = nil, 0
		t.mu.Unlock()
		for i, f := range batch {
			tracked, gone := t.track(f, l)
			err := errLinkGone
			if !gone {
				err = l.send(ctx, f)
			}
			if err != nil {
				if tracked {
					t.untrack(f.Ref)
				}
				t.mu.Lock()
				rest := batch[i:]
				for _, g := range rest {
					t.heldBytes += frameSize(g)
				}
				t.held = append(slices.Clone(rest), t.held...)
				t.mu.Unlock()
				return err
			}
			f.Release()
		}
	}
}

// Bounds on what a server's WELCOME may name in connect_urls; beyond
// them the rest is ignored.
const (
	maxDiscovered   = 64
	maxDiscoveredLn = 255
)

// learn records the servers a WELCOME named, at most maxDiscovered of
// them, each a host:port of at most maxDiscoveredLn bytes.
func (t *transport) learn(urls []string) {
	if t.opts.IgnoreDiscoveredURLs || t.list.WSPath != "" {
		// Over WebSocket the servers' client addresses are of no use:
		// they name TCP listeners.
		return
	}
	var found []string
	for _, u := range urls {
		if len(found) == maxDiscovered {
			break
		}
		if addr, ok := checkAddr(u); ok && !slices.Contains(found, addr) {
			found = append(found, addr)
		}
	}
	t.mu.Lock()
	t.discovered = found
	t.mu.Unlock()
}

// checkAddr checks a server-given host:port and returns it in the form
// net.JoinHostPort gives.
func checkAddr(s string) (string, bool) {
	if len(s) == 0 || len(s) > maxDiscoveredLn {
		return "", false
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return "", false
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != port {
		return "", false
	}
	for _, r := range host {
		ok := r == '.' || r == '-' || r == ':' || r == '_' || r == '%' ||
			('0' <= r && r <= '9') || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z')
		if !ok {
			return "", false
		}
	}
	return net.JoinHostPort(host, port), true
}
