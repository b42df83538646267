package amqp

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/courier-mq/courier/wire"
)

// basic.get: the channel pulls one message from the queue with a pull
// attachment of the session (broker.Session.Get), one per queue it takes
// from: Q itself first, then the durable subscription of each exchange Q
// is bound to, as a consumer of Q takes from all of them. A message got
// with acks is held by the channel until basic.ack, nack or reject, as a
// delivery; one got with no-ack is acked before it is sent. The channel's
// pull attachments are detached when it closes, and what they hold goes
// back to the queue.

// getSource is one queue basic.get takes from: Q's own (sub "") or the
// binding subscription of exchange.
type getSource struct{ exchange, sub string }

// basicGet answers basic.get with get-ok and the message, or get-empty.
func (c *conn) basicGet(ch *channel, m *BasicGet) error {
	if c.lockedBy(m.Queue) {
		return c.closeChannel(ch, locked(m, m.Queue))
	}
	sources := []getSource{{exchange: m.Queue}}
	for _, x := range c.bindingSources(m.Queue) {
		sources = append(sources, getSource{exchange: x, sub: bindSub(m.Queue)})
	}
	for i, src := range sources {
		id := c.pullerOf(ch, src)
		d, ok, _, err := c.gw.sess.Get(id, src.exchange, src.sub)
		if err != nil && i == 0 && wireErrCode(err) == wire.CodeUnavailable && c.s.cfg.Broker.Clustered() {
			// A replicated queue another node serves.
			if sent, err := c.remoteGet(ch, m); sent || err != nil {
				return err
			}
			continue
		}
		if err != nil {
			if i > 0 {
				// A binding gone meanwhile: the others are still there.
				c.s.log.Debug("amqp get skipped a binding", "peer", c.peer, "queue", m.Queue, "exchange", src.exchange, "err", err)
				continue
			}
			e := wireErr(err)
			switch e.Code {
			case NotFound:
				e.Text = fmt.Sprintf("NOT_FOUND - no queue '%s' in vhost '/'", m.Queue)
			case PreconditionFailed:
				e.Text = fmt.Sprintf("PRECONDITION_FAILED - '%s' is not a queue: %s", m.Queue, err)
			}
			e.ClassID, e.MethodID = m.ClassMethod()
			return c.channelError(ch, e)
		}
		if !ok {
			continue
		}
		tag := ch.tags.add(held{attach: id, task: d.ID}, !m.NoAck)
		okm := &BasicGetOK{DeliveryTag: tag, Redelivered: d.Attempts > 0, RoutingKey: m.Queue, MessageCount: c.readyIn(sources)}
		if src.sub != "" {
			okm.Exchange, okm.RoutingKey = src.exchange, shortstr(d.Key)
		} else if x, key, ok := origin(d.Headers); ok {
			okm.Exchange, okm.RoutingKey = shortstr(x), shortstr(key)
		}
		props, body := headersToProps(d.Headers), d.Body
		if m.NoAck {
			// Settled before the answer, on this loop: a keyed message
			// still held would hide the next one of its key from the
			// client's next basic.get. The body is the queue's until
			// then, so the answer takes a copy.
			body = slices.Clone(body)
			a := wire.NewFrame(wire.TypeAck)
			a.Attach, a.Ref = id, d.ID
			c.gw.sess.Handle(a)
		}
		return c.sendContent(ch.id, okm, props, body, nil)
	}
	return c.send(ch.id, &BasicGetEmpty{})
}

// pullerOf returns the id of the channel's pull attachment of src,
// chosen on first use.
func (c *conn) pullerOf(ch *channel, src getSource) uint32 {
	if id, ok := ch.pullers[src]; ok {
		return id
	}
	if ch.pullers == nil {
		ch.pullers = make(map[getSource]uint32)
	}
	c.nextAttach++
	ch.pullers[src] = c.nextAttach
	return c.nextAttach
}

// readyIn counts the messages ready in the sources, for get-ok's
// message-count.
func (c *conn) readyIn(sources []getSource) uint32 {
	var n int64
	for _, src := range sources {
		name := src.exchange
		if src.sub != "" {
			name += "/" + src.sub
		}
		if q := c.s.cfg.Broker.Queue(name); q != nil {
			n += max(q.Stats().Ready, 0)
		}
	}
	return uint32(min(n, 1<<32-1))
}

// dropPullers detaches the pull attachments of a channel that closes:
// what they hold goes back to the queue.
func (c *conn) dropPullers(ch *channel) {
	for _, id := range ch.pullers {
		c.detach(id)
	}
	ch.pullers = nil
	for id := range ch.getters {
		c.detach(id)
	}
	ch.getters = nil
}

// remoteGet answers basic.get m of a replicated queue that another node
// serves: a worker of prefetch 1, attached for this get alone and
// forwarded to the node that serves the queue, takes the message the
// queue hands it as it attaches. With no-ack it is acked and detached at
// once; with acks it stays attached, holding the message, until
// basic.ack, nack or reject settles it (ch.getters). sent is false when
// the queue had nothing to hand: the caller goes on with the queue's
// bindings, then answers get-empty.
func (c *conn) remoteGet(ch *channel, m *BasicGet) (sent bool, err error) {
	c.nextAttach++
	g := &consumer{tag: "", queue: m.Queue, attach: c.nextAttach, ch: ch, prefetch: 1, getter: true}
	c.gw.addConsumer(g)
	f := wire.NewFrame(wire.TypeAttach)
	f.Name, f.Aux, f.Attach = m.Queue, wire.RoleWorker, g.attach
	f.Body, _ = json.Marshal(wire.AttachSpec{Prefetch: 1, ConnTag: "amqp.get"})
	r, err := c.gw.call(f)
	if err != nil {
		c.gw.removeConsumer(g.attach)
		return false, err
	}
	defer r.Release()
	if r.Type == wire.TypeError {
		c.gw.removeConsumer(g.attach)
		e := fromWire(wire.Code(r.Aux), r.Tag)
		e.ClassID, e.MethodID = m.ClassMethod()
		return true, c.channelError(ch, e)
	}
	// The queue handed the worker what it had ready as it attached, on
	// the link before the attachment's OK; what comes after is not taken
	// (it goes back to the queue when the worker detaches).
	g.mu.Lock()
	early := g.early
	g.early = nil
	g.mu.Unlock()
	if len(early) == 0 {
		c.detach(g.attach)
		return false, nil
	}
	t := early[0]
	h := held{attach: g.attach, task: t.id}
	tag := ch.tags.add(h, !m.NoAck)
	if m.NoAck {
		c.ackTask(h)
		c.detach(g.attach)
	} else {
		if ch.getters == nil {
			ch.getters = make(map[uint32]bool)
		}
		ch.getters[g.attach] = true
	}
	okm := &BasicGetOK{DeliveryTag: tag, Redelivered: t.attempts > 0, RoutingKey: m.Queue}
	if x, key, ok := origin(t.header); ok {
		okm.Exchange, okm.RoutingKey = shortstr(x), shortstr(key)
	}
	return true, c.sendContent(ch.id, okm, headersToProps(t.header), t.body, nil)
}

// settledGetter detaches the remote getter of attach, if it is one, once
// its message is settled.
func (c *conn) settledGetter(ch *channel, attach uint32) {
	if ch.getters[attach] {
		delete(ch.getters, attach)
		c.detach(attach)
	}
}

// wireErrCode returns the Courier code of err, 0 without one.
func wireErrCode(err error) wire.Code {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Code
	}
	return 0
}
