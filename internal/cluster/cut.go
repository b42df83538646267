package cluster

// Cut takes node's links down, as a failed link does: the handler is told
// PeerDown, and the dialer redials. The broker cuts a link whose outbox
// was full rather than lose a frame silently.
func (f *Fabric) Cut(node, why string) {
	f.mu.Lock()
	p := f.peers[node]
	f.mu.Unlock()
	if p != nil {
		f.teardown(p, 0, cutOther, why)
	}
}
