package broker

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/courier-mq/courier/wire"
)

// mesh joins brokers in one process as the nodes of a cluster: every
// frame between two of them is encoded and decoded by the wire codec, as
// on a node link, and goes through a FIFO queue per direction and link
// (control, data), drained by its own goroutine.
type mesh struct {
	t       testing.TB
	brokers map[string]*Broker

	mu    sync.Mutex
	links map[[2]string]*meshLink // by from, to
	cut   map[[2]string]bool      // pairs cut by cutLink, both directions
	held  map[[2]string]bool      // directions held by hold
	sent  map[string]int          // frames sent, by "from>to type"
	// batched counts the frames sent that still carried a wire.Batch,
	// by "from>to type".
	batched map[string]int
}

// meshLink is one direction between two nodes: a control and a data queue.
type meshLink struct {
	control, data chan []byte
	done          chan struct{}
	gateMu        sync.Mutex
	gate          chan struct{} // closed while frames may pass (see hold)
	lost          atomic.Bool   // set when cut: frames left are dropped
	inflight      atomic.Int64  // frames sent and not yet delivered or dropped
}

// newMesh starts a broker per name, with default config, all linked.
func newMesh(t testing.TB, names ...string) *mesh {
	return newMeshConfig(t, Config{}, names...)
}

// newMeshConfig is newMesh with each broker's config cfg (its Node set
// to its name).
func newMeshConfig(t testing.TB, cfg Config, names ...string) *mesh {
	t.Helper()
	return newMeshPrepared(t, cfg, nil, names...)
}

// newMeshPrepared is newMeshConfig, with prepare, if not nil, called on
// each broker before it has links: what it does there is the state of a
// node before it joins its cluster.
func newMeshPrepared(t testing.TB, cfg Config, prepare func(name string, b *Broker), names ...string) *mesh {
	t.Helper()
	return newMeshFull(t, cfg, nil, prepare, names...)
}

// newMeshWith is newMesh with each broker's config (its Node set) passed
// through config first.
func newMeshWith(t testing.TB, config func(*Config), names ...string) *mesh {
	t.Helper()
	return newMeshFull(t, Config{}, config, nil, names...)
}

// newMeshFull is the mesh of every newMesh variant.
func newMeshFull(t testing.TB, cfg Config, config func(*Config), prepare func(name string, b *Broker), names ...string) *mesh {
	t.Helper()
	m := &mesh{t: t, brokers: map[string]*Broker{}, links: map[[2]string]*meshLink{},
		cut: map[[2]string]bool{}, held: map[[2]string]bool{}, sent: map[string]int{}}
	for _, n := range names {
		c := cfg
		c.Node = n
		if config != nil {
			config(&c)
		}
		b := New(c)
		if prepare != nil {
			prepare(n, b)
		}
		b.SetPeers(meshPeers{m, n})
		m.brokers[n] = b
		t.Cleanup(func() { b.Close() })
	}
	var started []func()
	for i, a := range names {
		for _, b := range names[i+1:] {
			started = append(started, m.up(a, b))
		}
	}
	for _, start := range started {
		start()
	}
	t.Cleanup(m.close)
	return m
}

// up opens the links between a and b, both ways, and tells each that
// the other is up; the frames they send meanwhile wait in the links
// until the returned func starts delivering them, as on a real link
// whose handshake is over before either side reads.
func (m *mesh) up(a, b string) (start func()) {
	l1, l2 := m.link(a, b), m.link(b, a)
	m.brokers[b].PeerUp(a)
	m.brokers[a].PeerUp(b)
	return func() {
		go m.drain(a, b, l1)
		go m.drain(b, a, l2)
	}
}

// link makes the link from→to.
func (m *mesh) link(from, to string) *meshLink {
	l := &meshLink{control: make(chan []byte, 1<<16), data: make(chan []byte, 1<<16), done: make(chan struct{}),
		gate: make(chan struct{})}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.held[[2]string{from, to}] {
		close(l.gate)
	}
	m.links[[2]string{from, to}] = l
	return l
}

// hold stops the delivery of the frames from→to, both links, until
// release: they wait, in order, as on a slow link. A link made anew
// meanwhile (heal) is held too.
func (m *mesh) hold(from, to string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.held[[2]string{from, to}] = true
	if l := m.links[[2]string{from, to}]; l != nil {
		l.gateMu.Lock()
		l.gate = make(chan struct{})
		l.gateMu.Unlock()
	}
}

// pause and resume are hold and release.
func (m *mesh) pause(from, to string)  { m.hold(from, to) }
func (m *mesh) resume(from, to string) { m.release(from, to) }

// release resumes the delivery of the frames from→to.
func (m *mesh) release(from, to string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.held, [2]string{from, to})
	if l := m.links[[2]string{from, to}]; l != nil {
		l.gateMu.Lock()
		select {
		case <-l.gate:
		default:
			close(l.gate)
		}
		l.gateMu.Unlock()
	}
}

