package behaviour

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/wire"
)

// testEdges covers combinations the feature tests leave out: questions
// from several handlers of one broadcast, sticky keys coming back to a
// restarted handler, single responses marked Last, async requests that
// find no handler, and subscriptions that wait on a controller while the
// controller or the exchange goes away.
func (s *suite) testEdges(t *testing.T) {
	t.Run("AskBroadcast", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp()
		for range 3 {
			e.handle(ex.Name(), func(r *courier.Request) {
				me := r.Attachment().ID()
				a, err := r.Ask(r.Context(), []byte(me))
				if err != nil {
					r.Fail(err)
					return
				}
				r.Reply(a)
			})
		}
		onAsk := courier.OnAsk(func(_ context.Context, q []byte) ([]byte, error) {
			return []byte("answer for " + string(q)), nil
		})
		resps, err := ex.RequestAll(e.ctx, courier.Message{}, onAsk)
		if err != nil || len(resps) != 3 {
			t.Fatalf("RequestAll: %d responses, %v", len(resps), err)
		}
		for _, r := range resps {
			if r.Err != nil || string(r.Body) != "answer for "+r.From {
				t.Fatalf("response from %s: %q, %v: the answer went to another handler", r.From, r.Body, r.Err)
			}
		}
	})
	t.Run("StickyRestart", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.Sticky)
		tags := []string{"a", "b", "c"}
		hs := map[string]*courier.Attachment{}
		for _, tag := range tags {
			hs[tag] = e.handle(ex.Name(), whoami, courier.ConnTag(tag))
		}
		keys := make([]string, 300)
		for i := range keys {
			keys[i] = fmt.Sprintf("k%d", i)
		}
		byKey := func(k string) courier.Message { return courier.Message{Key: k} }
		before := e.owners(ex, keys, byKey)
		if err := hs["b"].Detach(e.ctx); err != nil {
			t.Fatal(err)
		}
		old := hs["b"].ID()
		hs["b"] = e.handle(ex.Name(), whoami, courier.ConnTag("b"))
		after := e.owners(ex, keys, byKey)
		for _, k := range keys {
			want := before[k]
			if want == old {
				want = hs["b"].ID()
			}
			if after[k] != want {
				t.Fatalf("key %s went to %s, want %s: a restarted handler with the same tag gets its keys back", k, after[k], want)
			}
		}
	})
	t.Run("SingleResponseIsLast", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RoundRobin)
		e.handlers(ex.Name(), 2)
		resps, err := ex.RequestAll(e.ctx, courier.Message{})
		if err != nil || len(resps) != 1 || !resps[0].Last {
			t.Fatalf("RequestAll on round-robin: %d responses, %v", len(resps), err)
		}
		r, err := ex.Request(e.ctx, courier.Message{})
		if err != nil || !r.Last {
			t.Fatalf("Request: Last=%v, %v", r != nil && r.Last, err)
		}
	})
	t.Run("GoNoHandler", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RoundRobin)
		out := make(chan *courier.Response, 1)
		if err := ex.Go(e.ctx, courier.Message{}, "lonely", out); err != nil {
			t.Fatal(err)
		}
		r := testutil.Recv(t, out, wait)
		if r.Tag != "lonely" || !r.Last {
			t.Fatalf("response %+v: want tag lonely, Last", r)
		}
		mustErr(t, r.Err, courier.ErrNoHandler, "Go with no handler")
	})
	t.Run("ControllerLeavesUndecided", func(t *testing.T) {
		e := s.env(t)
		ps := e.pubsub(courier.Controlled())
		asked := make(chan struct{}, 1)
		release := make(chan struct{})
		first, err := e.openPubSub(ps.Name()).Control(e.ctx, func(*courier.SubscriptionRequest) courier.Decision {
			asked <- struct{}{}
			<-release
			return courier.Refuse("too late")
		})
		if err != nil {
			t.Fatal(err)
		}
		defer close(release)
		if _, err := e.openPubSub(ps.Name()).Control(e.ctx, func(*courier.SubscriptionRequest) courier.Decision {
			return courier.Narrow("x.only")
		}); err != nil {
			t.Fatal(err)
		}
		type result struct {
			a   *courier.Attachment
			err error
		}
		done := make(chan result, 1)
		sub := e.openPubSub(ps.Name())
		go func() {
			a, err := sub.Subscribe(e.ctx, "x.#", nil)
			done <- result{a, err}
		}()
		testutil.Recv(t, asked, wait)
		// The leader leaves without deciding: the next controller decides.
		if err := first.Detach(e.ctx); err != nil {
			t.Fatal(err)
		}
		res := testutil.Recv(t, done, wait)
		if res.err != nil {
			t.Fatalf("subscription handed to the next controller: %v", res.err)
		}
		if got := res.a.Patterns(); len(got) != 1 || got[0] != "x.only" {
			t.Fatalf("patterns %q, want the second controller's narrowing", got)
		}
	})
	t.Run("DeletedWhilePending", func(t *testing.T) {
		e := s.env(t)
		ps := e.pubsub(courier.Controlled())
		asked := make(chan struct{}, 1)
		release := make(chan struct{})
		defer close(release)
		if _, err := e.openPubSub(ps.Name()).Control(e.ctx, func(*courier.SubscriptionRequest) courier.Decision {
			asked <- struct{}{}
			<-release
			return courier.Accept()
		}); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		sub := e.openPubSub(ps.Name())
		go func() {
			_, err := sub.Subscribe(e.ctx, "x.#", nil)
			done <- err
		}()
		testutil.Recv(t, asked, wait)
		if err := e.c.DeleteExchange(e.ctx, ps.Name()); err != nil {
			t.Fatal(err)
		}
		err := testutil.Recv(t, done, wait)
		var we *wire.Error
		if !errors.As(err, &we) || we.Code != wire.CodeExchangeDeleted {
			t.Fatalf("pending subscription on a deleted exchange: %v, want code %v", err, wire.CodeExchangeDeleted)
		}
	})
	t.Run("HeadersRoundTrip", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RoundRobin)
		seen := make(chan map[string]string, 1)
		e.handle(ex.Name(), func(r *courier.Request) {
			seen <- maps.Clone(r.Header())
			r.Reply(r.Body())
		})
		h := map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x": ""}
		r, err := ex.Request(e.ctx, courier.Message{Header: h, Body: []byte("payload")})
		if err != nil || string(r.Body) != "payload" {
			t.Fatalf("echo: %v, %q", err, r.Body)
		}
		if got := testutil.Recv(t, seen, wait); got["traceparent"] != h["traceparent"] {
			t.Fatalf("handler saw headers %v, want %v", got, h)
		}
	})
}
