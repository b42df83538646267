//go:build unix

package replica

import (
	"syscall"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/internal/testutil"
)

// BenchmarkIdleGroups measures what 1,000 idle groups cost: 3 in-process
// hosts (MemFS stores, MemNetwork), every group with a leader and no
// proposals, default tick (100 ms) and heartbeat (every tick). It
// reports the process's CPU over 5 s, per host, in percent of one core.
// Groups are not quiesced yet: every leader heartbeats every tick.
//
//	go test -run XXX -bench IdleGroups -benchtime 1x ./internal/cluster/replica/
func BenchmarkIdleGroups(b *testing.B) {
	const n = 1000
	net := NewMemNetwork()
	ids := []uint64{1, 2, 3}
	var all []*Group
	for _, id := range ids {
		h, err := NewHost(store.NewMemFS(), "/data", Config{ID: id, Transport: net.Transport(id)})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = h.Close() })
		for gid := GroupID(1); gid <= n; gid++ {
			g, err := h.Group(gid, ids, nopSM{})
			if err != nil {
				b.Fatal(err)
			}
			if id == 1 {
				all = append(all, g)
			}
		}
	}
	testutil.WaitForf(b, 5*time.Minute, func() bool {
		for _, g := range all {
			if l, _ := g.Leader(); l == 0 {
				return false
			}
		}
		return true
	}, "every group has a leader")
	b.ResetTimer()
	for range b.N {
		u0, wall0 := cpuTime(), time.Now()
		time.Sleep(5 * time.Second) // the measurement window
		cpu, wall := cpuTime()-u0, time.Since(wall0)
		b.ReportMetric(100*cpu.Seconds()/wall.Seconds()/float64(len(ids)), "cpu%/host")
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
