package node

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/behaviour"
)

// TestClusterBehaviour runs the behaviour suite against a cluster of
// three embedded nodes: each connection the suite asks for goes to the
// next node, so every subtest has its requesters, handlers, publishers,
// subscribers and controllers spread over the three.
func TestClusterBehaviour(t *testing.T) {
	if testing.Short() {
		t.Skip("three nodes and the whole suite")
	}
	nodes := startCluster3(t)
	var next atomic.Uint64
	behaviour.RunCluster(t, func(t *testing.T) *courier.Conn {
		n := nodes[next.Add(1)%uint64(len(nodes))]
		c := n.Connect()
		t.Cleanup(func() { c.Close() })
		return c
	})
}

// TestClusterBehaviourTCP is TestClusterBehaviour with network clients:
// each connection the suite asks for is a client.Dial to the next node.
func TestClusterBehaviourTCP(t *testing.T) {
	if testing.Short() {
		t.Skip("three nodes and the whole suite")
	}
	nodes := startCluster3(t)
	var next atomic.Uint64
	behaviour.RunCluster(t, func(t *testing.T) *courier.Conn {
		n := nodes[next.Add(1)%uint64(len(nodes))]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := client.Dial(ctx, n.URL(), client.Options{NoReconnect: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	})
}
