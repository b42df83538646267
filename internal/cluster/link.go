package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/courier-mq/courier/wire"
)

// A node's state as memberlist saw it last.
const (
	stateUnknown = iota // known from a link only
	stateAlive
	stateDead
	stateLeft
)

// Member states reported by Members.
const (
	StateAlive   = "alive"
	StateSuspect = "suspect"
	StateDead    = "dead"
	StateLeft    = "left"
)

// peer is another node: what memberlist says of it and the links with
// it. A session is one pair of links: the peer is up while both are.
type peer struct {
	name string
	f    *Fabric

	// deliver is held for reading while a frame is handed to the
	// handler, and for writing while the session starts or ends, so
	// that no FromPeer runs outside PeerUp..PeerDown.
	deliver sync.RWMutex

	mu      sync.Mutex // guards the fields below
	addr    string     // cluster address
	meta    nodeMeta
	ml      int // stateAlive, stateDead, stateLeft
	mlSince time.Time
	links   [2]*link // control, data: the session's, once up
	pending *link    // a control link accepted, waiting for its data link
	up      bool
	gen     uint64 // session number, bumped at each start and end
	upSince time.Time
	// downSince is when the last session ended (or the peer was first
	// heard of); refused, that a dial found nothing listening since.
	downSince time.Time
	refused   bool
	leaving   bool // it said it is leaving (link CLOSE or metadata)
	dialing   bool // a maintain goroutine runs
	wake      chan struct{}
	stats     [2]linkCounters // per kind, over every session
	rtt       atomic.Int64    // ns, last measured, either link
	cuts      [nCuts]atomic.Uint64
	// dropped counts the frames Send refused while the session was up
	// (ErrLinkFull).
	dropped atomic.Uint64
}

// Why a session ended, as counted in LinkCuts.
const (
	cutSilent   = iota // a link heard nothing, heartbeats included, for three heartbeats
	cutStalled         // the peer took nothing written to a link for the slow-consumer timeout
	cutBroken          // a link's connection failed: reset, closed, a bad frame
	cutDeclared        // memberlist declared the node dead or gone
	cutOther           // the peer dialled again, the broker cut it (Cut), this node closed
	nCuts
)

// linkCounters count one kind of link's traffic with a peer.
type linkCounters struct {
	framesOut, framesIn, bytesOut, bytesIn atomic.Uint64
}

func (f *Fabric) peerLocked(name string) *peer {
	p := f.peers[name]
	if p == nil {
		p = &peer{name: name, f: f, wake: make(chan struct{}, 1), downSince: time.Now()}
		f.peers[name] = p
		f.prunePeers()
	}
	return p
}

// maxPeers bounds the peers remembered; the oldest dead or left ones go
// first.
const maxPeers = 1024

func (f *Fabric) prunePeers() {
	for len(f.peers) > maxPeers {
		var old *peer
		for _, p := range f.peers {
			p.mu.Lock()
			gone := p.ml == stateDead || p.ml == stateLeft
			if gone && (old == nil || p.mlSince.Before(old.mlSince)) {
				old = p
			}
			p.mu.Unlock()
		}
		if old == nil {
			return
		}
		delete(f.peers, old.name)
	}
}

func (p *peer) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// dialer reports whether this node dials the links with name: the
// smaller name dials.
func (f *Fabric) dialer(name string) bool { return f.name < name }

