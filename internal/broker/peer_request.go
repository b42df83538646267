package broker

import "github.com/courier-mq/courier/wire"

// Request-response across nodes: views from each exchange's home node,
// requests routed at the entry node (docs/cluster.md).

// peerRequest handles a request-response node-link frame from p.
func (b *Broker) peerRequest(p *peer, f *wire.Frame) {
	b.log.Warn("request-response across nodes is not built yet", "node", p.node, "type", f.Type)
	f.Release()
}
