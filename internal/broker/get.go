package broker

import (
	"fmt"

	"github.com/courier-mq/courier/internal/queue"
	"github.com/courier-mq/courier/wire"
)

// Pulling a task: the AMQP gateway's basic.get. A session's pull
// attachment of a task exchange takes one ready task at a time from its
// queue; it is no member of the exchange's workers (no member events, no
// keys, never the active consumer, not counted in the queue's consumers)
// and is never pushed a task. What it takes is settled by ACK and NACK
// on its id as a worker's task, and goes back to the queue when it is
// detached or its session closes.

// rolePuller is the role of a pull attachment; the gateway makes them,
// no client names the role on the wire.
const rolePuller uint64 = 1 << 8

// Get takes the next ready task of a queue for the session's pull
// attachment id, made on the first Get with that id: the queue of task
// exchange exchange when sub is "", else that of its durable
// subscription sub. The task is in flight to the attachment until
// settled. ok is false when no task is ready; ready is the number of
// tasks left ready. It needs the read permission on exchange. An id in
// use by another attachment, or by a pull attachment of another queue,
// is refused with CodeProtocol; a pull attachment whose queue was
// deleted, or deleted and made again, is made anew.
func (s *Session) Get(id uint32, exchange, sub string) (d queue.Delivery, ok bool, ready int64, err error) {
	if !s.allowed(attachNeeds(wire.RoleWorker), exchange) {
		return d, false, 0, s.deny("get", attachNeeds(wire.RoleWorker), exchange)
	}
	a, err := s.puller(id, exchange, sub)
	if err != nil {
		return d, false, 0, err
	}
	q := a.tq.q
	d, ok, err = q.Take(a.consumer.Load())
	if err != nil {
		return d, false, 0, queueError("get from "+q.Name(), err)
	}
	if ok {
		s.stats.Delivered.Add(d.ID, 1)
	}
	return d, ok, q.Stats().Ready, nil
}

// pullQueue returns the queue Get takes from.
func (b *Broker) pullQueue(exchange, sub string) (*Exchange, *taskQueue, error) {
	ex, err := b.lookup(exchange)
	if err != nil {
		return nil, nil, err
	}
	if sub == "" {
		if ex.cfg.Pattern != wire.PatternTasks || ex.tq == nil {
			return nil, nil, wire.Errorf(wire.CodeNotAllowed, "get: exchange %q is not a task exchange", exchange)
		}
		return ex, ex.tq, nil
	}
	v, ok := b.queues.Load(exchange + "/" + sub)
	if !ok {
		return nil, nil, wire.Errorf(wire.CodeNotFound, "get: no durable subscription %q of exchange %q", sub, exchange)
	}
	return ex, v.(*taskQueue), nil
}

// puller returns the session's pull attachment id of the queue, made if
// need be.
func (s *Session) puller(id uint32, exchange, sub string) (*Attachment, error) {
	ex, tq, err := s.b.pullQueue(exchange, sub)
	if err != nil {
		return nil, err
	}
	if id == 0 {
		return nil, wire.Errorf(wire.CodeProtocol, "get: attachment id 0 is reserved")
	}
	s.mu.Lock()
	a := s.attachments[id]
	s.mu.Unlock()
	if a != nil {
		switch {
		case a.role != rolePuller || a.ex.name != exchange || a.serviceTag != sub:
			return nil, wire.Errorf(wire.CodeProtocol, "get: attachment id %d is in use", id)
		case a.tq == tq && !a.gone.Load():
			return a, nil
		}
		// Its queue was deleted (and maybe made again).
		s.forget(a)
		s.drop(a)
	}
	a = &Attachment{s: s, id: id, member: fmt.Sprintf("%s.%d", s.id, id), ex: ex, role: rolePuller, serviceTag: sub, tq: tq}
	c, err := tq.q.AddPuller(a.member)
	if err != nil {
		return nil, queueError("get from "+tq.Name(), err)
	}
	a.consumer.Store(c)
	s.mu.Lock()
	if err, closed := s.roomFor(a), s.closed; err != nil || closed {
		s.mu.Unlock()
		tq.q.RemoveConsumer(c)
		if closed {
			return nil, wire.Errorf(wire.CodeCancelled, "get: the connection closed")
		}
		return nil, err
	}
	s.attachments[id] = a
	s.mu.Unlock()
	return a, nil
}
