package amqp

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/wire"
)

// Bindings: queue.bind of queue Q to exchange X is the durable
// subscription "amqp.Q" of the Courier pub-sub exchange X, bound to the
// pattern the binding's key makes. So whatever X publishes, from AMQP or
// a Courier PUBLISH, is kept in the subscription's queue (X/amqp.Q) while
// it matches, and a consumer of Q takes from Q itself and from each of
// those subscriptions: its worker attachment of Q and one durable
// subscriber attachment per bound exchange.

// bindSub is the durable subscription carrying the bindings of queue.
func bindSub(queue string) string { return "amqp." + queue }

// exchangeKinds remembers the type each exchange was declared with over
// AMQP: Courier keeps none, and a binding's pattern depends on it.
type exchangeKinds struct {
	mu sync.Mutex // guards m; also serializes binding changes
	m  map[string]string
}

func (k *exchangeKinds) set(exchange, kind string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = make(map[string]string)
	}
	k.m[exchange] = kind
}

func (k *exchangeKinds) get(exchange string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.m[exchange]
}

// bindPattern is the Courier pattern of a binding with key to an
// exchange of kind: everything for fanout, the key for topic and
// direct (a direct key with a wildcard word cannot be told from one),
// headers not at all.
func bindPattern(m Method, kind, key string) (string, *Error) {
	switch kind {
	case "fanout":
		return "#", nil
	case "headers":
		return "#", nil // the key does not count: the filter does
	case "direct":
		for _, w := range strings.Split(key, ".") {
			if w == "*" || w == "#" {
				return "", methodError(NotImplemented, m, fmt.Sprintf("NOT_IMPLEMENTED - a direct binding key with the word '%s' is not supported: Courier would read it as a wildcard", w))
			}
		}
	}
	return key, nil
}

// subPatterns returns the patterns of the durable subscription sub of
// exchange, and whether it exists.
func subPatterns(b *broker.Broker, exchange, sub string) ([]string, bool) {
	_, _, subs := b.Definitions()
	for _, d := range subs {
		if d.Exchange == exchange && d.Name == sub {
			return d.Patterns, true
		}
	}
	return nil, false
}

// boundExchanges returns the exchanges queue is bound to.
func boundExchanges(b *broker.Broker, queue string) []string {
	sub := bindSub(queue)
	var xs []string
	_, _, subs := b.Definitions()
	for _, d := range subs {
		if d.Name == sub {
			xs = append(xs, d.Exchange)
		}
	}
	return xs
}

// checkBind refuses a binding change the user may not make: RabbitMQ
// asks write on the queue and read on the exchange.
func (c *conn) checkBind(m Method, queue, exchange string) *Error {
	switch {
	case exchange == "":
		return methodError(AccessRefused, m, fmt.Sprintf("ACCESS_REFUSED - operation not permitted on the default exchange (queue '%s')", queue))
	case c.lockedBy(queue):
		return locked(m, queue)
	}
	if u := c.s.cfg.Users; u != nil {
		if u.Perms(c.user, queue)&auth.Write == 0 {
			return methodError(AccessRefused, m, fmt.Sprintf("ACCESS_REFUSED - write access to queue '%s' in vhost '/' refused for user '%s'", queue, c.user))
		}
		if u.Perms(c.user, exchange)&auth.Read == 0 {
			return methodError(AccessRefused, m, fmt.Sprintf("ACCESS_REFUSED - read access to exchange '%s' in vhost '/' refused for user '%s'", exchange, c.user))
		}
	}
	return nil
}