// memberEvent records what memberlist says of a node.
func (f *Fabric) memberEvent(n *memberlist.Node, st int) {
	if n.Name == f.name {
		return
	}
	var m nodeMeta
	if len(n.Meta) > 0 {
		if err := json.Unmarshal(n.Meta, &m); err != nil {
			f.warn.log(f.log, "cluster: bad node metadata", "node", n.Name, "err", err)
		}
	}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	p := f.peerLocked(n.Name)
	f.mu.Unlock()
	p.mu.Lock()
	if m.Cluster != "" {
		p.addr = m.Cluster
	} else if p.addr == "" {
		p.addr = n.Address()
	}
	if len(n.Meta) > 0 {
		p.meta = m
		if m.Leaving {
			p.leaving = true
		}
	}
	if st == stateDead && p.leaving {
		st = stateLeft
	}
	was := p.ml
	if was != st {
		p.ml, p.mlSince = st, time.Now()
	}
	if st == stateAlive && was != stateAlive {
		p.refused = false
		p.leaving = m.Leaving
	}
	up := p.up
	start := st == stateAlive && f.dialer(p.name) && !p.dialing
	if start {
		p.dialing = true
	}
	p.mu.Unlock()
	switch {
	case st != stateAlive && was == stateAlive:
		f.log.Info("cluster: node "+stateName(st), "node", n.Name, "addr", n.Address())
	case st == stateAlive && was != stateAlive:
		f.log.Info("cluster: node alive", "node", n.Name, "addr", n.Address())
	}
	if st != stateAlive && up {
		// memberlist declared it dead or gone: end the session (in the
		// background: memberlist holds its locks here).
		f.spawn(func() { f.teardown(p, 0, cutDeclared, "memberlist declared it "+stateName(st)) })
	}
	if start && !f.spawn(func() { f.maintain(p) }) {
		p.mu.Lock()
		p.dialing = false
		p.mu.Unlock()
	}
	p.poke()
}

func stateName(st int) string {
	switch st {
	case stateAlive:
		return StateAlive
	case stateDead:
		return StateDead
	case stateLeft:
		return StateLeft
	}
	return "unknown"
}

// maintain dials the links with p while memberlist has it alive and they
// are down, with a jittered backoff of up to a second.
func (f *Fabric) maintain(p *peer) {
	backoff := 50 * time.Millisecond
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-f.done:
			return
		case <-t.C:
		case <-p.wake:
		}
		p.mu.Lock()
		if p.ml != stateAlive {
			p.dialing = false
			p.mu.Unlock()
			return
		}
		up, addr := p.up, p.addr
		p.mu.Unlock()
		if up {
			backoff = 50 * time.Millisecond
			t.Reset(time.Hour)
			continue
		}
		err := f.connect(p, addr)
		if err == nil {
			backoff = 50 * time.Millisecond
			t.Reset(time.Hour)
			continue
		}
		p.mu.Lock()
		if refusedErr(err) {
			p.refused = true
		}
		p.mu.Unlock()
		f.log.Debug("cluster: link dial failed", "node", p.name, "addr", addr, "err", err)
		if errors.Is(err, ErrAuth) {
			f.warn.log(f.log, "cluster: link refused", "node", p.name, "addr", addr, "err", err)
		}
		t.Reset(backoff/2 + rand.N(backoff/2+1))
		backoff = min(2*backoff, time.Second)
	}
}

// connect dials a session with p: control, then data, then waits for the
// acceptor's ready mark (an OK on the control link), sent once it has
// started the session on its side.
func (f *Fabric) connect(p *peer, addr string) error {
	if addr == "" {
		return errors.New("no address")
	}
	ctrl, err := f.dialAddr(addr, KindLinkControl, f.cfg.HandshakeTimeout)
	if err != nil {
		return err
	}
	data, err := f.dialAddr(addr, KindLinkData, f.cfg.HandshakeTimeout)
	if err != nil {
		ctrl.Close()
		return err
	}
	if ctrl.peer != p.name || data.peer != p.name {
		ctrl.Close()
		data.Close()
		return fmt.Errorf("%s answers at %s, not %s", ctrl.peer, addr, p.name)
	}
	lc, ld := f.newLink(p, ctrl), f.newLink(p, data)
	ctrl.SetReadDeadline(time.Now().Add(f.cfg.HandshakeTimeout))
	fr := wire.NewFrame(0)
	err = lc.r.Next(fr)
	if err == nil && fr.Type != wire.TypeOK {
		err = fmt.Errorf("%w: the link began with %s, not OK", ErrHandshake, fr.Type)
	}
	fr.Release()
	if err != nil {
		ctrl.Close()
		data.Close()
		return fmt.Errorf("waiting for the link to start: %w", err)
	}
	if !f.establish(p, lc, ld) {
		ctrl.Close()
		data.Close()
		return ErrClosed
	}
	return nil
}

