package broker

import "github.com/courier-mq/courier/wire"

// Pub-sub across nodes: the node is the mediator (docs/cluster.md).

// peerPubSub handles a pub-sub node-link frame from p.
func (b *Broker) peerPubSub(p *peer, f *wire.Frame) {
	b.log.Warn("pub-sub across nodes is not built yet", "node", p.node, "type", f.Type)
	f.Release()
}