// queueBind adds the binding's pattern to the queue's subscription of
// the exchange, created if new.
func (c *conn) queueBind(ch *channel, m *QueueBind) error {
	if e := c.checkBind(m, m.Queue, m.Exchange); e != nil {
		return c.closeChannel(ch, e)
	}
	kind := c.exchangeKind(m.Exchange, m.Queue)
	if len(m.Arguments) > 0 && kind != "headers" {
		return methodError(NotImplemented, m, "binding arguments are not supported by Courier's AMQP gateway but to headers exchanges")
	}
	pattern, e := bindPattern(m, kind, m.RoutingKey)
	if e != nil {
		return e
	}
	var filter broker.HeaderFilter
	if kind == "headers" {
		if filter, e = headerFilter(m, m.Arguments); e != nil {
			return c.closeChannel(ch, e)
		}
	}
	if ok, err := c.queueExists(m.Queue); err != nil {
		return err
	} else if !ok {
		return c.closeChannel(ch, methodError(NotFound, m, fmt.Sprintf("NOT_FOUND - no queue '%s' in vhost '/'", m.Queue)))
	}
	b, sub := c.s.cfg.Broker, bindSub(m.Queue)
	if !broker.ValidName(sub) {
		return methodError(NotImplemented, m, fmt.Sprintf("NOT_IMPLEMENTED - queue '%s' cannot be bound: Courier binds queues named with dot-separated words of letters, digits, '_', '-', ':'", m.Queue))
	}
	c.s.kinds.mu.Lock()
	var err error
	if kind == "headers" {
		filters, _ := b.Filters(m.Exchange, sub)
		if !slices.ContainsFunc(filters, func(f broker.HeaderFilter) bool { return sameFilter(f, filter) }) {
			filters = append(filters, filter)
		}
		err = b.DurableSubscribeHeaders(m.Exchange, sub, filters)
	} else {
		patterns, _ := subPatterns(b, m.Exchange, sub)
		if !slices.Contains(patterns, pattern) {
			patterns = append(slices.Clone(patterns), pattern)
		}
		err = b.DurableSubscribe(m.Exchange, sub, patterns)
	}
	c.s.kinds.mu.Unlock()
	if err != nil {
		e := wireErr(err)
		if e.Code == NotFound {
			e.Text = fmt.Sprintf("NOT_FOUND - no exchange '%s' in vhost '/'", m.Exchange)
		}
		e.ClassID, e.MethodID = m.ClassMethod()
		return c.channelError(ch, e)
	}
	if c.s.moveBindings() {
		// In a cluster the binding is moved into the queue (mover.go).
		c.s.movers.start(m.Exchange, m.Queue)
		return c.bound(ch, m)
	}
	// The connection's consumers of the queue take from it now.
	for _, other := range c.channels {
		for _, cs := range other.consumers {
			if cs.queue == m.Queue {
				if err := c.attachSource(cs, m.Exchange); err != nil {
					return err
				}
			}
		}
	}
	return c.bound(ch, m)
}

// bound answers queue.bind m.
func (c *conn) bound(ch *channel, m *QueueBind) error {
	if m.NoWait {
		return nil
	}
	return c.send(ch.id, &QueueBindOK{})
}

// queueUnbind removes the binding's pattern; the subscription goes with
// its last pattern, and with it what it held.
func (c *conn) queueUnbind(ch *channel, m *QueueUnbind) error {
	if e := c.checkBind(m, m.Queue, m.Exchange); e != nil {
		return c.closeChannel(ch, e)
	}
	kind := c.exchangeKind(m.Exchange, m.Queue)
	if kind == "headers" {
		return c.unbindHeaders(ch, m)
	}
	pattern, e := bindPattern(m, kind, m.RoutingKey)
	if e != nil {
		return e
	}
	b, sub := c.s.cfg.Broker, bindSub(m.Queue)
	c.s.kinds.mu.Lock()
	patterns, ok := subPatterns(b, m.Exchange, sub)
	err := unbindOne(b, m.Exchange, sub, patterns, ok,
		func(p string) bool { return p == pattern },
		func(rest []string) error { return b.DurableSubscribe(m.Exchange, sub, rest) })
	c.s.kinds.mu.Unlock()
	return c.unbound(ch, m, err)
}

// unbindOne removes from have, the bindings of subscription sub of
// exchange (ok: it exists), those that gone matches: the subscription
// goes with its last binding, and keep stores what is left otherwise.
// Unbinding what is not bound succeeds, as in RabbitMQ.
func unbindOne[T any](b *broker.Broker, exchange, sub string, have []T, ok bool, gone func(T) bool, keep func([]T) error) error {
	if !ok {
		return nil
	}
	rest := slices.DeleteFunc(slices.Clone(have), gone)
	switch {
	case len(rest) == len(have):
		return nil
	case len(rest) == 0:
		return b.DeleteQueue(exchange + "/" + sub)
	}
	return keep(rest)
}

// unbound answers queue.unbind m after the broker's answer err.
func (c *conn) unbound(ch *channel, m *QueueUnbind, err error) error {
	if err != nil {
		e := wireErr(err)
		e.ClassID, e.MethodID = m.ClassMethod()
		return c.channelError(ch, e)
	}
	if _, ok := c.s.cfg.Broker.Filters(m.Exchange, bindSub(m.Queue)); !ok {
		c.s.movers.stop(m.Exchange, m.Queue) // its last binding went
	}
	c.bindingGone(m.Exchange)
	return c.send(ch.id, &QueueUnbindOK{})
}

// dropBindings deletes the subscriptions of a queue that is deleted.
func (c *conn) dropBindings(queue string) {
	b := c.s.cfg.Broker
	for _, x := range boundExchanges(b, queue) {
		c.s.movers.stop(x, queue)
		b.DeleteQueue(x + "/" + bindSub(queue))
		c.bindingGone(x)
	}
}

