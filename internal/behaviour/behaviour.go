// Package behaviour is Courier's behaviour suite: black-box tests of the
// foundation (request-response with every strategy, tags, deadlines,
// chunked responses, questions to the requester, publish-subscribe,
// inverted publish-subscribe, leader selection and exchange errors),
// written against the public [courier.Conn] API only.
//
// The same suite runs against every way of reaching a broker: the
// embedded node (node/behaviour_test.go) and, through the network client,
// a server. A caller passes a function that returns a fresh connection to
// one broker:
//
//	func TestBehaviour(t *testing.T) {
//		n, _ := node.Start(node.Config{DataDir: t.TempDir()})
//		behaviour.Run(t, func(t *testing.T) *courier.Conn {
//			c := n.Connect()
//			t.Cleanup(func() { c.Close() })
//			return c
//		})
//	}
//
// Every subtest declares exchanges under a name unique to the run, and
// deletes them when it ends, so the suite can share a long-lived server.
// Nothing waits by sleeping: waits poll or receive with a deadline, and
// "not delivered" is proven by a fence message published after the one
// that must not arrive.
package behaviour

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
)

// wait bounds every wait for something that must happen. It is generous
// so that a loaded machine running -race does not fail the suite; a
// passing run never waits this long.
const wait = 15 * time.Second

// Run runs the behaviour suite. newConn must return a new connection to
// the same broker on every call, and register its cleanup with t.
func Run(t *testing.T, newConn func(t *testing.T) *courier.Conn) {
	run(t, newConn, nil)
}

// RunCluster runs the suite against a cluster: newConn should return
// connections to the nodes in turn, so that requesters, handlers,
// publishers, subscribers and controllers of one subtest are spread over
// the nodes. Task queues, which a cluster cannot have yet, are left out;
// subtests of Go routing functions, which a cluster refuses, skip
// themselves.
func RunCluster(t *testing.T, newConn func(t *testing.T) *courier.Conn) {
	run(t, newConn, []string{"Tasks"})
}

func run(t *testing.T, newConn func(t *testing.T) *courier.Conn, without []string) {
	s := &suite{newConn: newConn, run: strconv.FormatInt(time.Now().UnixNano(), 36)}
	for _, c := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"ReqResp", s.testReqResp},
		{"Tags", s.testTags},
		{"NoHandler", s.testNoHandler},
		{"Deadlines", s.testDeadlines},
		{"Stream", s.testStream},
		{"Ask", s.testAsk},
		{"HandlerPanic", s.testHandlerPanic},
		{"HandlerGone", s.testHandlerGone},
		{"PubSub", s.testPubSub},
		{"Inverted", s.testInverted},
		{"Leader", s.testLeader},
		{"Exchanges", s.testExchanges},
		{"Edges", s.testEdges},
		{"Tasks", s.testTasks},
	} {
		if !slices.Contains(without, c.name) {
			t.Run(c.name, c.fn)
		}
	}
}

// RunReqResp runs the suite's request-response parts alone (every
// strategy, no handler, deadlines, streams, questions, handler panics
// and departures, leaders), for brokers that share request-response
// across nodes but not yet pub-sub or task queues.
func RunReqResp(t *testing.T, newConn func(t *testing.T) *courier.Conn) {
	s := &suite{newConn: newConn, run: strconv.FormatInt(time.Now().UnixNano(), 36)}
	t.Run("ReqResp", s.testReqResp)
	t.Run("NoHandler", s.testNoHandler)
	t.Run("Deadlines", s.testDeadlines)
	t.Run("Stream", s.testStream)
	t.Run("Ask", s.testAsk)
	t.Run("HandlerPanic", s.testHandlerPanic)
	t.Run("HandlerGone", s.testHandlerGone)
	t.Run("Leader", s.testLeader)
}

// suite is the state of one Run.
type suite struct {
	newConn func(t *testing.T) *courier.Conn
	run     string // unique to this Run, part of every exchange name
	seq     atomic.Uint64
}

// env is what one subtest works with.
type env struct {
	s   *suite
	t   *testing.T
	ctx context.Context
	c   *courier.Conn // the subtest's own connection, for requests and admin
}

func (s *suite) env(t *testing.T) *env {
	t.Helper()
	return &env{s: s, t: t, ctx: testutil.Context(t, 2*wait), c: s.newConn(t)}
}

// conn returns another connection to the broker.
func (e *env) conn() *courier.Conn { return e.s.newConn(e.t) }

// name returns an exchange name not used before on the broker.
func (e *env) name() string {
	return fmt.Sprintf("bt.%s.%d", e.s.run, e.s.seq.Add(1))
}

// deleteLater deletes exchange name when the subtest ends.
func (e *env) deleteLater(name string) {
	c := e.c
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := c.DeleteExchange(ctx, name); err != nil && !errors.Is(err, courier.ErrNotFound) && c.Err() == nil {
			e.t.Errorf("delete exchange %s: %v", name, err)
		}
	})
}

// reqresp declares a new request-response exchange on e.c.
func (e *env) reqresp(opts ...courier.ExchangeOption) *courier.ReqResp {
	e.t.Helper()
	name := e.name()
	ex, err := e.c.ReqResp(e.ctx, name, opts...)
	if err != nil {
		e.t.Fatalf("declare request-response %s: %v", name, err)
	}
	e.deleteLater(name)
	return ex
}

