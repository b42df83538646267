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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
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
	var conns []*courier.Conn
	for i := range subs {
		n := nodes[1+i%2]
		c, err := client.Dial(ctx, n.URL(), client.Options{NoReconnect: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
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
	// Wait while deliveries keep coming: under -race on a loaded machine
	// 60,000 of them take minutes at times, which is no fault; none for
	// 30 s is one.
	last, progress := got.Load(), time.Now()
	for n := last; n < subs*msgs && time.Since(progress) < 30*time.Second && ctx.Err() == nil; n = got.Load() {
		if n != last {
			last, progress = n, time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := got.Load(); n != subs*msgs {
		ended := 0
		for _, c := range conns {
			select {
			case <-c.Done():
				if ended++; ended == 1 {
					t.Errorf("a subscriber's connection ended: %v", c.Err())
				}
			default:
			}
		}
		t.Errorf("delivered %d of %d (none for the last %v; %d subscribers' connections ended)", n, subs*msgs, time.Since(progress).Round(time.Second), ended)
	}
	for _, s := range nodes[0].Broker().PeerPubSubStats() {
		if s.PubsSent != msgs {
			t.Errorf("a sent %d RPUBs to %s, want one per publication (%d)", s.PubsSent, s.Node, msgs)
		}
	}
}
