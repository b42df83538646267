package behaviour

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
)

// testTags covers service, request and connection tags.
func (s *suite) testTags(t *testing.T) {
	t.Run("Service", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RoundRobin)
		eu := e.handlers(ex.Name(), 2, courier.ServiceTag("eu"))
		tags := make(chan string, 16)
		us := e.handle(ex.Name(), func(r *courier.Request) {
			tags <- r.ServiceTag()
			whoami(r)
		}, courier.ServiceTag("us"))
		plain := e.handlers(ex.Name(), 1)

		got := e.counts(ex, 10, courier.Message{ServiceTag: "eu"})
		if got[eu[0].ID()] != 5 || got[eu[1].ID()] != 5 {
			t.Fatalf("requests tagged eu went to %v, want 5 each for %v", got, ids(eu...))
		}
		if id := e.ask(ex, courier.Message{ServiceTag: "us"}); id != us.ID() {
			t.Fatalf("request tagged us answered by %s, want %s", id, us.ID())
		}
		if tag := testutil.Recv(t, tags, wait); tag != "us" {
			t.Fatalf("handler saw service tag %q, want us", tag)
		}
		_, err := ex.Request(e.ctx, courier.Message{ServiceTag: "mars"})
		mustErr(t, err, courier.ErrNoHandler, "request with an unknown service tag")

		// Untagged requests go to every handler in turn.
		got = e.counts(ex, 8, courier.Message{})
		for _, id := range append(ids(eu...), us.ID(), plain[0].ID()) {
			if got[id] != 2 {
				t.Fatalf("untagged requests went to %v, want 2 each", got)
			}
		}
	})
	t.Run("Request", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp() // broadcast: two responses per request
		e.handlers(ex.Name(), 2)
		out := make(chan *courier.Response, 8)
		for _, tag := range []string{"t1", "t2", "t3"} {
			if err := ex.Go(e.ctx, courier.Message{}, tag, out); err != nil {
				t.Fatal(err)
			}
		}
		count, last := map[string]int{}, map[string]int{}
		for range 6 {
			r := testutil.Recv(t, out, wait)
			if r.Err != nil {
				t.Fatalf("response tagged %q: %v", r.Tag, r.Err)
			}
			count[r.Tag]++
			if r.Last {
				if count[r.Tag] != 2 {
					t.Fatalf("response %d of request %q is marked Last", count[r.Tag], r.Tag)
				}
				last[r.Tag]++
			}
		}
		for _, tag := range []string{"t1", "t2", "t3"} {
			if count[tag] != 2 || last[tag] != 1 {
				t.Fatalf("request %q: %d responses, %d marked Last; want 2 and 1", tag, count[tag], last[tag])
			}
		}
	})
	t.Run("Conn", func(t *testing.T) {
		e := s.env(t)
		ps := e.pubsub()
		c := e.conn()
		sub, err := c.PubSub(e.ctx, ps.Name())
		if err != nil {
			t.Fatal(err)
		}
		var left, right collector
		la, err := sub.Subscribe(e.ctx, "l.*", left.fn, courier.ConnTag("left"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sub.Subscribe(e.ctx, "r.*", right.fn, courier.ConnTag("right")); err != nil {
			t.Fatal(err)
		}
		if la.ConnTag() != "left" {
			t.Fatalf("ConnTag() = %q, want left", la.ConnTag())
		}
		for _, k := range []string{"l.1", "r.1", "l.2"} {
			if err := ps.Publish(e.ctx, k, nil); err != nil {
				t.Fatal(err)
			}
		}
		testutil.WaitFor(t, wait, func() bool { return left.len() == 2 && right.len() == 1 })
		for _, d := range left.all() {
			if d.ConnTag != "left" || d.Exchange != ps.Name() {
				t.Fatalf("delivery %q via %q/%q, want left/%s", d.Key, d.ConnTag, d.Exchange, ps.Name())
			}
		}
		if d := right.all()[0]; d.ConnTag != "right" {
			t.Fatalf("delivery %q via %q, want right", d.Key, d.ConnTag)
		}

		// Events say which of two handlers of one connection they are for.
		rr := e.reqresp(courier.RoundRobin)
		hc := e.conn()
		hx, err := hc.ReqResp(e.ctx, rr.Name())
		if err != nil {
			t.Fatal(err)
		}
		var evA, evB events
		a, err := hx.Handle(e.ctx, whoami, courier.ConnTag("a"), courier.OnEvent(evA.fn))
		if err != nil {
			t.Fatal(err)
		}
		b, err := hx.Handle(e.ctx, whoami, courier.ConnTag("b"), courier.OnEvent(evB.fn))
		if err != nil {
			t.Fatal(err)
		}
		evA.waitFor(t, "member-up of b at a", func(ev courier.Event) bool {
			return ev.Kind == courier.EventMemberUp && ev.Member != nil && ev.Member.ID == b.ID()
		})
		evB.waitFor(t, "leader at b", func(ev courier.Event) bool { return ev.Kind == courier.EventLeader })
		for _, ev := range evA.all() {
			if ev.ConnTag != "a" {
				t.Fatalf("event %s at a carries ConnTag %q", ev.Kind, ev.ConnTag)
			}
		}
		for _, ev := range evB.all() {
			if ev.ConnTag != "b" {
				t.Fatalf("event %s at b carries ConnTag %q", ev.Kind, ev.ConnTag)
			}
		}
		// Members carry their connection tags too.
		ms := a.Members()
		if len(ms) != 2 || ms[0].ID != a.ID() || ms[0].ConnTag != "a" || ms[1].ConnTag != "b" {
			t.Fatalf("members %+v, want a then b with their tags", ms)
		}
	})
}

// testNoHandler checks that a request nobody can take fails at once with
// ErrNoHandler, whatever the strategy.
func (s *suite) testNoHandler(t *testing.T) {
	strategies := []struct {
		name string
		opt  courier.ExchangeOption
	}{
		{"broadcast", courier.Broadcast},
		{"round-robin", courier.RoundRobin},
		{"leader", courier.Leader},
		{"leader-round-robin", courier.LeaderRoundRobin},
		{"sticky", courier.Sticky},
		{"sticky-fun", courier.KeyExpr(`key`)},
		{"fun", courier.RouteExpr(`null`)},
		{"least-busy", courier.LeastBusy},
	}
	for _, st := range strategies {
		t.Run(st.name, func(t *testing.T) {
			e := s.env(t)
			ex := e.reqresp(st.opt)
			// A long deadline: only an immediate "no handler" passes, since
			// a timeout would give another error kind.
			ctx, cancel := context.WithTimeout(e.ctx, time.Hour)
			defer cancel()
			_, err := ex.Request(ctx, courier.Message{Key: "k"})
			mustErr(t, err, courier.ErrNoHandler, "Request with no handler")
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, courier.ErrTimeout) {
				t.Fatalf("no handler reported as a timeout: %v", err)
			}
			_, err = ex.RequestAll(ctx, courier.Message{Key: "k"})
			mustErr(t, err, courier.ErrNoHandler, "RequestAll with no handler")
			st, err := ex.RequestStream(ctx, courier.Message{Key: "k"})
			if err != nil {
				t.Fatal(err)
			}
			if st.Next() {
				t.Fatal("stream with no handler gave a chunk")
			}
			mustErr(t, st.Err(), courier.ErrNoHandler, "RequestStream with no handler")

			// A handler comes and goes: "no handler" again.
			h := e.handle(ex.Name(), whoami)
			if _, err := ex.Request(ctx, courier.Message{Key: "k"}); err != nil {
				t.Fatalf("request with a handler: %v", err)
			}
			if err := h.Detach(ctx); err != nil {
				t.Fatal(err)
			}
			_, err = ex.Request(ctx, courier.Message{Key: "k"})
			mustErr(t, err, courier.ErrNoHandler, "Request after the handler left")
		})
	}
}