// pubsub declares a new pub-sub exchange on e.c.
func (e *env) pubsub(opts ...courier.ExchangeOption) *courier.PubSub {
	e.t.Helper()
	name := e.name()
	ex, err := e.c.PubSub(e.ctx, name, opts...)
	if err != nil {
		e.t.Fatalf("declare pub-sub %s: %v", name, err)
	}
	e.deleteLater(name)
	return ex
}

// openReqResp opens the existing exchange name on a new connection.
func (e *env) openReqResp(name string) *courier.ReqResp {
	e.t.Helper()
	ex, err := e.conn().ReqResp(e.ctx, name)
	if err != nil {
		e.t.Fatalf("open request-response %s: %v", name, err)
	}
	return ex
}

// openPubSub opens the existing exchange name on a new connection.
func (e *env) openPubSub(name string) *courier.PubSub {
	e.t.Helper()
	ex, err := e.conn().PubSub(e.ctx, name)
	if err != nil {
		e.t.Fatalf("open pub-sub %s: %v", name, err)
	}
	return ex
}

// whoami answers every request with the member id of the handler.
func whoami(r *courier.Request) { r.Reply([]byte(r.Attachment().ID())) }

// handle attaches fn to exchange name on a new connection.
func (e *env) handle(name string, fn courier.HandlerFunc, opts ...courier.AttachOption) *courier.Attachment {
	e.t.Helper()
	a, err := e.openReqResp(name).Handle(e.ctx, fn, opts...)
	if err != nil {
		e.t.Fatalf("attach handler to %s: %v", name, err)
	}
	return a
}

// handlers attaches n whoami handlers to exchange name, each on a
// connection of its own, in order.
func (e *env) handlers(name string, n int, opts ...courier.AttachOption) []*courier.Attachment {
	e.t.Helper()
	hs := make([]*courier.Attachment, n)
	for i := range hs {
		hs[i] = e.handle(name, whoami, opts...)
	}
	return hs
}

// ask sends a request and returns the member id that answered, checking
// that the body names the same handler as Response.From.
func (e *env) ask(ex *courier.ReqResp, m courier.Message) string {
	e.t.Helper()
	r, err := ex.Request(e.ctx, m)
	if err != nil {
		e.t.Fatalf("request to %s: %v", ex.Name(), err)
	}
	if string(r.Body) != r.From {
		e.t.Fatalf("response body %q but From %q", r.Body, r.From)
	}
	return r.From
}

// counts sends n requests one after another and counts who answered.
func (e *env) counts(ex *courier.ReqResp, n int, m courier.Message) map[string]int {
	e.t.Helper()
	got := map[string]int{}
	for range n {
		got[e.ask(ex, m)]++
	}
	return got
}

// ids returns the member ids of attachments.
func ids(as ...*courier.Attachment) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.ID()
	}
	return out
}

// mustErr fails unless err matches target.
func mustErr(t *testing.T, err, target error, what string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want %v", what, target)
	}
	if !errors.Is(err, target) {
		t.Fatalf("%s: error %v, want one that Is %v", what, err, target)
	}
}

// collector gathers deliveries of a subscriber.
type collector struct {
	mu   sync.Mutex // guards msgs
	msgs []courier.Delivery
}

func (c *collector) fn(d *courier.Delivery) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, courier.Delivery{
		Message:  courier.Message{Key: d.Key, Body: slices.Clone(d.Body), Header: d.Header},
		Exchange: d.Exchange, ConnTag: d.ConnTag,
	})
}

func (c *collector) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

func (c *collector) all() []courier.Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.msgs)
}

// keys returns the routing keys received, in order, without fence.
func (c *collector) keys(fence string) []string {
	var out []string
	for _, d := range c.all() {
		if d.Key != fence {
			out = append(out, d.Key)
		}
	}
	return out
}

// has reports whether a message with key was received.
func (c *collector) has(key string) bool {
	return slices.ContainsFunc(c.all(), func(d courier.Delivery) bool { return d.Key == key })
}

// waitKey waits until a message with key was received.
func (c *collector) waitKey(t *testing.T, key string) {
	t.Helper()
	testutil.WaitForf(t, wait, func() bool { return c.has(key) }, "message %q delivered", key)
}

// events gathers membership events of an attachment.
type events struct {
	mu  sync.Mutex // guards evs
	evs []courier.Event
}

func (ev *events) fn(e courier.Event) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	ev.evs = append(ev.evs, e)
}

func (ev *events) all() []courier.Event {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return slices.Clone(ev.evs)
}

// waitFor waits for an event that satisfies match and returns the first.
func (ev *events) waitFor(t *testing.T, what string, match func(courier.Event) bool) courier.Event {
	t.Helper()
	var found courier.Event
	testutil.WaitForf(t, wait, func() bool {
		for _, e := range ev.all() {
			if match(e) {
				found = e
				return true
			}
		}
		return false
	}, "event: %s (have %s)", what, describe(ev.all()))
	return found
}

func describe(evs []courier.Event) string {
	s := "["
	for i, e := range evs {
		if i > 0 {
			s += ", "
		}
		s += e.Kind.String()
		if e.Member != nil {
			s += " " + e.Member.ID
		}
		if e.Leader != "" {
			s += " leader=" + e.Leader
		}
	}
	return s + "]"
}

func memberIDs(ms []courier.Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}