// acceptLink takes a link connection a peer dialled: a control link
// waits for its data link; with both, the session starts, and the
// control link tells the dialer with an OK.
func (f *Fabric) acceptLink(c *Conn) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		c.Close()
		return
	}
	p := f.peerLocked(c.peer)
	f.mu.Unlock()
	l := f.newLink(p, c)
	if c.kind == KindLinkControl {
		// A new control link starts a new session: the dialer found the
		// old one dead before this side did.
		f.teardown(p, 0, cutOther, "the peer dialled again")
		p.mu.Lock()
		if p.addr == "" {
			p.addr = c.peerAddr
		}
		old := p.pending
		p.pending = l
		p.mu.Unlock()
		if old != nil {
			old.conn.Close()
		}
		// A control link whose data link does not follow is dropped.
		time.AfterFunc(f.cfg.HandshakeTimeout, func() {
			p.mu.Lock()
			stale := p.pending == l
			if stale {
				p.pending = nil
			}
			p.mu.Unlock()
			if stale {
				l.conn.Close()
			}
		})
		return
	}
	// The control link's handshake ended first on the dialer's side,
	// but its goroutine here may not have registered it yet.
	var lc *link
	for deadline := time.Now().Add(f.cfg.HandshakeTimeout); ; time.Sleep(5 * time.Millisecond) {
		p.mu.Lock()
		lc = p.pending
		p.pending = nil
		p.mu.Unlock()
		if lc != nil || time.Now().After(deadline) || f.isClosed() {
			break
		}
	}
	if lc == nil {
		c.Close()
		f.warn.log(f.log, "cluster: data link without a control link: dropped", "node", c.peer)
		return
	}
	ok := &wire.Frame{Type: wire.TypeOK, Name: f.name}
	if !f.establishThen(p, lc, l, func() { lc.out.Offer(ok, wire.Control) }) {
		lc.conn.Close()
		c.Close()
	}
}

func (f *Fabric) establish(p *peer, lc, ld *link) bool { return f.establishThen(p, lc, ld, nil) }

// establishThen starts a session with p on links lc and ld, runs then,
// tells the handler PeerUp, and starts the links' loops. then runs
// first so that what it queues (the acceptor's ready mark) goes ahead
// of whatever the handler sends from PeerUp: the dialer reads the ready
// mark as the link's first frame. Nothing is written before the loops
// start, and the peer is not told anything before its session began.
func (f *Fabric) establishThen(p *peer, lc, ld *link, then func()) bool {
	p.deliver.Lock()
	f.mu.Lock()
	closed := f.closed
	f.mu.Unlock()
	if closed {
		p.deliver.Unlock()
		return false
	}
	p.mu.Lock()
	p.gen++
	gen := p.gen
	p.links = [2]*link{lc, ld}
	p.up, p.upSince, p.refused, p.leaving = true, time.Now(), false, false
	if p.ml == stateUnknown || p.ml == stateDead {
		// memberlist lags the links: they prove the node runs.
		p.ml, p.mlSince = stateAlive, time.Now()
	}
	p.mu.Unlock()
	lc.gen, ld.gen = gen, gen
	f.log.Info("cluster: links up", "node", p.name)
	if then != nil {
		then()
	}
	if h := f.handle(); h != nil {
		h.PeerUp(p.name)
	}
	p.deliver.Unlock()
	lc.start()
	ld.start()
	return true
}

