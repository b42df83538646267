//go:build unix

package replica

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
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
// Idle groups fall quiet: only the hosts' heartbeats remain.
//
//	go test -run XXX -bench IdleGroups -benchtime 1x ./internal/cluster/replica/
func BenchmarkIdleGroups(b *testing.B) {
	const n = 1000
	net := NewMemNetwork()
	ids := []uint64{1, 2, 3}
	var all []*Group
	var hosts []*Host
	for _, id := range ids {
		h, err := NewHost(store.NewMemFS(), "/data", Config{ID: id, Transport: net.Transport(id)})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = h.Close() })
		hosts = append(hosts, h)
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
	waitIdle(b, all, hosts)
	b.ResetTimer()
	for range b.N {
		u0, wall0 := cpuTime(), time.Now()
		time.Sleep(5 * time.Second) // the measurement window
		cpu, wall := cpuTime()-u0, time.Since(wall0)
		b.ReportMetric(100*cpu.Seconds()/wall.Seconds()/float64(len(ids)), "cpu%/host")
	}
}

// waitIdle waits until every group has a leader and every host's groups
// are quiet.
func waitIdle(tb testing.TB, groups []*Group, hosts []*Host) {
	tb.Helper()
	testutil.WaitForf(tb, 10*time.Minute, func() bool {
		for _, g := range groups {
			if l, _ := g.Leader(); l == 0 {
				return false
			}
		}
		for _, h := range hosts {
			if h.QuietStats().Awake != 0 {
				return false
			}
		}
		return true
	}, "every group led and quiet")
}

