package broker

import "sync/atomic"

// Counter is a count that goroutines on several cores add to at once,
// split in stripes on cache lines of their own: each adds to the stripe
// its key picks, and a reading adds the stripes up. The key is a request
// id, whose low bits an embedded connection keeps the same for the
// requests of one core (see courier's call refs), so that a stripe stays
// with a core instead of moving between them at every request.
type Counter struct {
	s [counterStripes]struct {
		n atomic.Uint64
		_ [56]byte
	}
}

const counterStripes = shards

// Add adds d to the stripe of key.
func (c *Counter) Add(key, d uint64) { c.s[key&(counterStripes-1)].n.Add(d) }

// Load returns the count: the sum of the stripes.
func (c *Counter) Load() uint64 {
	var n uint64
	for i := range c.s {
		n += c.s[i].n.Load()
	}
	return n
}