// teardown ends p's session gen (0: whatever session is up): it closes
// its links and tells the handler PeerDown once, and counts the end as
// cause (one of the cut constants).
func (f *Fabric) teardown(p *peer, gen uint64, cause int, why string) {
	p.deliver.Lock()
	p.mu.Lock()
	if !p.up || gen != 0 && gen != p.gen {
		p.mu.Unlock()
		p.deliver.Unlock()
		return
	}
	p.cuts[cause].Add(1)
	links := p.links
	leaving := p.leaving
	p.links = [2]*link{}
	p.up = false
	p.gen++
	p.downSince = time.Now()
	p.mu.Unlock()
	for _, l := range links {
		if l != nil {
			l.close()
		}
	}
	if !leaving && (cause == cutSilent || cause == cutStalled || cause == cutBroken) {
		f.log.Warn("cluster: node link cut", "node", p.name, "why", why)
	} else {
		f.log.Info("cluster: links down", "node", p.name, "why", why)
	}
	if h := f.handle(); h != nil {
		h.PeerDown(p.name)
	}
	p.deliver.Unlock()
	p.poke()
	if !f.dialer(p.name) {
		// The dialer redials; this side checks whether anything still
		// listens at the peer's address, to tell a dead process at once.
		f.spawn(func() { f.probe(p) })
	}
}

// probe connects to p's cluster address and hangs up, to learn whether
// the process is gone (the connection is refused).
func (f *Fabric) probe(p *peer) {
	p.mu.Lock()
	addr := p.addr
	p.mu.Unlock()
	if addr == "" {
		return
	}
	select {
	case <-f.done:
		return
	default:
	}
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
		return
	}
	if refusedErr(err) {
		p.mu.Lock()
		if !p.up {
			p.refused = true
		}
		p.mu.Unlock()
	}
}

// link is one connection of a session.
type link struct {
	f     *Fabric
	p     *peer
	kind  Kind
	conn  *countConn
	out   *wire.Outbox
	r     *wire.Reader
	stats *linkCounters
	gen   uint64
	done  chan struct{}
	once  sync.Once
}

func (f *Fabric) newLink(p *peer, c *Conn) *link {
	i := 0
	if c.kind == KindLinkData {
		i = 1
	}
	l := &link{f: f, p: p, kind: c.kind, stats: &p.stats[i], done: make(chan struct{})}
	l.conn = &countConn{Conn: c, stats: l.stats}
	l.out = wire.NewOutbox(l.conn, f.cfg.MaxFrame, f.cfg.OutboxBytes)
	l.out.SetWriteTimeout(f.cfg.SlowTimeout)
	l.r = wire.NewReader(l.conn, f.cfg.MaxFrame)
	return l
}

func (l *link) start() {
	go l.writeLoop()
	go l.readLoop()
}

func (l *link) close() {
	l.once.Do(func() { close(l.done) })
}

// fail ends the link's session, counted as cause.
func (l *link) fail(cause int, why string) {
	l.f.teardown(l.p, l.gen, cause, why)
	l.close()
}

// testHookRead, when set, runs before each frame a link's read loop
// reads: tests hold the loop there, as a starved one would be.
var testHookRead atomic.Pointer[func(*link)]

