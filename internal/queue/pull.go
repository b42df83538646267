package queue

import "fmt"

// Pulling: a consumer that asks for one message at a time, as AMQP's
// basic.get does, instead of being pushed messages up to its credit. A
// puller is not counted among the queue's consumers and is not on the
// ring of keys: it takes from the shared ready list and from the keys no
// pushed consumer owns (a key the ring gives a consumer waits for it).
// It is never the active consumer of a single-active queue, and
// receives nothing through a Deliver function: [Queue.Take] returns the
// message, in flight to it until acked or nacked as any consumer's.

// AddPuller attaches a puller with the given id (informative: pullers are
// not indexed by id, so it may repeat a consumer's). Settle what it takes
// with [Queue.Ack] and [Queue.Nack]; [Queue.RemoveConsumer] ends it, and
// what it holds is redelivered as for any consumer.
func (q *Queue) AddPuller(id string) (*Consumer, error) {
	q.lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, ErrClosed
	}
	return &Consumer{q: q, id: id, tag: id, pull: true, deliver: func(Delivery) {}}, nil
}

// Take puts the next ready message in flight to the puller c and returns
// it; ok is false when no message is ready (delayed, backing-off and
// keyed messages are not). An expired message met on the way is
// dead-lettered and skipped, as a pushed consumer would.
func (q *Queue) Take(c *Consumer) (d Delivery, ok bool, err error) {
	q.lock()
	if q.closed {
		q.mu.Unlock()
		return d, false, ErrClosed
	}
	if c == nil || c.q != q || c.removed || !c.pull {
		q.mu.Unlock()
		return d, false, fmt.Errorf("take: %w", ErrUnknownConsumer)
	}
	now := q.now()
	for {
		n := len(q.out)
		lent := q.lendOrphan(c)
		progress := q.deliverOne(c, now)
		if lent != nil && lent.kq == &c.keys {
			q.routeKey(lent) // not taken: back to the orphans
		}
		if !progress {
			break
		}
		// deliverOne queued the delivery for c's Deliver function when it
		// delivered rather than dead-lettered: it is returned instead.
		if len(q.out) > n {
			if e := q.out[len(q.out)-1]; e.kind == evDeliver && e.c == c {
				d, ok = e.d, true
				q.out[len(q.out)-1] = event{}
				q.out = q.out[:len(q.out)-1]
				break
			}
		}
	}
	q.finish(now)
	return d, ok, nil
}

// lendOrphan puts the best key no consumer owns, if any, in the puller
// c's keys for one deliverOne, and returns it. q.mu is held.
func (q *Queue) lendOrphan(c *Consumer) *keyState {
	if q.orphans == nil {
		return nil
	}
	k := q.orphans.best()
	if k == nil {
		return nil
	}
	q.orphans.remove(k)
	k.owner = c
	c.keys.push(k)
	return k
}
