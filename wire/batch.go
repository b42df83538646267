package wire

// Batch defers the writes of frames put while one goroutine works through
// a batch of input, such as a read loop through the frames of one read:
// they are appended to their outboxes at once but written when the batch
// ends, one write per connection rather than one per frame. A frame
// carries the Batch it was made under ([Frame.Batch]); only the goroutine
// that owns a Batch puts frames carrying it, and it must call
// [Batch.Flush] before it blocks for more input.
type Batch struct {
	outs []*Outbox
}

// add notes o as holding deferred frames; o.mu is held.
func (b *Batch) add(o *Outbox) {
	if o.batch == b {
		return
	}
	o.batch = b
	b.outs = append(b.outs, o)
}

// Flush starts the writes deferred so far. A batch that touched one
// connection writes it from this goroutine when the connection is idle (a
// request on its way to its handler); a batch that touched many hands
// them to their write loops, which then write in parallel (a fan-out).
func (b *Batch) Flush() {
	switch len(b.outs) {
	case 0:
		return
	case 1:
		b.outs[0].flushBatch(b, true)
	default:
		for _, o := range b.outs {
			o.flushBatch(b, false)
		}
	}
	clear(b.outs)
	b.outs = b.outs[:0]
}

// Pending reports whether writes are deferred.
func (b *Batch) Pending() bool { return len(b.outs) > 0 }