func (s *suite) testDeadlines(t *testing.T) {
	t.Run("HandlerSeesDeadline", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RoundRobin)
		type dl struct {
			at time.Time
			ok bool
		}
		seen := make(chan dl, 1)
		e.handle(ex.Name(), func(r *courier.Request) {
			d, ok := r.Deadline()
			seen <- dl{d, ok}
			r.Reply(nil)
		})
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		defer cancel()
		want, _ := ctx.Deadline()
		if _, err := ex.Request(ctx, courier.Message{}); err != nil {
			t.Fatal(err)
		}
		got := testutil.Recv(t, seen, wait)
		if !got.ok {
			t.Fatal("the handler sees no deadline")
		}
		// The deadline travels as time left, so it may move by the transit
		// time, never beyond the requester's.
		if got.at.After(want.Add(time.Second)) || got.at.Before(want.Add(-10*time.Second)) {
			t.Fatalf("the handler sees deadline %v, the requester set %v", got.at, want)
		}

		if _, err := ex.Request(context.WithoutCancel(e.ctx), courier.Message{}); err != nil {
			t.Fatal(err)
		}
		if got := testutil.Recv(t, seen, wait); got.ok {
			t.Fatalf("a request without deadline shows deadline %v", got.at)
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RoundRobin)
		held := make(chan *courier.Request, 1)
		e.handle(ex.Name(), func(r *courier.Request) { held <- r }) // never answers
		ctx, cancel := context.WithTimeout(e.ctx, 200*time.Millisecond)
		defer cancel()
		_, err := ex.Request(ctx, courier.Message{})
		mustErr(t, err, context.DeadlineExceeded, "request nobody answers")
		mustErr(t, err, courier.ErrTimeout, "request nobody answers")
		r := testutil.Recv(t, held, wait)
		testutil.Closed(t, r.Context().Done(), wait, "the handler's request context")
		// The broker forwarded the requester's CANCEL to the handler.
		testutil.WaitForf(t, wait, r.Cancelled, "the handler is told the requester gave up")
		if err := r.Reply([]byte("late")); err != nil && !errors.Is(err, courier.ErrResponded) {
			t.Fatalf("a late reply fails with %v", err)
		}
	})
	t.Run("Cancel", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RoundRobin)
		held := make(chan *courier.Request, 1)
		e.handle(ex.Name(), func(r *courier.Request) { held <- r })
		ctx, cancel := context.WithCancel(context.Background()) // no deadline
		defer cancel()
		errc := make(chan error, 1)
		go func() {
			_, err := ex.Request(ctx, courier.Message{})
			errc <- err
		}()
		r := testutil.Recv(t, held, wait)
		if _, ok := r.Deadline(); ok {
			t.Fatal("a request without deadline shows one")
		}
		hctx := r.Context()
		if hctx.Err() != nil {
			t.Fatal("the handler's context ended before the requester cancelled")
		}
		cancel()
		mustErr(t, testutil.Recv(t, errc, wait), context.Canceled, "cancelled request")
		testutil.Closed(t, hctx.Done(), wait, "the handler's request context")
		if !r.Cancelled() {
			t.Fatal("the handler's context ended but Cancelled() is false")
		}
	})
	t.Run("CancelWhileServing", func(t *testing.T) {
		// The handler waits inside its function, on the attachment's
		// goroutine (a request not yet parked): the CANCEL still reaches
		// it, and the attachment serves the next request afterwards.
		e := s.env(t)
		ex := e.reqresp(courier.RoundRobin)
		started, ended := make(chan struct{}, 1), make(chan bool, 1)
		e.handle(ex.Name(), func(r *courier.Request) {
			if string(r.Body()) == "again" {
				r.Reply([]byte("pong"))
				return
			}
			started <- struct{}{}
			<-r.Context().Done()
			ended <- r.Cancelled()
		})
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := ex.Request(ctx, courier.Message{Body: []byte("wait")})
			errc <- err
		}()
		testutil.Recv(t, started, wait)
		cancel()
		mustErr(t, testutil.Recv(t, errc, wait), context.Canceled, "cancelled request")
		if !testutil.Recv(t, ended, wait) {
			t.Fatal("the handler's context ended but Cancelled() is false")
		}
		resp, err := ex.Request(e.ctx, courier.Message{Body: []byte("again")})
		if err != nil || string(resp.Body) != "pong" {
			t.Fatalf("next request: %v %v", resp, err)
		}
	})
	t.Run("RequesterGone", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RoundRobin)
		held := make(chan *courier.Request, 1)
		e.handle(ex.Name(), func(r *courier.Request) { held <- r })
		rc := e.conn()
		rx, err := rc.ReqResp(e.ctx, ex.Name())
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 3)
		request := func() {
			_, err := rx.Request(e.ctx, courier.Message{})
			errc <- err
		}
		go request()
		r := testutil.Recv(t, held, wait)
		stream, err := rx.RequestStream(e.ctx, courier.Message{})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			stream.Next()
			errc <- stream.Err()
		}()
		rc.Close()
		testutil.Closed(t, r.Context().Done(), wait, "the handler's context after the requester's connection closed")
		// The requests waiting on the closed connection end at once,
		// with ErrClosed; so does one made after it closed.
		go request()
		for range 3 {
			mustErr(t, testutil.Recv(t, errc, wait), courier.ErrClosed, "request on a connection closed under it")
		}
	})
}

