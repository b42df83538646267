package queue

// ReasonMaxLength: the queue was full and dropped the message to make
// room for a new one (see [Queue.DropHead]).
const ReasonMaxLength Reason = "max length"

// DropHead dead-letters, with [ReasonMaxLength], the oldest ready message
// of the lowest priority level that has one, to make room in a bounded
// queue (RabbitMQ's drop-head overflow). Messages with a key, delayed
// ones and those in flight are never dropped. It reports whether it
// dropped one.
func (q *Queue) DropHead() (bool, error) {
	q.lock()
	if q.closed {
		q.mu.Unlock()
		return false, ErrClosed
	}
	var m *message
	for p := 0; p < numPriorities && m == nil; p++ {
		if q.readyMask&(1<<p) != 0 {
			m = q.front(p)
		}
	}
	if m == nil {
		q.unlock()
		return false, nil
	}
	q.unready(m)
	q.stats.ready.Add(-1)
	q.deadLetter(m, ReasonMaxLength)
	q.finish(q.now())
	return true, nil
}
