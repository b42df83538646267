package server_test

import (
	"slices"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

// TestPatternLimits: a SUBSCRIBE or ATTACH that would take an attachment
// or a connection past its limit of patterns fails as a whole with code
// 26, whether the subscriber asks for itself, through a controller, or
// a controller subscribes it; the connection stays, and the patterns it
// had keep delivering.
func TestPatternLimits(t *testing.T) {
	n := startNodeWith(t, func(c *node.Config) {
		c.Limits.MaxPatternsPerAttachment = 3
		c.Limits.MaxPatternsPerConnection = 5
	})
	ctx := testutil.Context(t, 20*time.Second)
	c := dial(t, n, client.Options{Name: "greedy"})
	ps, err := c.PubSub(ctx, "px")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 64)
	onMsg := func(d *courier.Delivery) { got <- d.Key }

	// Per attachment.
	a1, err := ps.Subscribe(ctx, "a.1", onMsg, courier.Patterns("a.2"))
	if err != nil {
		t.Fatal(err)
	}
	mustCode(t, a1.Subscribe(ctx, "a.3", "a.4"), wire.CodeTooManyPatterns)
	if p := a1.Patterns(); !slices.Equal(p, []string{"a.1", "a.2"}) {
		t.Fatalf("patterns after the refused SUBSCRIBE: %v", p)
	}
	if err := a1.Subscribe(ctx, "a.1", "a.3", "a.3"); err != nil {
		t.Fatalf("a pattern already held and a repeated one count once: %v", err)
	}
	_, err = ps.Subscribe(ctx, "b.1", onMsg, courier.Patterns("b.2", "b.3", "b.4"))
	mustCode(t, err, wire.CodeTooManyPatterns)

	// Per connection: 3 + 2 = 5.
	a2, err := ps.Subscribe(ctx, "b.1", onMsg, courier.Patterns("b.2"))
	if err != nil {
		t.Fatal(err)
	}
	mustCode(t, a2.Subscribe(ctx, "b.3"), wire.CodeTooManyPatterns)
	_, err = ps.Subscribe(ctx, "c.1", onMsg)
	mustCode(t, err, wire.CodeTooManyPatterns)
	idle, err := ps.Subscribe(ctx, "", onMsg) // no pattern: room for none is enough
	if err != nil {
		t.Fatal(err)
	}

	// A controller subscribing a member of this connection, and a
	// subscriber of another connection asking its controller.
	ctl := dial(t, n, client.Options{Name: "controller"})
	cx, err := ctl.PubSub(ctx, "cx", courier.Controlled())
	if err != nil {
		t.Fatal(err)
	}
	asked := make(chan []string, 8)
	ctrl, err := cx.Control(ctx, func(r *courier.SubscriptionRequest) courier.Decision {
		asked <- r.Patterns
		return courier.Accept()
	})
	if err != nil {
		t.Fatal(err)
	}
	member, err := c.PubSub(ctx, "cx")
	if err != nil {
		t.Fatal(err)
	}
	target, err := member.Subscribe(ctx, "", onMsg)
	if err != nil {
		t.Fatal(err)
	}
	mustCode(t, ctrl.SubscribeMember(ctx, target.ID(), "x.1"), wire.CodeTooManyPatterns)
	other := dial(t, n, client.Options{Name: "other"})
	ocx, err := other.PubSub(ctx, "cx")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := ocx.Subscribe(ctx, "", onMsg)
	if err != nil {
		t.Fatal(err)
	}
	mustCode(t, ctrl.SubscribeMember(ctx, sub.ID(), "y.1", "y.2", "y.3", "y.4"), wire.CodeTooManyPatterns)
	mustCode(t, sub.Subscribe(ctx, "y.1", "y.2", "y.3", "y.4"), wire.CodeTooManyPatterns)
	select {
	case p := <-asked:
		t.Fatalf("the controller was asked for %v, past the limit", p)
	default:
	}
	if err := sub.Subscribe(ctx, "y.1", "y.2", "y.3"); err != nil {
		t.Fatalf("a subscription within the limit: %v", err)
	}
	testutil.Recv(t, asked, 10*time.Second)

	// Nothing accepted was lost, and the connection serves on.
	pub, err := dial(t, n, client.Options{}).PubSub(ctx, "px")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"b.3", "c.1", "a.4", "a.1", "a.3", "b.2"} {
		if err := pub.PublishSync(ctx, courier.Message{Key: k}); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"a.1", "a.3", "b.2"} {
		if k := testutil.Recv(t, got, 10*time.Second); k != want {
			t.Fatalf("delivered %q, want %q", k, want)
		}
	}
	if conns := n.Broker().SessionCount(); conns != 4 {
		t.Fatalf("%d connections, want 4: one was closed", conns)
	}

	// Room freed by an UNSUBSCRIBE or a DETACH is taken again.
	if err := a2.Unsubscribe(ctx, "b.1"); err != nil {
		t.Fatal(err)
	}
	if err := idle.Subscribe(ctx, "b.3"); err != nil {
		t.Fatalf("subscribe after an unsubscribe: %v", err)
	}
	if err := a1.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ctrl.SubscribeMember(ctx, target.ID(), "x.1", "x.2", "x.3"); err != nil {
		t.Fatalf("subscribe on behalf after a detach: %v", err)
	}

	// Once the connection is gone, so are its patterns: only those of
	// the other connection's subscriber stay.
	c.Close()
	testutil.WaitForf(t, 10*time.Second, func() bool { return n.Broker().PatternStats().Patterns == 3 },
		"the closed connection's patterns still count")
}