// drain delivers a link's frames in order, control first when both wait.
func (m *mesh) drain(from, to string, l *meshLink) {
	defer close(l.done)
	dst := m.brokers[to]
	deliver := func(p []byte) {
		defer l.inflight.Add(-1)
		l.gateMu.Lock()
		gate := l.gate
		l.gateMu.Unlock()
		<-gate
		if l.lost.Load() {
			return
		}
		f := wire.NewFrame(0)
		if err := wire.Decode(p, f); err != nil {
			m.t.Errorf("mesh %s→%s: %v", from, to, err)
			return
		}
		dst.FromPeer(from, f)
	}
	for {
		select {
		case p, ok := <-l.control:
			if !ok {
				return
			}
			deliver(p)
			continue
		default:
		}
		select {
		case p, ok := <-l.control:
			if !ok {
				return
			}
			deliver(p)
		case p, ok := <-l.data:
			if !ok {
				return
			}
			deliver(p)
		}
	}
}

// cutLink cuts both directions between a and b, as a lost link does: each
// side sees PeerDown.
func (m *mesh) cutLink(a, b string) {
	for _, d := range [][2]string{{a, b}, {b, a}} {
		m.mu.Lock()
		l := m.links[d]
		delete(m.links, d)
		m.cut[d] = true
		m.mu.Unlock()
		if l != nil {
			l.shut()
		}
		m.brokers[d[1]].PeerDown(d[0])
	}
}

// heal brings the links between a and b back up.
func (m *mesh) heal(a, b string) {
	m.mu.Lock()
	delete(m.cut, [2]string{a, b})
	delete(m.cut, [2]string{b, a})
	m.mu.Unlock()
	m.up(a, b)()
}

// count returns the frames of type t sent from→to so far.
func (m *mesh) count(from, to string, t wire.Type) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sent[fmt.Sprintf("%s>%s %s", from, to, t)]
}

// quiet reports whether no frame is in flight on any link up: every
// frame sent was delivered, and what its delivery sent too.
func (m *mesh) quiet() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, l := range m.links {
		if l.inflight.Load() != 0 {
			return false
		}
	}
	return true
}

func (m *mesh) close() {
	m.mu.Lock()
	links := m.links
	m.links = map[[2]string]*meshLink{}
	m.mu.Unlock()
	for _, l := range links {
		l.shut()
	}
}

// shut closes the link: what it still holds is lost, as on a cut link.
func (l *meshLink) shut() {
	l.lost.Store(true)
	close(l.control)
	close(l.data)
	l.gateMu.Lock()
	select {
	case <-l.gate:
	default:
		close(l.gate)
	}
	l.gateMu.Unlock()
	<-l.done
}

// meshPeers is one broker's Peers in a mesh.
type meshPeers struct {
	m    *mesh
	from string
}

func (p meshPeers) Send(node string, f *wire.Frame) error { return p.send(node, f, false) }

func (p meshPeers) SendControl(node string, f *wire.Frame) error { return p.send(node, f, true) }

func (p meshPeers) send(node string, f *wire.Frame, control bool) error {
	defer f.Release()
	buf, err := wire.AppendFrame(nil, f, 1<<24)
	if err != nil {
		p.m.t.Errorf("mesh %s→%s: encode %s: %v", p.from, node, f.Type, err)
		return err
	}
	m := p.m
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.links[[2]string{p.from, node}]
	if l == nil {
		return fmt.Errorf("mesh: no link %s→%s", p.from, node)
	}
	m.sent[fmt.Sprintf("%s>%s %s", p.from, node, f.Type)]++
	if f.Batch != nil {
		if m.batched == nil {
			m.batched = map[string]int{}
		}
		m.batched[fmt.Sprintf("%s>%s %s", p.from, node, f.Type)]++
	}
	q := l.data
	if control {
		q = l.control
	}
	l.inflight.Add(1)
	select {
	case q <- buf[4:]:
		return nil
	default:
		l.inflight.Add(-1)
		return fmt.Errorf("mesh: link %s→%s full", p.from, node)
	}
}

func TestMeshPeersUpAndDown(t *testing.T) {
	m := newMesh(t, "a", "b", "c")
	for name, b := range m.brokers {
		if got := len(b.PeerNodes()); got != 2 {
			t.Errorf("%s has %d peers, want 2", name, got)
		}
	}
	m.cutLink("a", "b")
	if got := m.brokers["a"].PeerNodes(); len(got) != 1 || got[0] != "c" {
		t.Errorf("a's peers after the cut: %v, want [c]", got)
	}
	m.heal("a", "b")
	if got := len(m.brokers["b"].PeerNodes()); got != 2 {
		t.Errorf("b has %d peers after healing, want 2", got)
	}
}

// A client cannot speak for a node: node-link frames from a client's
// session are refused like any frame a client may not send.
func TestLinkFramesRefusedFromClients(t *testing.T) {
	b := New(Config{Node: "a"})
	defer b.Close()
	sink := &chanSink{ch: make(chan *wire.Frame, 16)}
	s := b.Open(sink, "client")
	defer s.Close()
	for _, typ := range []wire.Type{wire.TypeRSub, wire.TypeRPub, wire.TypeRView, wire.TypeRReq} {
		f := wire.NewFrame(typ)
		f.Ref, f.Name = 9, "x"
		s.Handle(f)
		got := <-sink.ch
		if got.Type != wire.TypeError || wire.Code(got.Aux) != wire.CodeProtocol {
			t.Errorf("%s from a client: got %s code %d, want ERROR code %d", typ, got.Type, got.Aux, wire.CodeProtocol)
		}
	}
}
