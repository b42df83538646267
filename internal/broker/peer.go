package broker

import (
	"sync"

	"github.com/courier-mq/courier/wire"
)

// A cluster's nodes reach each other's brokers over node links. To a
// broker, another node is a peer: a session of its own, opened when the
// link comes up and closed when it goes down, whose sink leads over the
// link. Stand-ins of the peer's members (its handlers, its aggregated
// subscription interest) are attachments of that session, so routing
// treats them as any attachment; requests the peer's requesters route
// here are requests of that session, so responses, asks and cancels find
// their way back as they do for a client. What a peer sends that a client
// cannot (interest, views, forwarded requests) comes as node-link frames
// (wire.Type.Link) to [Broker.FromPeer].

// Peers carries frames to the brokers of other nodes. Both methods take
// ownership of f, keep the order of the frames sent to one node, and
// never block for long: a link that cannot take more is cut (and
// [Broker.PeerDown] follows), and what was sent to a node whose link is
// down is dropped with an error.
type Peers interface {
	// Send sends f on the data link to node: publications, requests,
	// responses.
	Send(node string, f *wire.Frame) error
	// SendControl sends f on the control link to node: interest, views,
	// membership; never queued behind data.
	SendControl(node string, f *wire.Frame) error
}

// peer is another node of the cluster, seen from this broker.
type peer struct {
	node string
	s    *Session // its session, whose sink is peerSink
}

// peerSink delivers a peer session's frames over the data link.
type peerSink struct {
	b    *Broker
	node string
}

func (k peerSink) Deliver(f *wire.Frame) {
	p := k.b.peerLinks.Load()
	if p == nil {
		f.Release()
		return
	}
	// An error means the link is down: PeerDown follows and closes the
	// session, which fails what waited for this frame.
	_ = (*p).Send(k.node, f)
}

// peerTable holds the broker's peers by node name.
type peerTable struct {
	mu    sync.RWMutex
	nodes map[string]*peer
}

// SetPeers gives the broker the links to other nodes. Call it before the
// first [Broker.PeerUp].
func (b *Broker) SetPeers(p Peers) { b.peerLinks.Store(&p) }

// PeerUp tells the broker that node's links are up: it opens the node's
// session. A peer already up is left as it is.
func (b *Broker) PeerUp(node string) {
	b.peers.mu.Lock()
	if b.peers.nodes == nil {
		b.peers.nodes = make(map[string]*peer)
	}
	if b.peers.nodes[node] != nil {
		b.peers.mu.Unlock()
		return
	}
	p := &peer{node: node}
	p.s = b.open(peerSink{b, node}, "node "+node)
	p.s.peer = p
	b.peers.nodes[node] = p
	b.peers.mu.Unlock()
	b.register(p.s)
	b.log.Info("peer up", "node", node)
	b.peerUp(p)
}

// PeerDown tells the broker that node is gone or its links are down: the
// node's session closes, so its members' stand-ins leave their exchanges
// (requests pending on them fail at once with "handler gone") and
// requests its requesters made here are cancelled at their handlers.
func (b *Broker) PeerDown(node string) {
	b.peers.mu.Lock()
	p := b.peers.nodes[node]
	delete(b.peers.nodes, node)
	b.peers.mu.Unlock()
	if p == nil {
		return
	}
	b.peerDown(p)
	p.s.Close()
	b.log.Info("peer down", "node", node)
}

// PeerNodes returns the names of the nodes whose links are up.
func (b *Broker) PeerNodes() []string {
	b.peers.mu.RLock()
	defer b.peers.mu.RUnlock()
	names := make([]string, 0, len(b.peers.nodes))
	for n := range b.peers.nodes {
		names = append(names, n)
	}
	return names
}

// peer returns the peer named node, or nil.
func (b *Broker) peer(node string) *peer {
	b.peers.mu.RLock()
	defer b.peers.mu.RUnlock()
	return b.peers.nodes[node]
}

// FromPeer handles one frame from node's links and takes ownership of it.
// Node-link frames go to the part of the broker they are for; the rest
// (RESPONSE, ASK, ANSWER, CANCEL of forwarded requests) are the peer
// session's, as a client's would be. A frame from a node that is not up
// is dropped.
func (b *Broker) FromPeer(node string, f *wire.Frame) {
	p := b.peer(node)
	if p == nil {
		f.Release()
		return
	}
	switch f.Type {
	case wire.TypeRSub, wire.TypeRUnsub, wire.TypeRPub, wire.TypeRSubAck,
		wire.TypeRSubReq, wire.TypeRDecide, wire.TypeRCtrl, wire.TypeRMember:
		b.peerPubSub(p, f)
	case wire.TypeRView, wire.TypeRAttach, wire.TypeRDetach, wire.TypeRReq, wire.TypeRViewAck:
		b.peerRequest(p, f)
	case wire.TypeResponse, wire.TypeAsk, wire.TypeAnswer, wire.TypeCancel:
		p.s.Handle(f)
	case wire.TypeSubmit, wire.TypeWatch:
		// A SUBMIT or WATCH forwarded to this node, its queue's leader
		// (forward.go, forward_watch.go): the peer session's, answered
		// on the link.
		p.s.Handle(f)
	case wire.TypeTaskEvent:
		// An event of a watch this node forwarded to node.
		b.forwardEvent(node, f)
	case wire.TypeOK, wire.TypeError:
		b.forwardAnswer(node, f)
	case wire.TypeAttach, wire.TypeDetach, wire.TypeAck, wire.TypeNack, wire.TypeProgress:
		// A worker forwarded to this node, its queue's leader
		// (forward_worker.go).
		b.fromWorkerNode(p, f)
	case wire.TypeTask, wire.TypeEvent:
		// To a worker this node forwarded to node.
		b.fromLeader(node, f)
	default:
		b.log.Warn("unexpected frame from a peer node", "node", node, "type", f.Type)
		f.Release()
	}
}
