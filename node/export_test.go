package node

import "net"

// Bridge to internals for the tests of package node_test.

// ClientListener returns the client listener being served, or nil.
func (n *Node) ClientListener() net.Listener {
	ln, _ := n.clientLn.Load().(net.Listener)
	return ln
}
