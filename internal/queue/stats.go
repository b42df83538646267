package queue

import "sync/atomic"

// Stats are a queue's live counters, for the management API and metrics.
// Each is read atomically, without the queue's lock, so reading them
// never waits on a busy queue; they are not one consistent cut (a
// message moving from ready to unacked may be seen in both or neither).
type Stats struct {
	Ready     int64 // waiting and due: deliverable, or behind their key's message in flight
	Unacked   int64 // delivered, not yet acked or nacked
	Delayed   int64 // waiting for their due time or their backoff to end
	Consumers int64
	Keys      int64 // keys with messages due or in flight
	Bytes     int64 // body bytes of the messages held (ready, unacked, delayed)

	// Memory (see [Memory]).
	Resident int64 // bytes kept in RAM: index entries, bodies and headers not paged out
	PagedOut int64 // messages whose index is in RAM and body only on disk
	Spilled  int64 // messages whose index too is only on disk (in runs)

	Published    uint64 // messages enqueued, ever
	Delivered    uint64 // deliveries, redeliveries included
	Redelivered  uint64 // deliveries of messages that had failed before
	Acked        uint64
	DeadLettered uint64 // for any reason, expiries included
	Expired      uint64 // dead-lettered for their TTL
}

// Messages is the queue's depth: ready, unacked and delayed.
func (s Stats) Messages() int64 { return s.Ready + s.Unacked + s.Delayed }

// counters are the atomics behind [Stats]. Written under Queue.mu, read
// without it.
type counters struct {
	ready, unacked, delayed, consumers, keys, bytes                 atomic.Int64
	resident, pagedOut, spilled                                     atomic.Int64
	published, delivered, redelivered, acked, deadLettered, expired atomic.Uint64
}

// Stats returns the queue's counters without taking its lock.
func (q *Queue) Stats() Stats {
	c := &q.stats
	return Stats{
		Ready:        c.ready.Load(),
		Unacked:      c.unacked.Load(),
		Delayed:      c.delayed.Load(),
		Consumers:    c.consumers.Load(),
		Keys:         c.keys.Load(),
		Bytes:        c.bytes.Load(),
		Resident:     c.resident.Load(),
		PagedOut:     c.pagedOut.Load(),
		Spilled:      c.spilled.Load(),
		Published:    c.published.Load(),
		Delivered:    c.delivered.Load(),
		Redelivered:  c.redelivered.Load(),
		Acked:        c.acked.Load(),
		DeadLettered: c.deadLettered.Load(),
		Expired:      c.expired.Load(),
	}
}