func (s *suite) testStream(t *testing.T) {
	t.Run("InOrder", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RoundRobin)
		h := e.handle(ex.Name(), func(r *courier.Request) {
			for i := range 100 {
				r.Chunk(fmt.Appendf(nil, "chunk-%d", i))
			}
			r.End()
		})
		for range 3 { // the exchange serves several streams in turn
			st, err := ex.RequestStream(e.ctx, courier.Message{})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for st.Next() {
				got = append(got, string(st.Chunk()))
			}
			if err := st.Err(); err != nil {
				t.Fatalf("stream ended with %v after %d chunks", err, len(got))
			}
			if len(got) != 100 {
				t.Fatalf("%d chunks, want 100", len(got))
			}
			for i, c := range got {
				if c != fmt.Sprintf("chunk-%d", i) {
					t.Fatalf("chunk %d is %q: out of order", i, c)
				}
			}
			if st.From() != h.ID() {
				t.Fatalf("stream from %q, want %s", st.From(), h.ID())
			}
			if st.Next() {
				t.Fatal("Next after the end gave a chunk")
			}
		}
	})
	t.Run("FailMidStream", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RoundRobin)
		e.handle(ex.Name(), func(r *courier.Request) {
			for i := range 3 {
				r.Chunk(fmt.Appendf(nil, "%d", i))
			}
			r.Fail(errors.New("disk on fire"))
		})
		st, err := ex.RequestStream(e.ctx, courier.Message{})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for st.Next() {
			n++
		}
		if n != 3 {
			t.Fatalf("%d chunks before the failure, want 3", n)
		}
		mustErr(t, st.Err(), courier.ErrApplication, "stream the handler failed")
		if !strings.Contains(st.Err().Error(), "disk on fire") {
			t.Fatalf("stream error %q lacks the handler's message", st.Err())
		}
	})
	t.Run("CloseCancels", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RoundRobin)
		ended := make(chan bool, 1)
		e.handle(ex.Name(), func(r *courier.Request) {
			ctx := r.Context()
			go func() {
				for i := 0; ; i++ {
					if r.Chunk(fmt.Appendf(nil, "%d", i)) != nil {
						break
					}
					if i == 0 {
						// One chunk out; wait to be told the requester left.
						select {
						case <-ctx.Done():
							ended <- r.Cancelled()
							return
						case <-time.After(wait):
							ended <- false
							return
						}
					}
				}
			}()
		})
		st, err := ex.RequestStream(e.ctx, courier.Message{})
		if err != nil {
			t.Fatal(err)
		}
		if !st.Next() {
			t.Fatalf("no first chunk: %v", st.Err())
		}
		st.Close()
		if !testutil.Recv(t, ended, wait+time.Second) {
			t.Fatal("the handler was not told the stream was closed")
		}
		if st.Next() {
			t.Fatal("Next after Close gave a chunk")
		}
	})
}

