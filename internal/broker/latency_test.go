package broker

import (
	"testing"
	"time"
)

func TestLatencyBuckets(t *testing.T) {
	var h Latency
	for _, tc := range []struct {
		d      time.Duration
		bucket int
	}{
		{-5, 0}, {0, 0}, {999, 0}, {time.Microsecond, 0},
		{time.Microsecond + 1, 1}, {2 * time.Microsecond, 1},
		{2*time.Microsecond + 1, 2}, {3 * time.Microsecond, 2}, {4 * time.Microsecond, 2},
		{time.Millisecond, 10}, // 1000 µs: over 512, at most 1024
		{LatencyBound(LatencyBuckets - 1), LatencyBuckets - 1},
		{LatencyBound(LatencyBuckets-1) + 1, LatencyBuckets},
		{time.Hour, LatencyBuckets},
	} {
		var before, after LatencySnapshot
		h.AddTo(&before)
		h.observe(uint32(tc.bucket), int64(tc.d)) // stripes add up
		h.AddTo(&after)
		for i := range after.Counts {
			want := before.Counts[i]
			if i == tc.bucket {
				want++
			}
			if after.Counts[i] != want {
				t.Errorf("%v: bucket %d went from %d to %d", tc.d, i, before.Counts[i], after.Counts[i])
			}
		}
		if got := after.Sum - before.Sum; got != max(tc.d, 0) {
			t.Errorf("%v: sum grew by %v", tc.d, got)
		}
		if tc.bucket < LatencyBuckets && tc.d > LatencyBound(tc.bucket) {
			t.Errorf("%v is over its bucket's bound %v", tc.d, LatencyBound(tc.bucket))
		}
	}
	var s LatencySnapshot
	h.AddTo(&s)
	s.Add(&s)
	if s.Count() != 26 {
		t.Errorf("count %d, want 26", s.Count())
	}
}
