package amqp

import (
	"fmt"
	"sync"
)

// Exclusive consumers: basic.consume with exclusive=true is refused with
// 403 ACCESS_REFUSED when the queue has other consumers, and while it
// consumes every other basic.consume of the queue is refused the same
// way, as in RabbitMQ. The listener keeps the AMQP consumers of each
// queue, so the check and the claim are one step for AMQP consumers of
// this node; the queue's other consumers (Courier workers, consumers on
// other nodes' listeners) are counted from the broker's queue when the
// exclusive consumer starts.

// queueConsumers are the AMQP consumers of each queue on the listener,
// and the exclusive one, if any.
type queueConsumers struct {
	mu   sync.Mutex // guards all, excl
	all  map[string]map[*consumer]bool
	excl map[string]*consumer
}

// add counts cs as a consumer of its queue, exclusive or not, unless
// that is refused: an exclusive consumer of the queue is there, or cs is
// exclusive and the queue has other consumers (others more, counted by
// the broker). It reports whether cs was added.
func (q *queueConsumers) add(cs *consumer, exclusive bool, others int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.excl[cs.queue] != nil || exclusive && (len(q.all[cs.queue]) > 0 || others > 0) {
		return false
	}
	if q.all == nil {
		q.all, q.excl = make(map[string]map[*consumer]bool), make(map[string]*consumer)
	}
	if q.all[cs.queue] == nil {
		q.all[cs.queue] = make(map[*consumer]bool)
	}
	q.all[cs.queue][cs] = true
	if exclusive {
		q.excl[cs.queue] = cs
	}
	return true
}

// remove forgets cs (cancelled, or its channel, connection or queue
// gone); removing one not counted does nothing.
func (q *queueConsumers) remove(cs *consumer) {
	q.mu.Lock()
	defer q.mu.Unlock()
	set := q.all[cs.queue]
	if !set[cs] {
		return
	}
	delete(set, cs)
	if len(set) == 0 {
		delete(q.all, cs.queue)
	}
	if q.excl[cs.queue] == cs {
		delete(q.excl, cs.queue)
	}
}

// inExclusiveUse is the error of a consumer refused for an exclusive
// one, RabbitMQ's text.
func inExclusiveUse(m Method, queue string) *Error {
	return methodError(AccessRefused, m, fmt.Sprintf("ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use", queue))
}

// brokerConsumers returns the consumers the broker counts on queue
// (Courier workers and AMQP consumers), 0 when this node does not serve
// it.
func (c *conn) brokerConsumers(queue string) int64 {
	if q := c.s.cfg.Broker.Queue(queue); q != nil {
		return max(q.Stats().Consumers, 0)
	}
	return 0
}