// TestIdleCost measures the "at rest" figures: N idle groups of 3
// replicas on 3 in-process hosts, each host with its own store.Log on
// disk (fsync on), default timing (100 ms tick, 1 s election timeout).
// It logs the CPU per host (the process's CPU over 10 s, divided by 3,
// in percent of one core), the memory per host (the process's RSS and
// Go heap, divided by 3), and the restart time of one host: NewHost plus
// Host.Group for its N groups, then until each of them knows a leader.
// It runs only with COURIER_IDLE_GROUPS set (the number of groups):
//
//	COURIER_IDLE_GROUPS=10000 go test -run TestIdleCost -v -timeout 30m ./internal/cluster/replica/
func TestIdleCost(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("COURIER_IDLE_GROUPS"))
	if n <= 0 {
		t.Skip("set COURIER_IDLE_GROUPS to the number of groups")
	}
	dir := t.TempDir()
	net := NewMemNetwork()
	ids := []uint64{1, 2, 3}
	hosts := map[uint64]*Host{}
	var all []*Group
	openHost := func(id uint64, peers []uint64) []*Group {
		h, err := NewHost(store.OSFS{}, filepath.Join(dir, strconv.FormatUint(id, 10)), Config{ID: id, Transport: net.Transport(id)})
		if err != nil {
			t.Fatal(err)
		}
		hosts[id] = h
		gs := make([]*Group, n)
		var wg sync.WaitGroup
		next := make(chan int, n)
		for i := range n {
			next <- i
		}
		close(next)
		for range 64 { // concurrent opens share the store's group commits
			wg.Go(func() {
				for i := range next {
					g, err := h.Group(GroupID(i+1), peers, nopSM{})
					if err != nil {
						t.Error(err)
						return
					}
					gs[i] = g
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		return gs
	}
	start := time.Now()
	perHost := map[uint64][]*Group{}
	for _, id := range ids {
		gs := openHost(id, ids)
		perHost[id] = gs
		if id == 1 {
			all = gs
		}
	}
	t.Logf("%d groups created on 3 hosts in %v", n, time.Since(start))
	hs := []*Host{hosts[1], hosts[2], hosts[3]}
	waitIdle(t, all, hs)
	t.Logf("all led and quiet after %v", time.Since(start))
	// Each host leads a third, as placement would have it: the restart
	// below then has a third of the groups to elect (or hand over).
	var wg sync.WaitGroup
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	for range 64 {
		wg.Go(func() {
			for i := range next {
				to := ids[i%len(ids)]
				if l, _ := all[i].Leader(); l != 0 && l != to {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					_ = perHost[l][i].TransferLeadership(ctx, to)
					cancel()
				}
			}
		})
	}
	wg.Wait()
	waitIdle(t, all, hs)
	led := map[uint64]int{}
	for _, g := range all {
		l, _ := g.Leader()
		led[l]++
	}
	t.Logf("leaders spread after %v: %v", time.Since(start), led)
	t.Cleanup(func() {
		for _, h := range hosts {
			_ = h.Close()
		}
	})

	runtime.GC()
	const window = 10 * time.Second
	u0, wall0 := cpuTime(), time.Now()
	time.Sleep(window) // the measurement window
	cpu, wall := cpuTime()-u0, time.Since(wall0)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss := rssBytes()
	t.Logf("idle: %.2f%% of a core per host; RSS %.0f MB per host (process %.0f MB / 3); Go heap in use %.0f MB per host; %d goroutines",
		100*cpu.Seconds()/wall.Seconds()/3, float64(rss)/3/1e6, float64(rss)/1e6, float64(ms.HeapInuse)/3/1e6, runtime.NumGoroutine())
	for _, id := range ids {
		t.Logf("host %d: %+v", id, hosts[id].QuietStats())
	}

	// Restart host 3: gracefully with COURIER_IDLE_HANDOVER set (its
	// leaderships handed over first), else at once.
	if os.Getenv("COURIER_IDLE_HANDOVER") != "" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		h0 := time.Now()
		led, left, err := hosts[3].HandOver(ctx)
		cancel()
		t.Logf("host 3 handed over %d leaderships (%d left, %v) in %v", led, left, err, time.Since(h0))
	}
	net.Remove(3)
	if err := hosts[3].Close(); err != nil {
		t.Fatal(err)
	}
	if path := os.Getenv("COURIER_IDLE_PROFILE"); path != "" {
		// A CPU profile of the restart alone.
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	t0 := time.Now()
	gs := openHost(3, nil)
	opened := time.Since(t0)
	testutil.WaitForf(t, 10*time.Minute, func() bool {
		for _, g := range gs {
			if l, _ := g.Leader(); l == 0 {
				return false
			}
		}
		return true
	}, "every group of the restarted host knows a leader")
	t.Logf("restart of host 3 with %d groups: open %v, every group knows its leader after %v", n, opened, time.Since(t0))
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rssBytes is the process's resident set size, from /proc (0 elsewhere).
func rssBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if f := bytes.Fields(line); len(f) >= 2 && string(f[0]) == "VmRSS:" {
			kb, _ := strconv.ParseInt(string(f[1]), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// TestRestartCost measures the restart of one host with N groups of one
// replica (no peers: the cost of opening the host and its groups alone).
// It runs only with COURIER_RESTART_GROUPS set (the number of groups):
//
//	COURIER_RESTART_GROUPS=10000 go test -run TestRestartCost -v ./internal/cluster/replica/
func TestRestartCost(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("COURIER_RESTART_GROUPS"))
	if n <= 0 {
		t.Skip("set COURIER_RESTART_GROUPS to the number of groups")
	}
	dir := t.TempDir()
	net := NewMemNetwork()
	open := func(peers []uint64) (*Host, time.Duration, time.Duration) {
		t0 := time.Now()
		h, err := NewHost(store.OSFS{}, dir, Config{ID: 1, Transport: net.Transport(1)})
		if err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		var wg sync.WaitGroup
		next := make(chan int, n)
		for i := range n {
			next <- i
		}
		close(next)
		for range 64 {
			wg.Go(func() {
				for i := range next {
					if _, err := h.Group(GroupID(i+1), peers, nopSM{}); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return h, t1.Sub(t0), time.Since(t1)
	}
	h, _, _ := open([]uint64{1})
	testutil.WaitForf(t, 10*time.Minute, func() bool { return h.QuietStats().Awake == 0 }, "all quiet")
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	h, host, groups := open(nil)
	defer h.Close()
	t.Logf("restart with %d groups: NewHost %v, Host.Group for all %v", n, host, groups)
}
