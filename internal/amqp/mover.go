package amqp

import (
	"encoding/json"
	"maps"
	"strconv"
	"strings"
	"sync"

	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/wire"
)

// Bindings in a cluster. A binding of queue Q to exchange X is the
// durable subscription amqp.Q of X on the node where it was made, as on
// a node alone; but Q is a replicated queue that every node reaches, and
// a durable subscription is not: a consumer on another node could not
// take from it. So in a cluster the listener of the node that holds the
// subscription moves what it receives into Q itself: a mover, one
// durable subscriber per binding, submits each message to Q (forwarded
// to the node that serves it) and acks it in the subscription once Q has
// confirmed it (committed on a majority of Q's replicas). Consumers and
// basic.get then take from Q alone, on any node, and a message from a
// binding carries its exchange and routing key in the headers
// x-amqp-exchange and x-amqp-routing-key, which become basic.deliver's
// exchange and routing key again. A submit Q refuses (no leader yet) is
// nacked in the subscription and comes again after its backoff.

// Headers carrying the origin of a message moved from a binding into
// its queue.
const (
	headerExchange   = "x-amqp-exchange"
	headerRoutingKey = "x-amqp-routing-key"
)

// moverPrefetch bounds the messages of one binding being moved at once.
const moverPrefetch = 64

// moverRefAttach marks the Ref of a mover's ATTACH, whose answer only
// logs.
const moverRefAttach = 1 << 62

// binding names one binding subscription: queue's of exchange.
type binding struct{ exchange, queue string }

// moving is a message of a binding subscription being submitted to its
// queue, to ack (or nack) in the subscription once the submit answers.
type moving struct {
	attach uint32
	task   uint64
}

// movers are the server's movers, all on one broker session of their
// own. Their deliveries are handed to one goroutine (run), so the
// broker's goroutines never wait on a submit.
type movers struct {
	s *Server

	mu      sync.Mutex // guards everything below
	sess    *broker.Session
	nextID  uint32
	nextRef uint64
	byKey   map[binding]uint32
	byID    map[uint32]binding
	pending map[uint64]moving
	work    []*wire.Frame
	closed  bool
	ready   chan struct{} // signalled when work or closed changes
	done    chan struct{} // closed when run ends
}

// moverSink hands the movers' session frames to the movers.
type moverSink struct{ m *movers }

// Deliver implements broker.Sink: it never blocks.
func (k moverSink) Deliver(f *wire.Frame) {
	m := k.m
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		f.Release()
		return
	}
	m.work = append(m.work, f)
	m.mu.Unlock()
	select {
	case m.ready <- struct{}{}:
	default:
	}
}

// start makes sure a mover runs for the binding subscription of queue
// to exchange; the first one opens the session.
func (m *movers) start(exchange, queue string) {
	m.mu.Lock()
	if m.closed || m.byKey[binding{exchange, queue}] != 0 {
		m.mu.Unlock()
		return
	}
	if m.sess == nil {
		m.byKey, m.byID, m.pending = make(map[binding]uint32), make(map[uint32]binding), make(map[uint64]moving)
		m.ready, m.done = make(chan struct{}, 1), make(chan struct{})
		m.sess = m.s.cfg.Broker.Open(moverSink{m}, "amqp bindings")
		go m.run()
	}
	m.nextID++
	id := m.nextID
	m.byKey[binding{exchange, queue}], m.byID[id] = id, binding{exchange, queue}
	sess := m.sess
	m.mu.Unlock()
	f := wire.NewFrame(wire.TypeAttach)
	f.Name, f.Aux, f.Attach, f.Ref = exchange, wire.RoleSubscriber, id, moverRefAttach|uint64(id)
	f.Body, _ = json.Marshal(wire.AttachSpec{Prefetch: moverPrefetch, Durable: bindSub(queue), ConnTag: "amqp.bind." + queue})
	sess.Handle(f)
}

// stop ends the mover of the binding subscription of queue to exchange,
// if one runs: what it was moving goes back to the subscription.
func (m *movers) stop(exchange, queue string) {
	m.mu.Lock()
	id := m.byKey[binding{exchange, queue}]
	if id == 0 || m.closed {
		m.mu.Unlock()
		return
	}
	delete(m.byKey, binding{exchange, queue})
	delete(m.byID, id)
	sess := m.sess
	m.mu.Unlock()
	f := wire.NewFrame(wire.TypeDetach)
	f.Attach = id
	sess.Handle(f)
}

// close ends every mover and the session.
func (m *movers) close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	sess, done := m.sess, m.done
	for _, f := range m.work {
		f.Release()
	}
	m.work = nil
	m.mu.Unlock()
	if sess == nil {
		return
	}
	select {
	case m.ready <- struct{}{}:
	default:
	}
	<-done
	sess.Close()
}

