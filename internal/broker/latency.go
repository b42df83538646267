package broker

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// A request-response exchange keeps a histogram of its requests' times,
// from a request's arrival at the broker to its last response leaving
// it. The cost on the request path is two reads of the monotonic clock
// (at the arrival and at the last response) and two atomic adds (the
// bucket and the sum); nothing is allocated. Buckets are powers of two
// of a microsecond, so that finding one is a bit count.

// LatencyBuckets is the number of bounded buckets of a [Latency]: their
// upper bounds are 1µs, 2µs, 4µs ... 2^(LatencyBuckets-1) µs (about 8.4
// s); one more bucket counts what is slower.
const LatencyBuckets = 24

// LatencyBound returns the upper bound of bucket i.
func LatencyBound(i int) time.Duration { return time.Microsecond << i }

// Latency is a histogram of request times, safe for concurrent use.
type Latency struct {
	counts [LatencyBuckets + 1]atomic.Uint64
	sum    atomic.Uint64 // nanoseconds
}

// observe records a request that took d nanoseconds.
func (h *Latency) observe(d int64) {
	i := 0
	if d > 1000 {
		// (d-1)/1000 in [2^(i-1), 2^i) for d in (2^(i-1) µs, 2^i µs].
		i = min(bits.Len64(uint64(d-1)/1000), LatencyBuckets)
	} else if d < 0 {
		d = 0
	}
	h.counts[i].Add(1)
	h.sum.Add(uint64(d))
}

// LatencySnapshot is a reading of a [Latency]: Counts[i] requests took
// at most LatencyBound(i) (and more than the bound before), the last
// more than every bound.
type LatencySnapshot struct {
	Counts [LatencyBuckets + 1]uint64
	Sum    time.Duration
}

// Count returns the number of requests.
func (s *LatencySnapshot) Count() uint64 {
	var n uint64
	for _, c := range s.Counts {
		n += c
	}
	return n
}

// AddTo adds the histogram's counts to s. It reads atomics: a request
// recorded meanwhile may be in the buckets and not yet in the sum.
func (h *Latency) AddTo(s *LatencySnapshot) {
	for i := range h.counts {
		s.Counts[i] += h.counts[i].Load()
	}
	s.Sum += time.Duration(h.sum.Load())
}

// Add adds o to s.
func (s *LatencySnapshot) Add(o *LatencySnapshot) {
	for i := range s.Counts {
		s.Counts[i] += o.Counts[i]
	}
	s.Sum += o.Sum
}

// epoch is the origin of monoNow.
var epoch = time.Now()

// monoNow reads the monotonic clock, in ns since the process started
// (time.Since reads only the monotonic clock).
func monoNow() int64 { return int64(time.Since(epoch)) }
