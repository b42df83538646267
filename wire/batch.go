package wire

import (
	"sync"
	"sync/atomic"
)

// Batch defers the writes of frames put while one goroutine works through
// a batch of input, such as a read loop through the frames of one read:
// they are appended to their outboxes at once but written when the batch
// ends, one write per connection rather than one per frame. A frame
// carries the Batch it was made under ([Frame.Batch]); only the goroutine
// that owns a Batch puts frames carrying it, and it must call
// [Batch.Flush] before it blocks for more input. Other goroutines may put
// frames carrying it too, as long as the owner flushes after them.
type Batch struct {
	mu   sync.Mutex // guards outs
	outs []*Outbox
	// n is len(outs), so that a batch with nothing deferred (the common
	// case of an embedded connection) is flushed without the lock.
	n atomic.Int32
}

// add notes o as holding deferred frames; o.mu is held.
func (b *Batch) add(o *Outbox) {
	if o.batch == b {
		return
	}
	o.batch = b
	b.mu.Lock()
	b.outs = append(b.outs, o)
	b.n.Store(int32(len(b.outs)))
	b.mu.Unlock()
}

// Flush starts the writes deferred so far. A batch that touched one
// connection writes it from this goroutine when the connection is idle (a
// request on its way to its handler); a batch that touched many hands
// them to their write loops, which then write in parallel (a fan-out).
func (b *Batch) Flush() {
	if b.n.Load() == 0 {
		return
	}
	b.mu.Lock()
	outs := b.outs
	if len(outs) == 0 {
		b.mu.Unlock()
		return
	}
	b.outs = nil
	b.n.Store(0)
	b.mu.Unlock()
	switch len(outs) {
	case 1:
		outs[0].flushBatch(b, true)
	default:
		for _, o := range outs {
			o.flushBatch(b, false)
		}
	}
	clear(outs)
	b.mu.Lock()
	if b.outs == nil {
		b.outs = outs[:0] // keep the capacity
	}
	b.mu.Unlock()
}

// Pending reports whether writes are deferred.
func (b *Batch) Pending() bool { return b.n.Load() > 0 }