// attachSource makes cs a durable subscriber of its queue's subscription
// of exchange, unless it is one already.
func (c *conn) attachSource(cs *consumer, exchange string) error {
	cs.mu.Lock()
	_, ok := cs.sources[exchange]
	cs.mu.Unlock()
	if ok {
		return nil
	}
	c.nextAttach++
	id := c.nextAttach
	c.gw.addSource(cs, id)
	f := wire.NewFrame(wire.TypeAttach)
	f.Name, f.Aux, f.Attach = exchange, wire.RoleSubscriber, id
	f.Body, _ = json.Marshal(wire.AttachSpec{Prefetch: cs.prefetch, Durable: bindSub(cs.queue), ConnTag: cs.tag})
	r, err := c.gw.call(f)
	if err != nil {
		return err
	}
	defer r.Release()
	if r.Type == wire.TypeError {
		c.gw.removeConsumer(id)
		c.s.log.Info("amqp consumer not attached to a binding", "peer", c.peer, "queue", cs.queue, "exchange", exchange, "err", r.Tag)
		return nil
	}
	cs.mu.Lock()
	if cs.sources == nil {
		cs.sources = make(map[string]uint32)
	}
	cs.sources[exchange] = id
	cs.mu.Unlock()
	return nil
}

// wireErr maps an error of the broker onto an AMQP one.
func wireErr(err error) *Error {
	var we *wire.Error
	code := wire.CodeInternal
	if errors.As(err, &we) {
		code = we.Code
	}
	return fromWire(code, err.Error())
}

// exchangeKind is the type exchange was declared with over AMQP: the
// one kept with the exchange (in a cluster, in its replicated metadata);
// for one declared without it (a Courier-native exchange, or one
// declared before types were kept), the one this listener saw declared
// since it started, else "headers" when queue's binding to it has header
// filters (kept by the broker), "" else.
func (c *conn) exchangeKind(exchange, queue string) string {
	if ex := c.s.cfg.Broker.Exchange(exchange); ex != nil {
		if k := ex.Config().AMQPType; k != "" {
			return k
		}
	}
	if k := c.s.kinds.get(exchange); k != "" {
		return k
	}
	if fs, _ := c.s.cfg.Broker.Filters(exchange, bindSub(queue)); len(fs) > 0 {
		return "headers"
	}
	return ""
}

// headerFilter maps a headers binding's arguments onto a Courier header
// filter: x-match, and the headers to match, each value as text as a
// message's headers are carried (void: present with any value).
func headerFilter(m Method, args Table) (broker.HeaderFilter, *Error) {
	f := broker.HeaderFilter{Match: broker.MatchAll, Headers: make(map[string]*string, len(args)), Typed: true}
	for k, v := range args {
		if k == "x-match" {
			s, _ := v.(string)
			switch s {
			case broker.MatchAll, broker.MatchAny, broker.MatchAllWithX, broker.MatchAnyWithX:
				f.Match = s
			default:
				return f, methodError(PreconditionFailed, m, fmt.Sprintf("PRECONDITION_FAILED - Invalid x-match field value %v; expected one of all, any, all-with-x, or any-with-x", v))
			}
			continue
		}
		if v == nil {
			f.Headers[k] = nil
			continue
		}
		text := headerText(v)
		f.Headers[k] = &text
		if typ := headerType(v); typ != "" {
			if f.Types == nil {
				f.Types = make(map[string]string)
			}
			f.Types[k] = typ
		}
	}
	if len(f.Headers) > broker.MaxFilterHeaders {
		return f, methodError(PreconditionFailed, m, fmt.Sprintf("PRECONDITION_FAILED - a headers binding of %d headers: Courier takes at most %d", len(f.Headers), broker.MaxFilterHeaders))
	}
	return f, nil
}

// sameFilter reports whether two header filters match the same headers.
func sameFilter(a, b broker.HeaderFilter) bool {
	if a.Match != b.Match || len(a.Headers) != len(b.Headers) || a.Typed != b.Typed || !maps.Equal(a.Types, b.Types) {
		return false
	}
	for k, v := range a.Headers {
		w, ok := b.Headers[k]
		if !ok || (v == nil) != (w == nil) || v != nil && *v != *w {
			return false
		}
	}
	return true
}

// unbindHeaders removes a headers binding: the filter its arguments
// make; the subscription goes with its last filter.
func (c *conn) unbindHeaders(ch *channel, m *QueueUnbind) error {
	filter, e := headerFilter(m, m.Arguments)
	if e != nil {
		return c.closeChannel(ch, e)
	}
	b, sub := c.s.cfg.Broker, bindSub(m.Queue)
	c.s.kinds.mu.Lock()
	filters, ok := b.Filters(m.Exchange, sub)
	err := unbindOne(b, m.Exchange, sub, filters, ok,
		func(f broker.HeaderFilter) bool {
			// A filter stored before types were kept is unbound by its text.
			return sameFilter(f, filter) || !f.Typed && sameFilter(f, broker.HeaderFilter{Match: filter.Match, Headers: filter.Headers})
		},
		func(rest []broker.HeaderFilter) error { return b.DurableSubscribeHeaders(m.Exchange, sub, rest) })
	c.s.kinds.mu.Unlock()
	return c.unbound(ch, m, err)
}
