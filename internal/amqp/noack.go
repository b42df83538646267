package amqp

import "github.com/courier-mq/courier/wire"

// No-ack consumers deliver at most once, as RabbitMQ's: a delivery is
// settled the moment it is handed to the connection's outbox, and never
// goes back to the queue after that, whether the client reads it, its
// consumer is cancelled, or its connection closes or is cut first.
//
// The broker is told with an ACK once the delivery is written, or, for
// every delivery of the consumer still waiting in the outbox, before
// anything that would give the consumer's tasks back to the queue
// (basic.cancel, its channel or connection closing). Until its ACK a
// delivery counts against the consumer's credit (noAckPrefetch), so
// the broker hands a client that does not read no more than that, and
// the outbox limit cuts it off past its bytes: a fast reader is not
// sent the whole queue at once. What the outbox holds when the
// connection is cut is lost, as what RabbitMQ's socket held.

// settleNoAck records h, a delivery of the no-ack consumer cs about to
// be handed to the outbox, as settled: it returns the function that
// acks it once written. ok is false when cs is cancelled: the delivery
// is not to be written (the broker has it back).
func (c *conn) settleNoAck(cs *consumer, h held) (after func(), ok bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.cancelled {
		return nil, false
	}
	if cs.unacked == nil {
		cs.unacked = make(map[held]bool)
	}
	cs.unacked[h] = true
	return func() { c.ackNoAck(cs, h) }, true
}

// ackNoAck acks h to the broker unless that was done already.
func (c *conn) ackNoAck(cs *consumer, h held) {
	cs.mu.Lock()
	ok := cs.unacked[h]
	delete(cs.unacked, h)
	cs.mu.Unlock()
	if ok {
		c.ackTask(h)
	}
}

// flushNoAck acks every delivery of a no-ack consumer that is being
// cancelled still waiting in the outbox, before its DETACH, and marks it
// cancelled: what the broker delivers to it from now on is not written.
func (c *conn) flushNoAck(cs *consumer) {
	if !cs.noAck {
		return
	}
	cs.mu.Lock()
	hs := make([]held, 0, len(cs.unacked))
	for h := range cs.unacked {
		hs = append(hs, h)
	}
	cs.unacked, cs.cancelled = nil, true
	cs.mu.Unlock()
	for _, h := range hs {
		c.ackTask(h)
	}
}

// ackTask hands the broker an ACK of h.
func (c *conn) ackTask(h held) {
	a := wire.NewFrame(wire.TypeAck)
	a.Attach, a.Ref = h.attach, h.task
	c.gw.sess.Handle(a)
}
