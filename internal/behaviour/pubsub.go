package behaviour

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
)

// fence is a routing key subscribers add to their patterns: once it
// arrives, everything published before it by the same publisher has
// arrived too, so a message still missing was not delivered.
const fence = "fence"

func (s *suite) testPubSub(t *testing.T) {
	t.Run("Patterns", s.testPatterns)
	t.Run("OverlappingPatterns", func(t *testing.T) {
		e := s.env(t)
		ps := e.pubsub()
		var c collector
		sub, err := e.openPubSub(ps.Name()).Subscribe(e.ctx, "a.*", c.fn, courier.Patterns("a.#", "#.b", "#", fence))
		if err != nil {
			t.Fatal(err)
		}
		if got := sub.Patterns(); !slices.Equal(got, []string{"a.*", "a.#", "#.b", "#", fence}) {
			t.Fatalf("patterns %q", got)
		}
		for i := range 3 {
			ps.Publish(e.ctx, "a.b", []byte(strconv.Itoa(i)))
		}
		ps.Publish(e.ctx, fence, nil)
		c.waitKey(t, fence)
		if got := c.keys(fence); !slices.Equal(got, []string{"a.b", "a.b", "a.b"}) {
			t.Fatalf("received %q: want each of 3 messages once", got)
		}
		for i, d := range c.all()[:3] {
			if string(d.Body) != strconv.Itoa(i) {
				t.Fatalf("message %d has body %q", i, d.Body)
			}
		}
	})
	t.Run("Order", func(t *testing.T) {
		e := s.env(t)
		ps := e.pubsub()
		const n = 10000
		var c collector
		if _, err := e.openPubSub(ps.Name()).Subscribe(e.ctx, "order.#", c.fn); err != nil {
			t.Fatal(err)
		}
		pub := e.openPubSub(ps.Name())
		for i := range n {
			if err := pub.PublishMsg(e.ctx, courier.Message{Key: "order.x", Body: []byte(strconv.Itoa(i)), Header: map[string]string{"i": strconv.Itoa(i)}}); err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
		}
		testutil.WaitForf(t, 2*wait, func() bool { return c.len() >= n }, "%d messages delivered", n)
		msgs := c.all()
		if len(msgs) != n {
			t.Fatalf("%d messages delivered, want %d", len(msgs), n)
		}
		for i, d := range msgs {
			if string(d.Body) != strconv.Itoa(i) || d.Header["i"] != strconv.Itoa(i) {
				t.Fatalf("message %d is %q (header %q): out of publish order", i, d.Body, d.Header["i"])
			}
		}
	})
	t.Run("FanIn", func(t *testing.T) {
		e := s.env(t)
		ps := e.pubsub()
		const pubs, each = 4, 2000
		var c collector
		if _, err := ps.Subscribe(e.ctx, "in.*", c.fn); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, pubs)
		for p := range pubs {
			pub := e.openPubSub(ps.Name())
			wg.Go(func() {
				key := fmt.Sprintf("in.p%d", p)
				for i := range each {
					if err := pub.Publish(e.ctx, key, []byte(strconv.Itoa(i))); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		testutil.WaitForf(t, 2*wait, func() bool { return c.len() >= pubs*each }, "%d messages from %d publishers", pubs*each, pubs)
		next := map[string]int{}
		for _, d := range c.all() {
			if string(d.Body) != strconv.Itoa(next[d.Key]) {
				t.Fatalf("from %s: got %q, want %d (per-publisher order)", d.Key, d.Body, next[d.Key])
			}
			next[d.Key]++
		}
		for p := range pubs {
			if k := fmt.Sprintf("in.p%d", p); next[k] != each {
				t.Fatalf("%d messages from %s, want %d", next[k], k, each)
			}
		}
	})
	t.Run("Unsubscribe", func(t *testing.T) {
		e := s.env(t)
		ps := e.pubsub()
		var c collector
		sub, err := e.openPubSub(ps.Name()).Subscribe(e.ctx, "news.*", c.fn, courier.Patterns(fence))
		if err != nil {
			t.Fatal(err)
		}
		ps.Publish(e.ctx, "news.1", nil)
		c.waitKey(t, "news.1")
		if err := sub.Unsubscribe(e.ctx, "news.*"); err != nil {
			t.Fatal(err)
		}
		if got := sub.Patterns(); !slices.Equal(got, []string{fence}) {
			t.Fatalf("patterns after unsubscribe %q", got)
		}
		ps.Publish(e.ctx, "news.2", nil)
		ps.Publish(e.ctx, fence, nil)
		c.waitKey(t, fence)
		if c.has("news.2") {
			t.Fatal("message delivered after unsubscribe")
		}
		// Subscribing again works, and Detach stops everything.
		if err := sub.Subscribe(e.ctx, "news.*"); err != nil {
			t.Fatal(err)
		}
		ps.Publish(e.ctx, "news.3", nil)
		c.waitKey(t, "news.3")
		var other collector
		if _, err := e.openPubSub(ps.Name()).Subscribe(e.ctx, "news.*", other.fn, courier.Patterns(fence)); err != nil {
			t.Fatal(err)
		}
		if err := sub.Detach(e.ctx); err != nil {
			t.Fatal(err)
		}
		n := c.len()
		ps.Publish(e.ctx, "news.4", nil)
		ps.Publish(e.ctx, fence, nil)
		testutil.WaitFor(t, wait, func() bool { return other.has("news.4") && other.len() == 2 })
		if c.len() != n {
			t.Fatalf("a detached subscriber got %v", c.all()[n:])
		}
	})
	t.Run("PublishToReqResp", func(t *testing.T) {
		e := s.env(t)
		name := e.name()
		ps, err := e.c.PubSub(e.ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		// Replace the exchange by a request-response one of the same name.
		if err := e.c.DeleteExchange(e.ctx, name); err != nil {
			t.Fatal(err)
		}
		err = ps.PublishSync(e.ctx, courier.Message{Key: "k"})
		mustErr(t, err, courier.ErrNotFound, "publish to a deleted exchange")
		if _, err := e.c.ReqResp(e.ctx, name); err != nil {
			t.Fatal(err)
		}
		e.deleteLater(name)
		err = ps.PublishSync(e.ctx, courier.Message{Key: "k"})
		mustErr(t, err, courier.ErrNotAllowed, "publish to a request-response exchange")

		// Publishing is not a request-response operation either way round.
		rr := e.reqresp()
		_, err = e.c.PubSub(e.ctx, rr.Name())
		mustErr(t, err, courier.ErrClash, "open a request-response exchange as pub-sub")
		live := e.pubsub()
		if err := live.PublishSync(e.ctx, courier.Message{Key: "nobody.listens"}); err != nil {
			t.Fatalf("PublishSync with no subscriber: %v", err)
		}
	})
	t.Run("EmptyWordPatterns", func(t *testing.T) {
		// Keys may have empty words; patterns may not (protocol.md §7):
		// '#' matches the empty key and '*' an empty word. (Subscribe's
		// own pattern "" means none; Patterns("") sends it.)
		e := s.env(t)
		ps := e.openPubSub(e.pubsub().Name())
		for _, p := range []string{"", "a..b", ".a", "a.", "."} {
			_, err := ps.Subscribe(e.ctx, "x", func(*courier.Delivery) {}, courier.Patterns(p))
			mustErr(t, err, courier.ErrBadOptions, fmt.Sprintf("subscribe to %q", p))
		}
	})
	t.Run("PublishAsync", func(t *testing.T) {
		// Pipelined confirms: each callback called once, with nil for a
		// message routed to a live and a durable subscriber, which then
		// holds it; with the error for a publish the broker refuses.
		e := s.env(t)
		ps := e.pubsub()
		var live collector
		if _, err := e.openPubSub(ps.Name()).Subscribe(e.ctx, "k.#", live.fn); err != nil {
			t.Fatal(err)
		}
		durable := e.openPubSub(ps.Name())
		a, err := durable.Subscribe(e.ctx, "k.#", func(*courier.Delivery) {}, courier.Durable("async"))
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Detach(e.ctx); err != nil {
			t.Fatal(err)
		}
		defer e.c.DeleteQueue(e.ctx, ps.Name()+"/async")
		const n = 200
		confirms := make(chan error, n+1)
		for i := range n {
			if err := ps.PublishAsync(e.ctx, courier.Message{Key: "k." + strconv.Itoa(i)}, func(err error) { confirms <- err }); err != nil {
				t.Fatal(err)
			}
		}
		for i := range n {
			if err := testutil.Recv(t, confirms, wait); err != nil {
				t.Fatalf("confirm %d: %v", i, err)
			}
		}
		testutil.WaitFor(t, wait, func() bool { return live.len() == n })
		var stored sync.Map
		var count atomic.Int64
		if _, err := durable.Subscribe(e.ctx, "", func(d *courier.Delivery) {
			if _, dup := stored.LoadOrStore(d.Key, true); !dup {
				count.Add(1)
			}
		}, courier.Durable("async")); err != nil {
			t.Fatal(err)
		}
		testutil.WaitForf(t, wait, func() bool { return count.Load() == n }, "the %d confirmed messages from the durable subscription", n)

		name := e.name()
		gone, err := e.c.PubSub(e.ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.c.DeleteExchange(e.ctx, name); err != nil {
			t.Fatal(err)
		}
		if err := gone.PublishAsync(e.ctx, courier.Message{Key: "k"}, func(err error) { confirms <- err }); err != nil {
			t.Fatal(err)
		}
		mustErr(t, testutil.Recv(t, confirms, wait), courier.ErrNotFound, "PublishAsync to a deleted exchange")
		select {
		case err := <-confirms:
			t.Fatalf("a confirm came twice: %v", err)
		default:
		}
	})
	t.Run("Passive", func(t *testing.T) {
		e := s.env(t)
		_, err := e.c.PubSub(e.ctx, e.name(), courier.Passive())
		mustErr(t, err, courier.ErrNotFound, "passive open of an unknown pub-sub exchange")
		_, err = e.c.ReqResp(e.ctx, e.name(), courier.Passive())
		mustErr(t, err, courier.ErrNotFound, "passive open of an unknown request-response exchange")
		ps := e.pubsub()
		if _, err := e.c.PubSub(e.ctx, ps.Name(), courier.Passive()); err != nil {
			t.Fatalf("passive open of an existing exchange: %v", err)
		}
	})
}

func (s *suite) testPatterns(t *testing.T) {
	cases := []struct {
		pattern string
		match   []string
		miss    []string
	}{
		{"a.b.c", []string{"a.b.c"}, []string{"a.b", "a.b.c.d", "a.b.x", "x.b.c"}},
		{"a.*.c", []string{"a.x.c", "a.b.c"}, []string{"a.c", "a.x.y.c", "a.x.d"}},
		{"*", []string{"a", "b"}, []string{"a.b"}},
		{"*.*", []string{"a.b"}, []string{"a", "a.b.c"}},
		{"a.#", []string{"a", "a.b", "a.b.c"}, []string{"b", "b.a", "ab"}},
		{"#", []string{"a", "a.b", "x.y.z"}, nil},
		{"a.#.c", []string{"a.c", "a.b.c", "a.b.d.c", "a.c.c"}, []string{"a.b.d", "a.c.d", "b.c", "a"}},
		{"#.c", []string{"c", "a.c", "a.b.c"}, []string{"c.a", "a.b"}},
		{"a.*.#", []string{"a.b", "a.b.c", "a.b.c.d"}, []string{"a", "b.c"}},
		{"#.b.#", []string{"b", "a.b", "b.c", "a.b.c"}, []string{"a", "a.c"}},
		{"*.#.*", []string{"a.b", "a.b.c"}, []string{"a"}},
		// Keys split into words as in RabbitMQ: the empty key is zero
		// words; each '.' separates two words, empty ones included, and
		// '*' matches an empty word.
		{"*", nil, []string{"", ".", "a."}},
		{"#", []string{"", ".", "a..b", ".a", "a."}, nil},
		{"*.*", []string{".", "a.", ".a"}, []string{"", "..", "a"}},
		{"a.*.b", []string{"a..b"}, []string{"a.b", "a...b"}},
		{"a.b", nil, []string{"a..b", "a.b.", ".a.b"}},
		{"a.#", []string{"a", "a.", "a..b"}, []string{"", ".a"}},
		{"#.a", []string{"a", ".a"}, []string{"", "a."}},
	}
	for _, tc := range cases {
		t.Run(tc.pattern, func(t *testing.T) {
			e := s.env(t)
			ps := e.pubsub()
			var c collector
			if _, err := e.openPubSub(ps.Name()).Subscribe(e.ctx, tc.pattern, c.fn, courier.Patterns(fence)); err != nil {
				t.Fatal(err)
			}
			for _, k := range append(slices.Clone(tc.miss), tc.match...) {
				if err := ps.Publish(e.ctx, k, nil); err != nil {
					t.Fatal(err)
				}
			}
			ps.Publish(e.ctx, fence, nil)
			c.waitKey(t, fence)
			if got := c.keys(fence); !slices.Equal(got, tc.match) {
				t.Fatalf("pattern %q received %q, want %q", tc.pattern, got, tc.match)
			}
		})
	}
}

func (s *suite) testInverted(t *testing.T) {
	t.Run("Decide", func(t *testing.T) {
		e := s.env(t)
		ps := e.pubsub(courier.Controlled())
		var mu sync.Mutex
		var asked []courier.SubscriptionRequest
		ctl, err := e.openPubSub(ps.Name()).Control(e.ctx, func(req *courier.SubscriptionRequest) courier.Decision {
			mu.Lock()
			asked = append(asked, *req)
			mu.Unlock()
			for _, p := range req.Patterns {
				if strings.HasPrefix(p, "secret.") {
					return courier.Refuse("not cleared for " + p)
				}
				if p == "all.#" {
					return courier.Narrow("all.public.#")
				}
			}
			return courier.Accept()
		})
		if err != nil {
			t.Fatal(err)
		}
		testutil.WaitForf(t, wait, ctl.IsLeader, "the only controller leads")

		// Accepted as asked.
		var ok collector
		okSub, err := e.openPubSub(ps.Name()).Subscribe(e.ctx, "news.*", ok.fn, courier.ConnTag("reader"))
		if err != nil {
			t.Fatalf("accepted subscription: %v", err)
		}
		if got := okSub.Patterns(); !slices.Equal(got, []string{"news.*"}) {
			t.Fatalf("accepted patterns %q", got)
		}
		mu.Lock()
		if len(asked) != 1 || asked[0].Member.ID != okSub.ID() || asked[0].Member.ConnTag != "reader" || !slices.Equal(asked[0].Patterns, []string{"news.*"}) {
			t.Fatalf("the controller was asked %+v", asked)
		}
		mu.Unlock()

		// Refused, with the controller's reason.
		var no collector
		_, err = e.openPubSub(ps.Name()).Subscribe(e.ctx, "secret.plans", no.fn)
		mustErr(t, err, courier.ErrRejected, "refused subscription")
		if !strings.Contains(err.Error(), "not cleared for secret.plans") {
			t.Fatalf("refusal %q lacks the controller's reason", err)
		}
		// An attached subscriber asking for more goes through the controller too.
		err = okSub.Subscribe(e.ctx, "secret.more")
		mustErr(t, err, courier.ErrRejected, "refused extra subscription")
		if got := okSub.Patterns(); !slices.Equal(got, []string{"news.*"}) {
			t.Fatalf("patterns after a refused subscribe %q", got)
		}
		if err := okSub.Subscribe(e.ctx, "sport.*"); err != nil {
			t.Fatalf("accepted extra subscription: %v", err)
		}

		// Narrowed.
		var narrow collector
		nSub, err := e.openPubSub(ps.Name()).Subscribe(e.ctx, "all.#", narrow.fn)
		if err != nil {
			t.Fatalf("narrowed subscription: %v", err)
		}
		if got := nSub.Patterns(); !slices.Equal(got, []string{"all.public.#"}) {
			t.Fatalf("narrowed patterns %q, want [all.public.#]", got)
		}
		for _, k := range []string{"all.private.x", "all.public.x", "news.1", "sport.1", "secret.plans", "all.public.fence"} {
			ps.Publish(e.ctx, k, nil)
		}
		narrow.waitKey(t, "all.public.fence")
		if got := narrow.keys(""); !slices.Equal(got, []string{"all.public.x", "all.public.fence"}) {
			t.Fatalf("narrowed subscriber received %q", got)
		}
		ok.waitKey(t, "sport.1")
		if got := ok.keys(""); !slices.Equal(got, []string{"news.1", "sport.1"}) {
			t.Fatalf("accepted subscriber received %q", got)
		}
		if no.len() != 0 {
			t.Fatalf("refused subscriber received %d messages", no.len())
		}
	})
	t.Run("OnBehalf", func(t *testing.T) {
		e := s.env(t)
		ps := e.pubsub(courier.Controlled())
		ctl, err := e.openPubSub(ps.Name()).Control(e.ctx, func(*courier.SubscriptionRequest) courier.Decision {
			return courier.Refuse("only the controller subscribes")
		})
		if err != nil {
			t.Fatal(err)
		}
		var c collector
		var ev events
		sub, err := e.openPubSub(ps.Name()).Subscribe(e.ctx, "", c.fn, courier.OnEvent(ev.fn))
		if err != nil {
			t.Fatalf("attach without patterns: %v", err)
		}
		if len(sub.Patterns()) != 0 {
			t.Fatalf("patterns %q before the controller acted", sub.Patterns())
		}
		if err := ctl.SubscribeMember(e.ctx, sub.ID(), "orders.*", fence); err != nil {
			t.Fatal(err)
		}
		ev.waitFor(t, "subscriptions orders.*", func(x courier.Event) bool {
			return x.Kind == courier.EventSubscriptions && slices.Equal(x.Patterns, []string{"orders.*", fence})
		})
		if got := sub.Patterns(); !slices.Equal(got, []string{"orders.*", fence}) {
			t.Fatalf("Patterns() %q after the event", got)
		}
		ps.Publish(e.ctx, "orders.1", nil)
		c.waitKey(t, "orders.1")

		if err := ctl.UnsubscribeMember(e.ctx, sub.ID(), "orders.*"); err != nil {
			t.Fatal(err)
		}
		ev.waitFor(t, "subscriptions without orders.*", func(x courier.Event) bool {
			return x.Kind == courier.EventSubscriptions && slices.Equal(x.Patterns, []string{fence})
		})
		ps.Publish(e.ctx, "orders.2", nil)
		ps.Publish(e.ctx, fence, nil)
		c.waitKey(t, fence)
		if c.has("orders.2") {
			t.Fatal("delivered after the controller unsubscribed it")
		}

		// Only a controller subscribes others; a subscriber cannot.
		other, err := e.openPubSub(ps.Name()).Subscribe(e.ctx, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		err = other.SubscribeMember(e.ctx, sub.ID(), "orders.*")
		mustErr(t, err, courier.ErrNotAllowed, "a subscriber subscribing another")
		err = ctl.SubscribeMember(e.ctx, "nowhere/c999999.1", "orders.*")
		mustErr(t, err, courier.ErrNotFound, "subscribing an unknown member")
	})
	t.Run("NoController", func(t *testing.T) {
		e := s.env(t)
		ps := e.pubsub(courier.Controlled())
		_, err := e.openPubSub(ps.Name()).Subscribe(e.ctx, "x.*", nil)
		mustErr(t, err, courier.ErrRejected, "subscription with no controller")

		ctl, err := e.openPubSub(ps.Name()).Control(e.ctx, nil) // nil: accept all
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.openPubSub(ps.Name()).Subscribe(e.ctx, "x.*", nil); err != nil {
			t.Fatalf("subscription with a controller: %v", err)
		}
		if err := ctl.Detach(e.ctx); err != nil {
			t.Fatal(err)
		}
		_, err = e.openPubSub(ps.Name()).Subscribe(e.ctx, "x.*", nil)
		mustErr(t, err, courier.ErrRejected, "subscription after the controller left")

		// Controllers need a controlled exchange.
		plain := e.pubsub()
		_, err = e.openPubSub(plain.Name()).Control(e.ctx, nil)
		mustErr(t, err, courier.ErrNotAllowed, "controller on an uncontrolled exchange")
	})
	t.Run("ControllerHandover", func(t *testing.T) {
		e := s.env(t)
		ps := e.pubsub(courier.Controlled())
		first, err := e.openPubSub(ps.Name()).Control(e.ctx, func(*courier.SubscriptionRequest) courier.Decision {
			return courier.Refuse("first says no")
		})
		if err != nil {
			t.Fatal(err)
		}
		second, err := e.openPubSub(ps.Name()).Control(e.ctx, func(*courier.SubscriptionRequest) courier.Decision {
			return courier.Accept()
		})
		if err != nil {
			t.Fatal(err)
		}
		// The leader among controllers decides.
		_, err = e.openPubSub(ps.Name()).Subscribe(e.ctx, "x", nil)
		mustErr(t, err, courier.ErrRejected, "subscription decided by the first controller")
		if err := first.Detach(e.ctx); err != nil {
			t.Fatal(err)
		}
		testutil.WaitForf(t, wait, second.IsLeader, "the second controller leads")
		ctx, cancel := context.WithTimeout(e.ctx, wait)
		defer cancel()
		if _, err := e.openPubSub(ps.Name()).Subscribe(ctx, "x", nil); err != nil {
			t.Fatalf("subscription decided by the second controller: %v", err)
		}
	})
}
