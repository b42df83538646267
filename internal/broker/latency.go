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
// bucket and the sum, in the stripe of the handler that answered);
// nothing is allocated. Buckets are powers of two of a microsecond, so
// that finding one is a bit count.

// LatencyBuckets is the number of bounded buckets of a [Latency]: their
// upper bounds are 1µs, 2µs, 4µs ... 2^(LatencyBuckets-1) µs (about 8.4
// s); one more bucket counts what is slower.
const LatencyBuckets = 24

// LatencyBound returns the upper bound of bucket i.
func LatencyBound(i int) time.Duration { return time.Microsecond << i }

// Latency is a histogram of request times, safe for concurrent use. It
// is striped: each handler records into the stripe of its attachment, so
// handlers on different cores do not take turns at one cache line, and
// a reading adds the stripes up.
type Latency struct {
	stripes [latencyStripes]latencyStripe
}

// latencyStripes is the number of stripes of a [Latency] (a power of two).
const latencyStripes = 4

type latencyStripe struct {
	counts [LatencyBuckets + 1]atomic.Uint64
	sum    atomic.Uint64 // nanoseconds
	_      [48]byte      // 208+48: stripes on separate cache lines
}

// observe records, in stripe, a request that took d nanoseconds.
func (h *Latency) observe(stripe uint32, d int64) {
	i := 0
	if d > 1000 {
		// (d-1)/1000 in [2^(i-1), 2^i) for d in (2^(i-1) µs, 2^i µs].
		i = min(bits.Len64(uint64(d-1)/1000), LatencyBuckets)
	} else if d < 0 {
		d = 0
	}
	st := &h.stripes[stripe&(latencyStripes-1)]
	st.counts[i].Add(1)
	st.sum.Add(uint64(d))
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
	for k := range h.stripes {
		st := &h.stripes[k]
		for i := range st.counts {
			s.Counts[i] += st.counts[i].Load()
		}
		s.Sum += time.Duration(st.sum.Load())
	}
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
