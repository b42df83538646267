package node

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
)

// TestClusterFanOutTCP: 200 subscribers over TCP on two nodes, 300
// publications from a third, all delivered, each crossing each link
// once.
func TestClusterFanOutTCP(t *testing.T) {
	nodes := startCluster3(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	pub0, err := client.Dial(ctx, nodes[0].URL(), client.Options{NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := pub0.PubSub(ctx, "fan")
	if err != nil {
		t.Fatal(err)
	}
	const subs, msgs = 200, 300
	var got atomic.Int64
	for i := range subs {
		n := nodes[1+i%2]
		c, err := client.Dial(ctx, n.URL(), client.Options{NoReconnect: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		sp, err := c.PubSub(ctx, "fan")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sp.Subscribe(ctx, "k.*", func(d *courier.Delivery) { got.Add(1) }); err != nil {
			t.Fatal(err)
		}
	}
	for i := range msgs {
		if err := ps.Publish(ctx, fmt.Sprintf("k.%d", i), make([]byte, 128)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for got.Load() < subs*msgs && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if n := got.Load(); n != subs*msgs {
		t.Errorf("delivered %d of %d", n, subs*msgs)
	}
	for _, s := range nodes[0].Broker().PeerPubSubStats() {
		if s.PubsSent != msgs {
			t.Errorf("a sent %d RPUBs to %s, want one per publication (%d)", s.PubsSent, s.Node, msgs)
		}
	}
}
