package replica

import (
	"math/rand/v2"
	"sync"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Envelope is one Raft message of one group.
type Envelope struct {
	Group GroupID
	Msg   *pb.Message
}

// Transport carries a host's Raft messages to the other hosts. Hosts are
// named by their replica id ([Config.ID]): a host has the same id in
// every group it belongs to.
type Transport interface {
	// Send hands a batch of messages for host to, best effort: it must
	// not block, and may drop messages (Raft resends). The batch and its
	// messages are the transport's after the call.
	Send(to uint64, batch []Envelope)
	// Listen sets the function the transport calls with every batch that
	// arrives for this host, from any goroutine. recv does not block; it
	// owns the batch.
	Listen(recv func(batch []Envelope))
}

// MemNetwork connects in-process hosts, with faults for tests: cut
// links, partitions, random drops and delays. Messages are deep copies,
// as if they had crossed a network.
type MemNetwork struct {
	mu    sync.Mutex
	hosts map[uint64]*MemTransport
	cut   map[[2]uint64]bool
	drop  float64
	delay time.Duration
	sent  map[uint64]int    // batches sent per sender, for tests
	msgs  map[uint64][2]int // messages sent per sender: of groups, host heartbeats
}

// NewMemNetwork returns a network with no hosts and no faults.
func NewMemNetwork() *MemNetwork {
	return &MemNetwork{hosts: map[uint64]*MemTransport{}, cut: map[[2]uint64]bool{}, sent: map[uint64]int{}, msgs: map[uint64][2]int{}}
}

// MemTransport is one host's end of a [MemNetwork].
type MemTransport struct {
	net  *MemNetwork
	id   uint64
	mu   sync.Mutex
	recv func([]Envelope)
	in   chan memBatch
	stop chan struct{}
	once sync.Once
}

type memBatch struct {
	at    time.Time
	batch []Envelope
}

// memQueue bounds what waits for a host: beyond it, batches are dropped.
const memQueue = 4096

// Transport attaches host id to the network, replacing (and closing) any
// transport it had.
func (n *MemNetwork) Transport(id uint64) *MemTransport {
	t := &MemTransport{net: n, id: id, in: make(chan memBatch, memQueue), stop: make(chan struct{})}
	n.mu.Lock()
	old := n.hosts[id]
	n.hosts[id] = t
	n.mu.Unlock()
	if old != nil {
		old.Close()
	}
	go t.run()
	return t
}

// Remove detaches host id: what is sent to it or by it is lost.
func (n *MemNetwork) Remove(id uint64) {
	n.mu.Lock()
	t := n.hosts[id]
	delete(n.hosts, id)
	n.mu.Unlock()
	if t != nil {
		t.Close()
	}
}

// Cut stops messages between a and b, both ways.
func (n *MemNetwork) Cut(a, b uint64) {
	n.mu.Lock()
	n.cut[[2]uint64{a, b}] = true
	n.cut[[2]uint64{b, a}] = true
	n.mu.Unlock()
}

// CutFrom stops messages from a to b, one way.
func (n *MemNetwork) CutFrom(a, b uint64) {
	n.mu.Lock()
	n.cut[[2]uint64{a, b}] = true
	n.mu.Unlock()
}

// Isolate cuts id from every other host in ids.
func (n *MemNetwork) Isolate(id uint64, ids ...uint64) {
	for _, o := range ids {
		if o != id {
			n.Cut(id, o)
		}
	}
}

// Heal removes every cut.
func (n *MemNetwork) Heal() {
	n.mu.Lock()
	n.cut = map[[2]uint64]bool{}
	n.mu.Unlock()
}

// SetDrop makes the network drop each batch with probability p.
func (n *MemNetwork) SetDrop(p float64) {
	n.mu.Lock()
	n.drop = p
	n.mu.Unlock()
}

// SetDelay delays every batch by d.
func (n *MemNetwork) SetDelay(d time.Duration) {
	n.mu.Lock()
	n.delay = d
	n.mu.Unlock()
}

// Sent returns the number of batches host id has sent.
func (n *MemNetwork) Sent(id uint64) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sent[id]
}

// Messages returns the number of messages host id has sent: messages
// of groups, and host heartbeats (group 0).
func (n *MemNetwork) Messages(id uint64) (groups, hosts int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.msgs[id]
	return m[0], m[1]
}

// Send implements [Transport].
func (t *MemTransport) Send(to uint64, batch []Envelope) {
	n := t.net
	n.mu.Lock()
	n.sent[t.id]++
	m := n.msgs[t.id]
	for _, e := range batch {
		if e.Group == hostGroup {
			m[1]++
		} else {
			m[0]++
		}
	}
	n.msgs[t.id] = m
	dst := n.hosts[to]
	lost := n.hosts[t.id] != t || dst == nil || n.cut[[2]uint64{t.id, to}] || (n.drop > 0 && rand.Float64() < n.drop)
	delay := n.delay
	n.mu.Unlock()
	if lost {
		return
	}
	cp := make([]Envelope, len(batch))
	for i, e := range batch {
		cp[i] = Envelope{Group: e.Group, Msg: proto.Clone(e.Msg).(*pb.Message)}
	}
	select {
	case dst.in <- memBatch{at: time.Now().Add(delay), batch: cp}:
	default: // the receiver is behind: lost, as on a full socket
	}
}

// Listen implements [Transport].
func (t *MemTransport) Listen(recv func([]Envelope)) {
	t.mu.Lock()
	t.recv = recv
	t.mu.Unlock()
}

// Close stops delivering to this transport.
func (t *MemTransport) Close() { t.once.Do(func() { close(t.stop) }) }

func (t *MemTransport) run() {
	for {
		select {
		case <-t.stop:
			return
		case b := <-t.in:
			if d := time.Until(b.at); d > 0 {
				select {
				case <-time.After(d):
				case <-t.stop:
					return
				}
			}
			t.mu.Lock()
			recv := t.recv
			t.mu.Unlock()
			if recv != nil {
				recv(b.batch)
			}
		}
	}
}