// readLoop reads frames until the link ends; a link silent for three
// heartbeats is cut. Bytes waiting in the socket are not silence: the
// loop was behind (wire.Unread).
//
// Requests and their answers read together (one read of the socket)
// carry the loop's wire.Batch: what the handler writes for them to
// client connections goes out in one write per connection once the
// frames read are worked through, as a server connection's read loop
// does, rather than a write for the first and a wake-up of the write
// loop for the rest.
func (l *link) readLoop() {
	hb := l.f.cfg.LinkHeartbeat
	silence := 3 * hb
	var deadlineSet time.Time
	var batch wire.Batch
	defer batch.Flush()
	for {
		if !l.r.Buffered() {
			batch.Flush()
		}
		if now := time.Now(); now.Sub(deadlineSet) > hb/4 {
			l.conn.SetReadDeadline(now.Add(silence))
			deadlineSet = now
		}
		if h := testHookRead.Load(); h != nil {
			(*h)(l)
		}
		fr := wire.NewFrame(0)
		err := l.r.Next(fr)
		if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && wire.Unread(l.conn) > 0 {
			// The peer spoke; this loop is behind (busy handing frames
			// over, or starved of CPU): not silence.
			fr.Release()
			deadlineSet = time.Time{}
			continue
		}
		if err != nil {
			fr.Release()
			select {
			case <-l.done:
				return
			default:
			}
			why, cause := fmt.Sprintf("%s link: %v", l.kind, err), cutBroken
			if errors.Is(err, os.ErrDeadlineExceeded) {
				why, cause = fmt.Sprintf("%s link silent for %s", l.kind, silence), cutSilent
			}
			if errors.Is(err, wire.ErrMalformed) || errors.Is(err, wire.ErrFrameTooLarge) {
				l.f.warn.log(l.f.log, "cluster: bad frame on a node link: cut", "node", l.p.name, "err", err)
			}
			l.fail(cause, why)
			return
		}
		l.stats.framesIn.Add(1)
		switch fr.Type {
		case wire.TypePing:
			pong := &wire.Frame{Type: wire.TypePong, Ref: fr.Ref}
			if l.out.Offer(pong, wire.Control) == nil {
				l.stats.framesOut.Add(1)
			}
			fr.Release()
			continue
		case wire.TypeClose:
			l.p.mu.Lock()
			l.p.leaving = true
			l.p.mu.Unlock()
			fr.Release()
			continue
		case wire.TypePong:
			if sent := time.Duration(fr.Ref); sent > 0 {
				l.p.rtt.Store(int64(time.Since(l.f.epoch) - sent))
			}
			fr.Release()
			continue
		}
		if latencyPath(fr.Type) {
			fr.Batch = &batch
		}
		l.deliver(fr)
	}
}

// deliver hands fr to the handler, if the session is still the link's.
func (l *link) deliver(fr *wire.Frame) {
	l.p.deliver.RLock()
	defer l.p.deliver.RUnlock()
	l.p.mu.Lock()
	current := l.p.up && l.p.gen == l.gen
	l.p.mu.Unlock()
	h := l.f.handle()
	if !current || h == nil {
		fr.Release()
		return
	}
	h.FromPeer(l.p.name, fr)
}

// writeLoop writes what the outbox holds and sends a PING every
// heartbeat; a write the peer takes nothing of for the slow-consumer
// timeout cuts the link.
func (l *link) writeLoop() {
	defer l.conn.Close()
	tick := time.NewTicker(l.f.cfg.LinkHeartbeat)
	defer tick.Stop()
	for {
		select {
		case <-l.out.Ready():
			if _, err := l.out.Flush(); err != nil {
				cause := cutBroken
				if errors.Is(err, wire.ErrWriteStalled) {
					cause = cutStalled
					l.f.log.Warn("cluster: node link cut: the peer took nothing for the slow-consumer timeout", "node", l.p.name, "link", l.kind.String(), "timeout", l.f.cfg.SlowTimeout)
				}
				l.out.Close()
				l.fail(cause, fmt.Sprintf("%s link write: %v", l.kind, err))
				return
			}
		case <-tick.C:
			ping := &wire.Frame{Type: wire.TypePing, Ref: uint64(time.Since(l.f.epoch))}
			l.out.Offer(ping, wire.Control)
			l.stats.framesOut.Add(1)
		case <-l.done:
			if rest := l.out.Close(); len(rest) > 0 {
				l.conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
				l.conn.Write(rest)
			}
			return
		}
	}
}

// countConn counts the bytes of a link.
type countConn struct {
	net.Conn
	stats *linkCounters
}

// NetConn returns the connection counted.
func (c *countConn) NetConn() net.Conn { return c.Conn }

func (c *countConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.stats.bytesIn.Add(uint64(n))
	return n, err
}

// testHookWrite, when set, runs before each write to a link's
// connection: tests see which goroutine writes.
var testHookWrite atomic.Pointer[func()]

func (c *countConn) Write(p []byte) (int, error) {
	if h := testHookWrite.Load(); h != nil {
		(*h)()
	}
	n, err := c.Conn.Write(p)
	c.stats.bytesOut.Add(uint64(n))
	return n, err
}

