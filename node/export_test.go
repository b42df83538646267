package node

import (
	"net"

	"github.com/courier-mq/courier/internal/store"
)

// Bridge to internals for the tests of package node_test.

// ClientListener returns the client listener being served, or nil.
func (n *Node) ClientListener() net.Listener {
	ln, _ := n.clientLn.Load().(net.Listener)
	return ln
}

// TuneStore makes a node started with cfg adjust its store's options.
func TuneStore(cfg *Config, fn func(*store.Options)) { cfg.tuneStore = fn }
