package queue

import (
	"sync"
	"sync/atomic"
	"unsafe"
)

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
	Deduplicated uint64 // enqueues of a (producer, seq) the window held: not stored again
	DedupPairs   int64  // (producer, seq) pairs the dedup window holds
}

// Messages is the queue's depth: ready, unacked and delayed.
func (s Stats) Messages() int64 { return s.Ready + s.Unacked + s.Delayed }

// Summary is the part of [Stats] that a queue listing shows: the
// figures that [Counters.Summary] reads from one cache line.
type Summary struct {
	Ready, Unacked, Delayed, Consumers, Resident int64
	Published, Delivered, Acked                  uint64
}

// Counters is the block of atomics behind the figures of a queue's
// [Summary], written under the queue's lock and read without it. A
// listing of every queue reads one block a queue, so the blocks are laid
// out for it: a block is one cache line, and the blocks of a node's
// queues are allocated side by side in slabs (see newCounters) rather
// than inside each queue's own struct, so that listing 100,000 queues
// touches 100,000 lines in 6.4 MB, not two lines in each of 100,000
// structs spread over the heap. The other counters of [Stats] are in
// the queue (coldCounters).
//
// A block outlives its queue as long as someone holds it (the management
// API keeps them between samples); a deleted queue's block keeps its
// last figures.
type Counters struct {
	ready, unacked, delayed, consumers, resident atomic.Int64
	published, delivered, acked                  atomic.Uint64
}

// coldCounters are the atomics behind the rest of [Stats]. Written under
// Queue.mu, read without it.
type coldCounters struct {
	keys, bytes, pagedOut, spilled     atomic.Int64
	redelivered, deadLettered, expired atomic.Uint64
	deduplicated                       atomic.Uint64
	dedupHeld                          atomic.Int64
}

// cacheLine is the cache line size the layout of [Counters] assumes.
const cacheLine = 64

var _ [0]struct{} = [unsafe.Sizeof(Counters{}) - cacheLine]struct{}{}

// countersPerSlab is how many blocks one slab holds: 8 KiB, which the
// Go allocator aligns to 8 KiB, so that every block is one cache line.
const countersPerSlab = 8192 / cacheLine

// slab hands out the blocks of [Counters]. Blocks are never reused: a
// slab is freed by the garbage collector once none of its blocks is
// referenced, so a reader holding the block of a deleted queue never sees
// another queue's figures in it. The cost is that a live queue keeps its
// whole slab (8 KiB) alive; with queues created and deleted at random
// that is at most 8 KiB a live queue, and in practice far less, since
// queues created together tend to live together.
var slab struct {
	mu   sync.Mutex // guards free
	free []Counters // the rest of the current slab
}

// newCounters returns a zeroed block from the current slab.
func newCounters() *Counters {
	slab.mu.Lock()
	defer slab.mu.Unlock()
	if len(slab.free) == 0 {
		slab.free = make([]Counters, countersPerSlab)
	}
	c := &slab.free[0]
	slab.free = slab.free[1:]
	return c
}

// Counters returns the queue's block of counters, to read its figures
// without going through the queue (see [Counters.Summary]). The block
// stays the queue's for its life.
func (q *Queue) Counters() *Counters { return q.stats }

// Stats returns the queue's counters without taking its lock.
func (q *Queue) Stats() Stats {
	c, k := q.stats, &q.cold
	return Stats{
		Ready:        c.ready.Load(),
		Unacked:      c.unacked.Load(),
		Delayed:      c.delayed.Load(),
		Consumers:    c.consumers.Load(),
		Keys:         k.keys.Load(),
		Bytes:        k.bytes.Load(),
		Resident:     c.resident.Load(),
		PagedOut:     k.pagedOut.Load(),
		Spilled:      k.spilled.Load(),
		Published:    c.published.Load(),
		Delivered:    c.delivered.Load(),
		Redelivered:  k.redelivered.Load(),
		Acked:        c.acked.Load(),
		DeadLettered: k.deadLettered.Load(),
		Expired:      k.expired.Load(),
		Deduplicated: k.deduplicated.Load(),
		DedupPairs:   k.dedupHeld.Load(),
	}
}

// Summary reads the counters a listing shows: one cache line. Like [Queue.Stats] it takes no lock.
func (c *Counters) Summary() Summary {
	return Summary{
		Ready:     c.ready.Load(),
		Unacked:   c.unacked.Load(),
		Delayed:   c.delayed.Load(),
		Consumers: c.consumers.Load(),
		Resident:  c.resident.Load(),
		Published: c.published.Load(),
		Delivered: c.delivered.Load(),
		Acked:     c.acked.Load(),
	}
}