func (s *suite) testAsk(t *testing.T) {
	t.Run("Answered", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RoundRobin)
		e.handle(ex.Name(), func(r *courier.Request) {
			a1, err := r.Ask(r.Context(), []byte("confirm "+string(r.Body())+"?"))
			if err != nil {
				r.Fail(err)
				return
			}
			a2, err := r.Ask(r.Context(), []byte("amount?"))
			if err != nil {
				r.Fail(err)
				return
			}
			r.Reply([]byte(string(r.Body()) + ": " + string(a1) + ", " + string(a2)))
		})
		var questions []string
		onAsk := courier.OnAsk(func(ctx context.Context, q []byte) ([]byte, error) {
			questions = append(questions, string(q)) // asks come one at a time
			if string(q) == "amount?" {
				return []byte("42"), nil
			}
			return []byte("yes"), nil
		})
		r, err := ex.Request(e.ctx, courier.Message{Body: []byte("transfer")}, onAsk)
		if err != nil {
			t.Fatal(err)
		}
		if string(r.Body) != "transfer: yes, 42" {
			t.Fatalf("response %q, want the handler to use both answers", r.Body)
		}
		if !slices.Equal(questions, []string{"confirm transfer?", "amount?"}) {
			t.Fatalf("the requester was asked %q", questions)
		}
	})
	t.Run("WithoutOnAsk", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RoundRobin)
		askErr := make(chan error, 1)
		e.handle(ex.Name(), func(r *courier.Request) {
			_, err := r.Ask(r.Context(), []byte("anyone?"))
			askErr <- err
			r.Reply([]byte("carried on"))
		})
		r, err := ex.Request(e.ctx, courier.Message{})
		if err != nil {
			t.Fatal(err)
		}
		if err := testutil.Recv(t, askErr, wait); err == nil {
			t.Fatal("Ask succeeded although the requester takes no questions")
		}
		if string(r.Body) != "carried on" {
			t.Fatalf("response %q", r.Body)
		}
	})
	t.Run("AnswerError", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RoundRobin)
		askErr := make(chan error, 1)
		e.handle(ex.Name(), func(r *courier.Request) {
			_, err := r.Ask(r.Context(), []byte("pin?"))
			askErr <- err
			r.Fail(err)
		})
		_, err := ex.Request(e.ctx, courier.Message{}, courier.OnAsk(func(context.Context, []byte) ([]byte, error) {
			return nil, errors.New("forgot my pin")
		}))
		if err == nil {
			t.Fatal("request succeeded though the handler failed it")
		}
		aerr := testutil.Recv(t, askErr, wait)
		if aerr == nil || !strings.Contains(aerr.Error(), "forgot my pin") {
			t.Fatalf("handler's Ask error %v, want the requester's", aerr)
		}
	})
}

