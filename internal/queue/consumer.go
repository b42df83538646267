package queue

import (
	"fmt"
	"slices"
	"sync/atomic"
)

// ConsumerConfig describes a consumer to [Queue.AddConsumer].
type ConsumerConfig struct {
	// Prefetch is the consumer's credit: how many messages it may have
	// in flight (delivered, not yet acked or nacked). At least 1.
	Prefetch int
	// Tag is the consumer's stable identity on the ring of keys: a
	// consumer that comes back with the same tag (a restarted worker)
	// gets the same keys back. Default: the consumer's id.
	Tag string
	// Deliver receives the consumer's messages. It is called without the
	// queue's lock, from whichever goroutine made the message deliverable
	// (an Enqueue, an Ack, the scheduler's timer), one call at a time per
	// queue, in delivery order. It must not block: hand the delivery to
	// the consumer's own buffer (credit bounds it to Prefetch messages).
	// It may call the queue, Ack included. It may still be called
	// shortly after [Queue.RemoveConsumer] returns; acks from then on fail
	// with [ErrUnknownConsumer].
	Deliver func(Delivery)
}

// Consumer is a consumer attached to a queue, returned by
// [Queue.AddConsumer]. Pass it to [Queue.Ack], [Queue.Nack] and
// [Queue.Progress].
type Consumer struct {
	q       *Queue
	id, tag string
	deliver func(Delivery)
	gone    atomic.Bool // removed, or the queue closed: skip its deliveries
	pull    bool        // a puller (pull.go): never pushed, not listed

	// Guarded by q.mu.
	prefetch     int
	removed      bool
	eligible     bool     // may receive: every consumer, or the active one
	unacked      msgList  // messages in flight, in delivery order
	keys         keyQueue // schedulable keys the ring gives it
	inHungry     bool
	hprev, hnext *Consumer // links in q.hungry
	dirty        bool      // in q.dirty
}

// ID returns the consumer's id.
func (c *Consumer) ID() string { return c.id }

// credit reports whether c may take a message now. q.mu is held.
func (c *Consumer) credit() bool {
	return c.eligible && !c.removed && c.unacked.n < c.prefetch
}

// AddConsumer attaches a consumer with a unique id. It starts receiving
// at once if it can: always with competing consumers, only if no other
// is attached in single-active mode. With keyed messages, the new
// consumer takes its share of the keys from the others, except keys that
// have a message in flight, which move once it is settled.
func (q *Queue) AddConsumer(id string, cc ConsumerConfig) (*Consumer, error) {
	if cc.Prefetch < 1 {
		return nil, fmt.Errorf("add consumer %q: prefetch %d: %w", id, cc.Prefetch, ErrBadConfig)
	}
	if cc.Deliver == nil {
		return nil, fmt.Errorf("add consumer %q: no Deliver: %w", id, ErrBadConfig)
	}
	if cc.Tag == "" {
		cc.Tag = id
	}
	q.lock()
	if q.closed {
		q.mu.Unlock()
		return nil, ErrClosed
	}
	if q.byID[id] != nil {
		q.mu.Unlock()
		return nil, fmt.Errorf("add consumer %q: %w", id, ErrConsumerExists)
	}
	c := &Consumer{q: q, id: id, tag: cc.Tag, deliver: cc.Deliver, prefetch: cc.Prefetch}
	q.consumers = append(q.consumers, c)
	q.byID[id] = c
	q.stats.consumers.Add(1)
	if !q.cfg.SingleActive || q.active == nil {
		c.eligible = true
		if q.cfg.SingleActive {
			q.setActive(c)
		}
		q.ring = newRing(q.eligible())
		q.rerouteAll()
	}
	q.updateHungry(c)
	q.kick(c)
	q.finish(q.now())
	return c, nil
}

// RemoveConsumer detaches c, as when its connection dies. Its messages
// in flight fail: each is redelivered after its backoff, marked
// redelivered with attempts + 1, or dead-lettered past
// [Config.MaxAttempts]. Its keys move to the remaining consumers. In
// single-active mode the oldest remaining consumer takes over.
func (q *Queue) RemoveConsumer(c *Consumer) error {
	return q.removeConsumer(c, true)
}

// ReturnConsumer detaches c as [Queue.RemoveConsumer] does, but its
// messages in flight come back ready as they were, first in their key
// and priority, without a failed attempt and without a journal record
// (deliveries are not journaled): for a consumer that went away through
// no fault of its own, such as one whose node's link dropped.
func (q *Queue) ReturnConsumer(c *Consumer) error {
	return q.removeConsumer(c, false)
}

