package amqp

import (
	"time"
)

// maxFlowDelay is how long a publication is held at most while the
// queues it goes to are under memory or disk pressure; at full pressure
// the connection is blocked until it falls, looked at this often.
const maxFlowDelay = 50 * time.Millisecond

// flow applies Courier's flow control to the publisher after each
// publication, as the client listener's credit does: under pressure
// (broker.Session.Pressure, from the queue it published to last) the read
// loop waits up to maxFlowDelay in proportion, and at full pressure it
// stops reading, telling a client that supports it with
// connection.blocked, until the pressure falls (connection.unblocked).
// As with RabbitMQ, a connection that both publishes and consumes stops
// reading its acks too: publish and consume on separate connections.
func (c *conn) flow() {
	p := c.gw.sess.Pressure()
	switch {
	case p <= 0:
		return
	case p < 1:
		t := time.NewTimer(time.Duration(p * float64(maxFlowDelay)))
		defer t.Stop()
		select {
		case <-c.done:
		case <-t.C:
		}
		return
	}
	t := time.NewTicker(maxFlowDelay)
	defer t.Stop()
	blocked := false
	for c.gw.sess.Pressure() >= 1 {
		if !blocked && c.wantsBlocked() {
			blocked = true
			c.s.log.Info("amqp publisher blocked: its queues are at the memory or disk limit", "peer", c.peer, "user", c.user)
			if c.send(0, &ConnectionBlocked{Reason: "low on memory or disk space"}) != nil {
				return
			}
		}
		select {
		case <-c.done:
			return
		case <-t.C:
		}
	}
	if blocked {
		c.send(0, &ConnectionUnblocked{})
	}
}

// wantsBlocked reports whether the client announced the
// connection.blocked capability.
func (c *conn) wantsBlocked() bool {
	caps, _ := c.clientProps["capabilities"].(Table)
	b, _ := caps["connection.blocked"].(bool)
	return b
}