func (s *suite) testHandlerPanic(t *testing.T) {
	e := s.env(t)
	ex := e.reqresp(courier.RoundRobin)
	h := e.handle(ex.Name(), func(r *courier.Request) {
		if string(r.Body()) == "boom" {
			panic("boom")
		}
		r.Reply([]byte("fine"))
	})
	for i := range 3 {
		_, err := ex.Request(e.ctx, courier.Message{Body: []byte("boom")})
		mustErr(t, err, courier.ErrApplication, "request whose handler panicked")
		r, err := ex.Request(e.ctx, courier.Message{Body: []byte("ok")})
		if err != nil {
			t.Fatalf("request %d after a panic: %v", i, err)
		}
		if string(r.Body) != "fine" || r.From != h.ID() {
			t.Fatalf("response %q from %s", r.Body, r.From)
		}
	}
	select {
	case <-h.Done():
		t.Fatalf("the attachment ended after panics: %v", h.Err())
	default:
	}

	// The requester's OnAsk and a member's OnEvent are user code too: a
	// panic in either fails only what it was doing.
	ask := e.reqresp(courier.RoundRobin)
	events := make(chan struct{}, 16)
	e.handle(ask.Name(), func(r *courier.Request) {
		if _, err := r.Ask(r.Context(), []byte("sure?")); err != nil {
			r.Fail(err)
			return
		}
		r.Reply([]byte("asked"))
	}, courier.OnEvent(func(courier.Event) {
		events <- struct{}{}
		panic("event boom")
	}))
	testutil.Recv(t, events, wait)
	_, err := ask.Request(e.ctx, courier.Message{}, courier.OnAsk(func(context.Context, []byte) ([]byte, error) {
		panic("ask boom")
	}))
	if err == nil || !strings.Contains(err.Error(), "OnAsk function failed") {
		t.Fatalf("request whose OnAsk panicked: %v, want the handler's Ask to fail", err)
	}
	r, err := ask.Request(e.ctx, courier.Message{}, courier.OnAsk(func(context.Context, []byte) ([]byte, error) {
		return []byte("yes"), nil
	}))
	if err != nil || string(r.Body) != "asked" {
		t.Fatalf("request after the panics: %v %v", r, err)
	}
}

