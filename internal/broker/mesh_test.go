package broker

import (
	"fmt"
	"sync"
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
	links map[[2]string]*meshLink     // by from, to
	cut   map[[2]string]bool          // pairs cut by cutLink, both directions
	sent  map[string]int              // frames sent, by "from>to type"
	gates map[[2]string]chan struct{} // directions paused by pause
}

// meshLink is one direction between two nodes: a control and a data queue.
type meshLink struct {
	control, data chan []byte
	done          chan struct{}
}

// newMesh starts a broker per name, with default config, all linked.
func newMesh(t testing.TB, names ...string) *mesh {
	return newMeshConfig(t, nil, names...)
}

// newMeshConfig is newMesh with each broker's config passed through
// config first, when not nil.
func newMeshConfig(t testing.TB, config func(*Config), names ...string) *mesh {
	t.Helper()
	m := &mesh{t: t, brokers: map[string]*Broker{}, links: map[[2]string]*meshLink{},
		cut: map[[2]string]bool{}, sent: map[string]int{}, gates: map[[2]string]chan struct{}{}}
	for _, n := range names {
		cfg := Config{Node: n}
		if config != nil {
			config(&cfg)
		}
		b := New(cfg)
		b.SetPeers(meshPeers{m, n})
		m.brokers[n] = b
		t.Cleanup(func() { b.Close() })
	}
	for _, a := range names {
		for _, b := range names {
			if a != b {
				m.up(a, b)
			}
		}
	}
	t.Cleanup(m.close)
	return m
}

// up opens the link from→to and tells to that from is up.
func (m *mesh) up(from, to string) {
	l := &meshLink{control: make(chan []byte, 1<<16), data: make(chan []byte, 1<<16), done: make(chan struct{})}
	m.mu.Lock()
	m.links[[2]string{from, to}] = l
	m.mu.Unlock()
	m.brokers[to].PeerUp(from)
	go m.drain(from, to, l)
}

// drain delivers a link's frames in order, control first when both wait.
func (m *mesh) drain(from, to string, l *meshLink) {
	defer close(l.done)
	dst := m.brokers[to]
	deliver := func(p []byte) {
		m.mu.Lock()
		gate := m.gates[[2]string{from, to}]
		m.mu.Unlock()
		if gate != nil {
			<-gate
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
			close(l.control)
			close(l.data)
			<-l.done
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
	m.up(a, b)
	m.up(b, a)
}

// pause holds the frames from→to, both links, until resume; a test
// resumes what it paused before it cuts that link or ends.
func (m *mesh) pause(from, to string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gates[[2]string{from, to}] = make(chan struct{})
}

// resume delivers what pause held, and what follows.
func (m *mesh) resume(from, to string) {
	m.mu.Lock()
	gate := m.gates[[2]string{from, to}]
	delete(m.gates, [2]string{from, to})
	m.mu.Unlock()
	if gate != nil {
		close(gate)
	}
}

// count returns the frames of type t sent from→to so far.
func (m *mesh) count(from, to string, t wire.Type) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sent[fmt.Sprintf("%s>%s %s", from, to, t)]
}

func (m *mesh) close() {
	m.mu.Lock()
	links := m.links
	m.links = map[[2]string]*meshLink{}
	m.mu.Unlock()
	for _, l := range links {
		close(l.control)
		close(l.data)
		<-l.done
	}
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
	q := l.data
	if control {
		q = l.control
	}
	select {
	case q <- buf[4:]:
		return nil
	default:
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
