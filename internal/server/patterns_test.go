package server_test

import (
	"fmt"
	"io"
	"log/slog"
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
	// Two attachments receive them: each in order, but the two streams
	// may interleave either way.
	var delivered []string
	for range 3 {
		delivered = append(delivered, testutil.Recv(t, got, 10*time.Second))
	}
	slices.Sort(delivered)
	if want := []string{"a.1", "a.3", "b.2"}; !slices.Equal(delivered, want) {
		t.Fatalf("delivered %q, want %q", delivered, want)
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

// TestDurableSubscribe: SUBSCRIBE and UNSUBSCRIBE on a durable subscriber
// change its subscription's binding, durably: a message that matches a
// pattern added so comes through the queue, kept while no one is
// attached, and after a restart the binding is as the last of them left
// it. A closed durable subscriber leaves nothing behind in the topic
// tree: however often a client attaches, subscribes 100 patterns and
// goes, the node holds the binding's patterns and no more.
func TestDurableSubscribe(t *testing.T) {
	dir := t.TempDir()
	cfg := node.Config{DataDir: dir, Listen: "127.0.0.1:0", Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { n.Close() }()
	ctx := testutil.Context(t, 30*time.Second)
	got := make(chan string, 256)
	onMsg := func(d *courier.Delivery) { got <- d.Key }
	var extra []string
	for i := range 100 {
		extra = append(extra, fmt.Sprintf("p.%d.#", i))
	}
	want := append([]string{"x"}, extra...)
	pub, err := dial(t, n, client.Options{}).PubSub(ctx, "dx")
	if err != nil {
		t.Fatal(err)
	}
	var bytes int64
	for round := range 4 {
		c := dial(t, n, client.Options{Name: "durable"})
		ps, err := c.PubSub(ctx, "dx")
		if err != nil {
			t.Fatal(err)
		}
		sub, err := ps.Subscribe(ctx, "x", onMsg, courier.Durable("d"))
		if err != nil {
			t.Fatal(err)
		}
		if err := sub.Subscribe(ctx, extra...); err != nil {
			t.Fatal(err)
		}
		if p := sub.Patterns(); !slices.Equal(p, want) {
			t.Fatalf("round %d: patterns after SUBSCRIBE: %d, want %d", round, len(p), len(want))
		}
		st := n.Broker().PatternStats()
		if st.Patterns != int64(len(want)) {
			t.Fatalf("round %d: the node holds %d patterns, want the binding's %d", round, st.Patterns, len(want))
		}
		if round == 0 {
			bytes = st.Bytes
		} else if st.Bytes != bytes {
			t.Fatalf("round %d: patterns take %d bytes, %d in round 0", round, st.Bytes, bytes)
		}
		key := fmt.Sprintf("p.%d.k", round)
		if err := pub.PublishSync(ctx, courier.Message{Key: key}); err != nil {
			t.Fatal(err)
		}
		// At least once: a message of an earlier round whose ack the
		// close overtook comes again first (seen under load).
		for k := testutil.Recv(t, got, 10*time.Second); k != key; k = testutil.Recv(t, got, 10*time.Second) {
			var r int
			if _, err := fmt.Sscanf(k, "p.%d.k", &r); err != nil || r >= round {
				t.Fatalf("round %d: delivered %q, want %q", round, k, key)
			}
		}
		c.Close()
		testutil.WaitForf(t, 10*time.Second, func() bool { return n.Broker().SessionCount() == 1 }, "the connection is still open")
		if st := n.Broker().PatternStats(); st.Patterns != int64(len(want)) || st.Bytes != bytes {
			t.Fatalf("round %d: after the close the node holds %+v, want the binding's %d patterns, %d bytes", round, st, len(want), bytes)
		}
	}

	// Kept while detached, and the binding shrinks with UNSUBSCRIBE.
	if err := pub.PublishSync(ctx, courier.Message{Key: "p.7.kept"}); err != nil {
		t.Fatal(err)
	}
	c := dial(t, n, client.Options{})
	ps, err := c.PubSub(ctx, "dx")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := ps.Subscribe(ctx, "", onMsg, courier.Durable("d"))
	if err != nil {
		t.Fatal(err)
	}
	// At least once here too: the last round's message, whose ack the
	// close overtook, may come again first.
	for k := testutil.Recv(t, got, 10*time.Second); k != "p.7.kept"; k = testutil.Recv(t, got, 10*time.Second) {
		var r int
		if _, err := fmt.Sscanf(k, "p.%d.k", &r); err != nil {
			t.Fatalf("delivered %q, want the message kept while detached", k)
		}
	}
	if err := sub.Unsubscribe(ctx, extra[1:]...); err != nil {
		t.Fatal(err)
	}
	want = want[:2]
	if p := sub.Patterns(); !slices.Equal(p, want) {
		t.Fatalf("patterns after UNSUBSCRIBE: %v, want %v", p, want)
	}
	if st := n.Broker().PatternStats(); st.Patterns != 2 {
		t.Fatalf("the node holds %d patterns after UNSUBSCRIBE, want 2", st.Patterns)
	}
	c.Close()

	// The binding survives a restart as the UNSUBSCRIBE left it.
	n.Close()
	cfg.Listen = "127.0.0.1:0"
	if n, err = node.Start(cfg); err != nil {
		t.Fatal(err)
	}
	ps, err = dial(t, n, client.Options{}).PubSub(ctx, "dx")
	if err != nil {
		t.Fatal(err)
	}
	sub, err = ps.Subscribe(ctx, "", onMsg, courier.Durable("d"))
	if err != nil {
		t.Fatal(err)
	}
	if p := sub.Patterns(); !slices.Equal(p, want) {
		t.Fatalf("patterns after a restart: %v, want %v", p, want)
	}
}

// TestDurableSubscriptionLimits: a durable subscriber counts its
// subscription's patterns against its connection while it is attached;
// an ATTACH refused for the connection's limits (attachments, patterns)
// creates no durable subscription; and the node holds at most
// limits.max_durable_subscriptions of them: one more is refused with
// code 14 until one is deleted.
func TestDurableSubscriptionLimits(t *testing.T) {
	n := startNodeWith(t, func(c *node.Config) {
		c.Limits.MaxAttachments = 2
		c.Limits.MaxPatternsPerAttachment = 3
		c.Limits.MaxPatternsPerConnection = 5
		c.Limits.MaxDurableSubscriptions = 2
	})
	ctx := testutil.Context(t, 20*time.Second)
	c := dial(t, n, client.Options{Name: "reader"})
	ps, err := c.PubSub(ctx, "px")
	if err != nil {
		t.Fatal(err)
	}
	onMsg := func(*courier.Delivery) {}
	noQueue := func(name string) {
		t.Helper()
		if n.Broker().Queue("px/"+name) != nil {
			t.Fatalf("the refused ATTACH created durable subscription %q", name)
		}
	}

	// Past the attachment limit.
	p1, err := ps.Subscribe(ctx, "a.1", onMsg, courier.Patterns("a.2", "a.3"))
	if err != nil {
		t.Fatal(err)
	}
	p2, err := ps.Subscribe(ctx, "", onMsg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ps.Subscribe(ctx, "x.1", onMsg, courier.Durable("d0"))
	mustCode(t, err, wire.CodeTooManyAttachments)
	noQueue("d0")

	// Past the connection's pattern limit: 3 + 3 > 5.
	if err := p2.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = ps.Subscribe(ctx, "x.1", onMsg, courier.Durable("d1"), courier.Patterns("x.2", "x.3"))
	mustCode(t, err, wire.CodeTooManyPatterns)
	noQueue("d1")

	// Attached, a durable subscriber's patterns count for its connection.
	if err := p1.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	d1, err := ps.Subscribe(ctx, "x.1", onMsg, courier.Durable("d1"), courier.Patterns("x.2", "x.3"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = ps.Subscribe(ctx, "b.1", onMsg, courier.Patterns("b.2", "b.3"))
	mustCode(t, err, wire.CodeTooManyPatterns)
	b2, err := ps.Subscribe(ctx, "b.1", onMsg, courier.Patterns("b.2"))
	if err != nil {
		t.Fatal(err)
	}
	mustCode(t, d1.Subscribe(ctx, "x.4"), wire.CodeTooManyPatterns) // the attachment's 3
	if err := b2.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d1.Unsubscribe(ctx, "x.3"); err != nil {
		t.Fatal(err)
	}
	b3, err := ps.Subscribe(ctx, "b.1", onMsg, courier.Patterns("b.2", "b.3"))
	if err != nil {
		t.Fatalf("room freed by an UNSUBSCRIBE of a durable subscriber: %v", err)
	}
	mustCode(t, d1.Subscribe(ctx, "x.3"), wire.CodeTooManyPatterns) // the connection's 5
	if err := b3.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d1.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	full, err := ps.Subscribe(ctx, "c.1", onMsg, courier.Patterns("c.2", "c.3"))
	if err != nil {
		t.Fatalf("the detached durable subscriber still counts: %v", err)
	}
	if err := full.Detach(ctx); err != nil {
		t.Fatal(err)
	}

	// At most 2 durable subscriptions on the node.
	d2, err := ps.Subscribe(ctx, "y.1", onMsg, courier.Durable("d2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := d2.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = ps.Subscribe(ctx, "z.1", onMsg, courier.Durable("d3"))
	mustCode(t, err, wire.CodeLimit)
	noQueue("d3")
	if _, err := ps.Subscribe(ctx, "", onMsg, courier.Durable("d1")); err != nil {
		t.Fatalf("attaching to an existing durable subscription at the limit: %v", err)
	}
	if err := c.DeleteQueue(ctx, "px/d2"); err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Subscribe(ctx, "z.1", onMsg, courier.Durable("d3")); err != nil {
		t.Fatalf("a durable subscription once one was deleted: %v", err)
	}
}