// testHandlerGone checks that a request whose handler goes away fails
// with ErrHandlerGone instead of waiting for its deadline.
func (s *suite) testHandlerGone(t *testing.T) {
	held := func(e *env, name string) (*courier.Conn, *courier.Attachment, chan *courier.Request) {
		c := e.conn()
		ex, err := c.ReqResp(e.ctx, name)
		if err != nil {
			e.t.Fatal(err)
		}
		ch := make(chan *courier.Request, 1)
		a, err := ex.Handle(e.ctx, func(r *courier.Request) { ch <- r })
		if err != nil {
			e.t.Fatal(err)
		}
		return c, a, ch
	}
	for _, how := range []string{"Detach", "ConnClose", "ExchangeDeleted"} {
		t.Run(how, func(t *testing.T) {
			e := s.env(t)
			ex := e.reqresp(courier.RoundRobin)
			c, a, ch := held(e, ex.Name())
			errc := make(chan error, 1)
			go func() {
				_, err := ex.Request(e.ctx, courier.Message{}) // deadline far off
				errc <- err
			}()
			testutil.Recv(t, ch, wait)
			switch how {
			case "Detach":
				if err := a.Detach(e.ctx); err != nil {
					t.Fatal(err)
				}
			case "ConnClose":
				c.Close()
			case "ExchangeDeleted":
				if err := e.c.DeleteExchange(e.ctx, ex.Name()); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case err := <-errc:
				mustErr(t, err, courier.ErrHandlerGone, "request whose handler left")
			case <-time.After(wait):
				t.Fatalf("the request still waits %v after its handler left (%s)", wait, how)
			}
		})
	}
	t.Run("Churn", func(t *testing.T) {
		// Handlers come and go while requests flow: every request ends,
		// answered or with ErrHandlerGone, none waits for its deadline.
		e := s.env(t)
		ex := e.reqresp(courier.RoundRobin)
		stay := e.handle(ex.Name(), whoami)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		var answered, gone atomic.Int64
		for range 8 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					ctx, cancel := context.WithTimeout(e.ctx, wait)
					_, err := ex.Request(ctx, courier.Message{})
					cancel()
					switch {
					case err == nil:
						answered.Add(1)
					case errors.Is(err, courier.ErrHandlerGone):
						gone.Add(1)
					default:
						errs <- err
						return
					}
				}
			})
		}
		for i := range 30 {
			c := e.conn()
			rx, err := c.ReqResp(e.ctx, ex.Name())
			if err != nil {
				t.Fatal(err)
			}
			a, err := rx.Handle(e.ctx, whoami)
			if err != nil {
				t.Fatal(err)
			}
			n := answered.Load()
			// A request that failed otherwise ends its goroutine: say
			// why at once, rather than wait for answers that stopped.
			testutil.WaitFor(t, wait, func() bool { return answered.Load() > n+10 || len(errs) > 0 })
			if len(errs) > 0 {
				t.Fatalf("request during churn, handler %d: %v", i, <-errs)
			}
			if i%2 == 0 {
				c.Close()
			} else if err := a.Detach(e.ctx); err != nil {
				t.Fatal(err)
			}
		}
		close(stop)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("request during churn: %v", err)
		}
		if stay.Err() != nil {
			t.Fatalf("the staying handler ended: %v", stay.Err())
		}
		t.Logf("%d answered, %d handler gone", answered.Load(), gone.Load())
	})
}