// run handles the session's frames until close.
func (m *movers) run() {
	defer close(m.done)
	for range m.ready {
		m.mu.Lock()
		work, closed := m.work, m.closed
		m.work = nil
		m.mu.Unlock()
		if closed {
			return
		}
		for _, f := range work {
			m.handle(f)
			f.Release()
		}
	}
}

// handle takes one frame of the session.
func (m *movers) handle(f *wire.Frame) {
	switch f.Type {
	case wire.TypeTask:
		m.submit(f)
	case wire.TypeOK, wire.TypeError:
		if f.Ref&moverRefAttach != 0 {
			if f.Type == wire.TypeError {
				m.s.log.Warn("amqp binding not moved to its queue: its subscription could not be attached", "err", f.Tag)
			}
			return
		}
		m.settle(f)
	case wire.TypeEvent:
		if f.Aux == wire.EventDetached {
			m.mu.Lock()
			if b, ok := m.byID[f.Attach]; ok {
				delete(m.byID, f.Attach)
				delete(m.byKey, b)
			}
			m.mu.Unlock()
		}
	}
}

// submit submits a message of a binding subscription to its queue, with
// its origin in the headers.
func (m *movers) submit(t *wire.Frame) {
	m.mu.Lock()
	b, ok := m.byID[t.Attach]
	if !ok {
		m.mu.Unlock()
		return // stopped: the subscription has it back
	}
	m.nextRef++
	ref := m.nextRef
	m.pending[ref] = moving{attach: t.Attach, task: t.Ref}
	sess := m.sess
	m.mu.Unlock()
	f := wire.NewFrame(wire.TypeSubmit)
	f.Name, f.Ref, f.Flags = b.queue, ref, wire.FlagReply
	h := make(map[string]string, len(t.Header)+2)
	maps.Copy(h, t.Header)
	h[headerExchange], h[headerRoutingKey] = b.exchange, t.Key
	f.Header = h
	f.Body = append([]byte(nil), t.Body...)
	if p, err := strconv.ParseUint(h["priority"], 10, 8); err == nil {
		f.Aux = min(p, 9)
	}
	sess.Handle(f)
}

// settle acks in its subscription a message its queue confirmed, and
// nacks one it refused: it comes again after the subscription's backoff;
// one whose queue is gone is dropped.
func (m *movers) settle(r *wire.Frame) {
	m.mu.Lock()
	mv, ok := m.pending[r.Ref]
	delete(m.pending, r.Ref)
	sess := m.sess
	m.mu.Unlock()
	if !ok {
		return
	}
	f := wire.NewFrame(wire.TypeAck)
	if r.Type == wire.TypeError {
		f.Type = wire.TypeNack
		if wire.Code(r.Aux) != wire.CodeNotFound {
			f.Aux = 1 // requeue
		}
		m.s.log.Debug("amqp binding: a message not moved to its queue", "err", r.Tag)
	}
	f.Attach, f.Ref = mv.attach, mv.task
	sess.Handle(f)
}

// startMovers starts, in a cluster, a mover for every binding
// subscription the broker holds (at the listener's start).
func (s *Server) startMovers() {
	b := s.cfg.Broker
	if b == nil || !b.Clustered() {
		return
	}
	_, _, subs := b.Definitions()
	for _, d := range subs {
		if q, ok := strings.CutPrefix(d.Name, bindSub("")); ok {
			s.movers.start(d.Exchange, q)
		}
	}
}

// moveBindings reports whether the bindings of this server's queues are
// moved into the queues (in a cluster) rather than consumed from their
// subscriptions (on a node alone).
func (s *Server) moveBindings() bool {
	return s.cfg.Broker != nil && s.cfg.Broker.Clustered()
}

// shortstr cuts s to the 255 octets of an AMQP short string: a Courier
// key has no such bound.
func shortstr(s string) string {
	if len(s) > 255 {
		return s[:255]
	}
	return s
}

// origin returns the exchange and routing key a message moved from a
// binding carries, if it does.
func origin(h map[string]string) (exchange, key string, ok bool) {
	exchange, ok = h[headerExchange]
	return exchange, h[headerRoutingKey], ok
}

// bindingSources returns the exchanges whose binding subscriptions a
// consumer or basic.get of queue takes from: those queue is bound to on
// a node alone, none in a cluster (the movers bring them into queue).
func (c *conn) bindingSources(queue string) []string {
	if c.s.moveBindings() {
		return nil
	}
	return boundExchanges(c.s.cfg.Broker, queue)
}
