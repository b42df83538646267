package broker

// peerUp runs once p's session is open: each part of the broker tells
// the new peer what it must know (interest, views).
func (b *Broker) peerUp(p *peer) {
	b.pubsubPeerUp(p)
	b.rrPeerUp(p)
}

// peerDown runs when p goes, before its session closes.
func (b *Broker) peerDown(p *peer) {
	b.pubsubPeerDown(p)
	b.rrPeerDown(p)
	b.forwardedWorkersDown(p.node)
	b.forwardPeerDown(p.node)
}
