package queue

// ReasonPurged: the queue was purged (see [Queue.Purge]).
const ReasonPurged Reason = "purged"

// Purge removes every message that is not in flight: ready, delayed and
// backing off. Their records are released and their watchers get
// EventFailed with [ReasonPurged]; they are not dead-lettered. Messages in
// flight stay, as RabbitMQ's purge leaves unacknowledged ones. It returns
// how many messages it removed. Messages whose index is in runs are
// purged too; it reads their runs, with the queue's lock held.
func (q *Queue) Purge() (int, error) {
	q.lock()
	if q.closed {
		q.mu.Unlock()
		return 0, ErrClosed
	}
	spilled := q.purgeRuns()
	var list []*message
	for _, m := range q.index {
		if m.st != stInflight {
			list = append(list, m)
		}
	}
	for _, m := range list {
		switch m.st {
		case stReady:
			q.unready(m)
			q.stats.ready.Add(-1)
		case stDelayed, stBackoff:
			q.stats.delayed.Add(-1)
		}
		if m.hidx >= 0 {
			q.timers.remove(m)
		}
		if k := m.ks; k != nil && k.busy == m {
			k.busy = nil
			q.routeKey(k)
		}
		m.ks = nil
		q.notify(m.id, Event{Kind: EventFailed, Attempts: m.attempts, Reason: ReasonPurged}, true)
		if err := q.release(m); err != nil {
			q.log.Error("queue: journal failed on a purge", "queue", q.name, "id", m.id, "err", err)
		}
		q.drop(m)
	}
	q.finish(q.now())
	return spilled + len(list), nil
}