func (q *Queue) removeConsumer(c *Consumer, fail bool) error {
	q.lock()
	if q.closed {
		q.mu.Unlock()
		return ErrClosed
	}
	if c == nil || c.q != q || c.removed {
		q.mu.Unlock()
		return fmt.Errorf("remove consumer: %w", ErrUnknownConsumer)
	}
	now := q.now()
	c.removed = true
	c.gone.Store(true)
	q.hungry.remove(c)
	if !c.pull {
		for i, x := range q.consumers {
			if x == c {
				q.consumers = slices.Delete(q.consumers, i, i+1)
				break
			}
		}
		delete(q.byID, c.id)
		q.stats.consumers.Add(-1)
	}
	if c.eligible {
		c.eligible = false
		if q.cfg.SingleActive {
			var next *Consumer
			if len(q.consumers) > 0 {
				next = q.consumers[0]
				next.eligible = true
				q.updateHungry(next)
				q.kick(next)
			}
			q.setActive(next)
		}
		q.ring = newRing(q.eligible())
		q.rerouteFrom(c)
	}
	var err error
	for m := c.unacked.head; m != nil; m = c.unacked.head {
		c.unacked.remove(m)
		m.owner = nil
		q.stats.unacked.Add(-1)
		if !fail {
			if m.ks != nil {
				m.ks.busy = m // as retry leaves it: makeReady unblocks
			}
			q.stats.ready.Add(1)
			q.makeReady(m, true)
			continue
		}
		if e := q.retry(m, now); e != nil && err == nil {
			err = e
		}
	}
	q.finish(now)
	if err != nil {
		return fmt.Errorf("remove consumer %q: %w: %w", c.id, ErrJournal, err)
	}
	return nil
}

// SetPrefetch changes c's credit; raising it delivers at once.
func (q *Queue) SetPrefetch(c *Consumer, n int) error {
	if n < 1 {
		return fmt.Errorf("set prefetch %d: %w", n, ErrBadConfig)
	}
	q.lock()
	if q.closed {
		q.mu.Unlock()
		return ErrClosed
	}
	if c == nil || c.q != q || c.removed {
		q.mu.Unlock()
		return fmt.Errorf("set prefetch: %w", ErrUnknownConsumer)
	}
	c.prefetch = n
	q.updateHungry(c)
	q.kick(c)
	q.finish(q.now())
	return nil
}

// Active returns the id of the consumer that receives in single-active
// mode, and false if there is none (or the queue is not single-active).
// [Config.OnActive] reports each change.
func (q *Queue) Active() (string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.active == nil {
		return "", false
	}
	return q.active.id, true
}

// Consumers returns the ids of the attached consumers, oldest first.
func (q *Queue) Consumers() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	ids := make([]string, len(q.consumers))
	for i, c := range q.consumers {
		ids[i] = c.id
	}
	return ids
}

// setActive records the active consumer and queues the OnActive call.
// q.mu is held.
func (q *Queue) setActive(c *Consumer) {
	q.active = c
	if q.cfg.OnActive != nil {
		q.out = append(q.out, event{kind: evActive, c: c})
	}
}

// eligible returns the consumers that may receive. q.mu is held.
func (q *Queue) eligible() []*Consumer {
	if q.cfg.SingleActive {
		if q.active == nil {
			return nil
		}
		return []*Consumer{q.active}
	}
	return q.consumers
}

// updateHungry puts c on the hungry list if it has credit, off it if not.
// q.mu is held.
func (q *Queue) updateHungry(c *Consumer) {
	switch want := c.credit(); {
	case want && !c.inHungry:
		q.hungry.pushBack(c)
	case !want && c.inHungry:
		q.hungry.remove(c)
	}
}

// kick marks c to be served before the lock is released: it gained
// credit or keys. q.mu is held.
func (q *Queue) kick(c *Consumer) {
	if !c.dirty {
		c.dirty = true
		q.dirty = append(q.dirty, c)
	}
}

// consumerList is the intrusive round-robin list of hungry consumers.
type consumerList struct {
	head, tail *Consumer
}

func (l *consumerList) pushBack(c *Consumer) {
	c.inHungry, c.hprev, c.hnext = true, l.tail, nil
	if l.tail != nil {
		l.tail.hnext = c
	} else {
		l.head = c
	}
	l.tail = c
}

func (l *consumerList) remove(c *Consumer) {
	if !c.inHungry {
		return
	}
	if c.hprev != nil {
		c.hprev.hnext = c.hnext
	} else {
		l.head = c.hnext
	}
	if c.hnext != nil {
		c.hnext.hprev = c.hprev
	} else {
		l.tail = c.hprev
	}
	c.inHungry, c.hprev, c.hnext = false, nil, nil
}

// rotate moves c, if listed, to the end: its turn is over.
func (l *consumerList) rotate(c *Consumer) {
	if c.inHungry && l.tail != c {
		l.remove(c)
		l.pushBack(c)
	}
}
