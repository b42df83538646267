package meta

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// benchOp runs op b.N times on a 3-node cluster and reports the p50 and
// p99 latency besides the mean.
func benchOp(b *testing.B, onLeader bool, op func(ctx context.Context, m *Meta, i int) error) {
	c := newCluster(b, 3, nil)
	m := c.follower()
	if onLeader {
		m = c.leader()
	}
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if err := op(ctx, m, i); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

func declareN(ctx context.Context, m *Meta, i int) error {
	_, _, err := m.Declare(ctx, fmt.Sprintf("bench.%d", i), reqresp(""), DeclareOptions{})
	return err
}

func BenchmarkDeclareOnFollower(b *testing.B) { benchOp(b, false, declareN) }
func BenchmarkDeclareOnLeader(b *testing.B)   { benchOp(b, true, declareN) }

func BenchmarkGetOnFollower(b *testing.B) {
	benchOp(b, false, func(ctx context.Context, m *Meta, i int) error {
		_, _, err := m.Get(ctx, "bench.0")
		return err
	})
}

// BenchmarkDeclareConcurrentOnFollower has 32 callers declare at once
// through one follower: forwarded over the pipelined connection, batched
// by the leader's group commit. It reports the declares per second and
// each one's p50 and p99.
func BenchmarkDeclareConcurrentOnFollower(b *testing.B) {
	c := newCluster(b, 3, nil)
	m := c.follower()
	ctx := context.Background()
	const callers = 32
	lat := make([]time.Duration, b.N)
	next := make(chan int, b.N)
	for i := range b.N {
		next <- i
	}
	close(next)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				t0 := time.Now()
				if err := declareN(ctx, m, i); err != nil {
					b.Error(err)
					return
				}
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/took.Seconds(), "declares/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
