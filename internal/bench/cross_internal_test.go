package bench

import (
	"context"
	"testing"
	"time"
)

// With EmbeddedCross the requests cross a node link: the requesters'
// node sends at least one data frame to the handlers' node per request,
// beyond its heartbeats (counted on the control link, which carries the
// same ones).
func TestEmbeddedCrossUsesTheLink(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := Config{EmbeddedCross: true}.withDefaults("reqresp")
	if err := cfg.validateNodes(); err != nil {
		t.Fatal(err)
	}
	d, err := newCourierDriver(ctx, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	if d.nodeB == nil || d.node.Name() == d.nodeB.Name() {
		t.Fatal("one node, not two")
	}
	if err := d.serve(ctx, 1, []byte("pong")); err != nil {
		t.Fatal(err)
	}
	r, err := d.requester(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := awaitHandler(ctx, r, []byte("ping"), readyWait); err != nil {
		t.Fatal(err)
	}
	sent := func() (data, control uint64) {
		for _, m := range d.node.Fabric().Members() {
			if m.Name == d.nodeB.Name() {
				return m.Link.Data.FramesOut, m.Link.Control.FramesOut
			}
		}
		t.Fatalf("%s does not list %s", d.node.Name(), d.nodeB.Name())
		return 0, 0
	}
	data0, control0 := sent()
	const n = 200
	for range n {
		if err := r.request(ctx, []byte("ping")); err != nil {
			t.Fatal(err)
		}
	}
	data1, control1 := sent()
	// The data link carries the requests and its own heartbeats (a few
	// in this window, not always as many as the control link's).
	if data1-data0 < n {
		t.Errorf("%d requests sent %d data frames to the handlers' node (the control link %d): they did not cross", n, data1-data0, control1-control0)
	}
}

// EmbeddedCross runs in this process only.
func TestEmbeddedCrossNeedsEmbedded(t *testing.T) {
	cfg := Config{EmbeddedCross: true, Target: Target{Kind: KindCourier, URL: "courier://127.0.0.1:7400"}}
	if err := cfg.validateNodes(); err == nil {
		t.Error("EmbeddedCross against a server accepted")
	}
}