// Send sends fr to node on the data link: FIFO with the other frames
// Send gives that node. A publication or a request (RPUB, RREQ, REQUEST)
// waits while the link's outbox is full, for as long as the link is up:
// a peer that is slow but alive holds its producers back, as a slow
// subscriber holds a publisher on one node, and a link is cut only when
// its peer is silent for three link heartbeats or takes nothing for the
// slow-consumer timeout (PeerDown, and the link is redialled), which
// ends the wait with ErrNoLink. Any other frame never waits: past the
// outbox's offer limit it fails with ErrLinkFull (counted in
// LinkStats.Dropped). Send does not keep fr; the caller still owns it.
func (f *Fabric) Send(node string, fr *wire.Frame) error { return f.send(node, fr, 1) }

// waitsForRoom reports whether a data frame of type t waits for room in
// a full link's outbox rather than fail: publications and requests,
// whose producers are held back as by a slow subscriber or handler.
// Everything else (answers, errors, cancels) never waits: it may be sent
// under the broker's locks.
func waitsForRoom(t wire.Type) bool {
	return t == wire.TypeRPub || t == wire.TypeRReq || t == wire.TypeRequest
}

// linkMode tells how a frame goes on link i (0 control, 1 data): on
// the data link, requests and their answers are urgent, so that a
// producer finding the link idle writes them itself, on its own
// goroutine, instead of waking the link's write loop (a goroutine
// hand-off on each of the two hops of a cross-node round trip). A busy
// link batches them as any data frame, and a TLS link never writes
// inline (wire.FragileWriter): its write loop writes them.
func linkMode(i int, t wire.Type) wire.Mode {
	switch {
	case i == 0:
		return wire.Control
	case latencyPath(t):
		return wire.Urgent
	}
	return wire.Data
}

// latencyPath reports whether a data frame of type t is on a
// request-response path someone waits on: a forwarded request, and a
// response, ask or answer on its way back.
func latencyPath(t wire.Type) bool {
	switch t {
	case wire.TypeRReq, wire.TypeRequest, wire.TypeResponse, wire.TypeAsk, wire.TypeAnswer:
		return true
	}
	return false
}

// SendControl is Send on the control link, which bulk data never
// delays.
func (f *Fabric) SendControl(node string, fr *wire.Frame) error { return f.send(node, fr, 0) }

func (f *Fabric) send(node string, fr *wire.Frame, i int) error {
	if err := fr.Check(); err != nil {
		return err
	}
	f.mu.RLock()
	p := f.peers[node]
	closed := f.closed
	f.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	if p == nil {
		return fmt.Errorf("%w %q", ErrNoLink, node)
	}
	p.mu.Lock()
	l := p.links[i]
	p.mu.Unlock()
	if l == nil {
		return fmt.Errorf("%w %q", ErrNoLink, node)
	}
	mode := linkMode(i, fr.Type)
	var err error
	if i == 1 && waitsForRoom(fr.Type) {
		// Publications and requests wait for room while the link lives,
		// as a client's do for a slow subscriber: the link's own checks
		// (silence, a stalled write) end it, and the wait with it. A
		// timeout of its own would drop a publication, or cut a link,
		// that is alive and only slow.
		err = l.out.PutCancel(fr, mode, l.done)
		if errors.Is(err, wire.ErrOutboxFull) {
			err = wire.ErrOutboxClosed // l.done: the link went down
		}
	} else {
		err = l.out.Offer(fr, mode)
	}
	switch {
	case errors.Is(err, wire.ErrOutboxFull):
		p.dropped.Add(1)
		return fmt.Errorf("%w to %q: %w", ErrLinkFull, node, err)
	case errors.Is(err, wire.ErrOutboxClosed):
		return fmt.Errorf("%w %q: %w", ErrNoLink, node, err)
	case err != nil:
		return err
	}
	l.stats.framesOut.Add(1)
	return nil
}

func (f *Fabric) isClosed() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// spawn runs fn in a goroutine that Close waits for, unless the fabric
// is closed; it reports whether it did.
func (f *Fabric) spawn(fn func()) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		fn()
	}()
	return true
}
