package queue

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/store"
)

// The classic persister stress test, on one durable queue on the real
// store: each iteration publishes two 1 KiB messages with confirms (up
// to backlogWindow unconfirmed, as a publisher with confirms in flight)
// and receives and acks one (a consumer with prefetch 10), so the queue
// grows by one message an iteration. It prints the iteration rate and
// the process's resident memory every 50,000 iterations, then measures
// a restart (store.Open, replay, rebuild) at that depth. It runs only
// when asked:
//
//	COURIER_BACKLOG_DEPTH=1000000 go test -run TestBacklog -v -timeout 2h ./internal/queue
//
// COURIER_BACKLOG_BUDGET sets the memory budget in MiB (default 48);
// COURIER_BACKLOG_DIR the log's directory (default a temporary one on
// /tmp's disk). Run with GOMEMLIMIT to bound the Go heap as the broker
// does from its budget (e.g. GOMEMLIMIT=72MiB).
const backlogWindow = 2000

func TestBacklog(t *testing.T) {
	depth, _ := strconv.Atoi(os.Getenv("COURIER_BACKLOG_DEPTH"))
	if depth <= 0 {
		t.Skip("set COURIER_BACKLOG_DEPTH to run")
	}
	budget := int64(48)
	if s := os.Getenv("COURIER_BACKLOG_BUDGET"); s != "" {
		budget, _ = strconv.ParseInt(s, 10, 64)
	}
	dir := os.Getenv("COURIER_BACKLOG_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	log, _, err := store.Open(store.OSFS{}, dir, store.DefaultOptions())
	must(t, err)
	mem := NewMemory(budget << 20)
	sched := NewScheduler(SchedulerOptions{})
	defer sched.Close()
	cfg := DefaultConfig()
	cfg.Scheduler, cfg.Journal, cfg.Memory = sched, StoreJournal{log, 1}, mem
	q, err := New("backlog", cfg)
	must(t, err)

	deliveries := make(chan Delivery, 16)
	c, err := q.AddConsumer("c", ConsumerConfig{Prefetch: 10, Deliver: func(d Delivery) { deliveries <- d }})
	must(t, err)

	// Checkpoints every 2 s or 32 MiB of log, whichever comes first, as
	// the broker should take them: a restart replays what was written
	// since the last one.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		lastAt, lastBytes := time.Now(), uint64(0)
		for {
			select {
			case <-stop:
				return
			case now := <-tick.C:
				if b := log.Stats().AppendedBytes; now.Sub(lastAt) < 2*time.Second && b-lastBytes < 32<<20 {
					continue
				}
				if _, err := log.Checkpoint(func(store.Pos) ([]byte, error) { return q.AppendSnapshot(nil), nil }); err != nil {
					t.Error(err)
					return
				}
				lastAt, lastBytes = time.Now(), log.Stats().AppendedBytes
			}
		}
	}()

	window := make(chan struct{}, backlogWindow)
	var failed error
	var failMu sync.Mutex
	confirm := func(err error) {
		if err != nil {
			failMu.Lock()
			failed = err
			failMu.Unlock()
		}
		<-window
	}
	body := bytes.Repeat([]byte("x"), 1024)
	start := time.Now()
	last, lastAt := 0, start
	t.Logf("budget %d MiB, GOMEMLIMIT %s, dir %s", budget, os.Getenv("GOMEMLIMIT"), dir)
	for i := 1; i <= depth; i++ {
		for range 2 {
			window <- struct{}{}
			if _, err := q.Enqueue(Message{Body: body}, confirm, nil); err != nil {
				t.Fatal(err)
			}
		}
		d := <-deliveries
		if len(d.Body) != 1024 {
			t.Fatalf("message %d delivered with %d bytes", d.ID, len(d.Body))
		}
		must(t, q.Ack(c, d.ID))
		if i%50_000 == 0 {
			now := time.Now()
			s, ms, ls := q.Stats(), mem.Stats(), log.Stats()
			t.Logf("%9d it  %7.0f it/s (%7.0f overall)  RSS %5.1f MiB  heap %5.1f MiB  depth %d  accounted %4.1f MiB  spilled %d  paged %d  disk %5.0f MiB  runs %d",
				i, float64(i-last)/now.Sub(lastAt).Seconds(), float64(i)/now.Sub(start).Seconds(),
				float64(rss())/(1<<20), float64(heapInUse())/(1<<20), s.Messages(), float64(ms.Used)/(1<<20),
				s.Spilled, s.PagedOut, float64(ls.DiskBytes)/(1<<20), ls.Runs)
			last, lastAt = i, now
		}
	}
	for range backlogWindow {
		window <- struct{}{}
	}
	close(stop)
	wg.Wait()
	if failed != nil {
		t.Fatal(failed)
	}
	elapsed := time.Since(start)
	t.Logf("%d iterations in %v: %.0f it/s; depth %d; RSS %.1f MiB", depth, elapsed.Round(time.Millisecond),
		float64(depth)/elapsed.Seconds(), q.Stats().Messages(), float64(rss())/(1<<20))

	// A restart at this depth, as after kill -9: no checkpoint at the
	// end, so the log since the last periodic one is replayed.
	want := q.Stats().Messages()
	must(t, log.Sync())
	q.Close()
	must(t, log.Close())
	t0 := time.Now()
	log2, rec, err := store.Open(store.OSFS{}, dir, store.DefaultOptions())
	must(t, err)
	defer log2.Close()
	t1 := time.Now()
	rb := NewRebuilder()
	rb.LazyBodies = true
	if rec.State != nil {
		must(t, rb.LoadSnapshot(rec.State))
	}
	_, err = ReplayLog(log2, func(uint32) *Rebuilder { return rb })
	must(t, err)
	t2 := time.Now()
	cfg.Journal = StoreJournal{log2, 1}
	r, err := rb.Build("backlog", cfg)
	must(t, err)
	t3 := time.Now()
	t.Logf("restart at depth %d: %v (open %v, replay %v of %d records / %.0f MiB, rebuild %v); %d messages back, %d spilled, RSS %.1f MiB",
		want, t3.Sub(t0).Round(time.Microsecond), t1.Sub(t0).Round(time.Microsecond), t2.Sub(t1).Round(time.Microsecond),
		rec.ReplayRecords, float64(rec.ReplayBytes)/(1<<20), t3.Sub(t2).Round(time.Microsecond), r.Stats().Messages(),
		r.Stats().Spilled, float64(rss())/(1<<20))
	if got := r.Stats().Messages(); got < want {
		t.Fatalf("%d messages after the restart, %d before", got, want)
	}
	// And it delivers.
	got := make(chan Delivery, 128)
	c2, err := r.AddConsumer("after", ConsumerConfig{Prefetch: 100, Deliver: func(d Delivery) { got <- d }})
	must(t, err)
	for range 1000 {
		d := <-got
		if len(d.Body) != 1024 {
			t.Fatalf("message %d with %d bytes after the restart", d.ID, len(d.Body))
		}
		must(t, r.Ack(c2, d.ID))
	}
}

// rss is the process's resident set size, from /proc/self/status.
func rss() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kb int64
		if n, _ := fmt.Sscanf(sc.Text(), "VmRSS: %d kB", &kb); n == 1 {
			return kb << 10
		}
	}
	return -1
}

func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// TestBacklogStaysInBudget is a small TestBacklog that CI runs: 30,000
// queued 1 KiB messages (30 MiB of bodies, 7 MiB of index if nothing
// paged) on the real store under a 4 MiB budget. The accounted bytes
// never pass the budget, and the live heap stays far below what the
// queue holds.
func TestBacklogStaysInBudget(t *testing.T) {
	opts := store.DefaultOptions()
	opts.MaxPending = 1 << 20
	log, _, err := store.Open(store.OSFS{}, t.TempDir(), opts)
	must(t, err)
	defer log.Close()
	mem := NewMemory(4 << 20)
	sched := NewScheduler(SchedulerOptions{})
	defer sched.Close()
	cfg := DefaultConfig()
	cfg.Scheduler, cfg.Journal, cfg.Memory = sched, StoreJournal{log, 1}, mem
	q, err := New("backlog", cfg)
	must(t, err)
	deliveries := make(chan Delivery, 16)
	c, err := q.AddConsumer("c", ConsumerConfig{Prefetch: 10, Deliver: func(d Delivery) { deliveries <- d }})
	must(t, err)
	body := bytes.Repeat([]byte("x"), 1024)
	var confirms sync.WaitGroup
	const depth = 30_000
	for i := 1; i <= depth; i++ {
		for range 2 {
			confirms.Add(1)
			if _, err := q.Enqueue(Message{Body: body}, func(err error) {
				if err != nil {
					t.Error(err)
				}
				confirms.Done()
			}, nil); err != nil {
				t.Fatal(err)
			}
		}
		d := <-deliveries
		if len(d.Body) != 1024 {
			t.Fatalf("message %d with %d bytes", d.ID, len(d.Body))
		}
		must(t, q.Ack(c, d.ID))
		if used := mem.Used(); used > mem.Limit() {
			t.Fatalf("iteration %d: %d bytes accounted, budget %d", i, used, mem.Limit())
		}
		if i%5000 == 0 {
			_, err := log.Checkpoint(func(store.Pos) ([]byte, error) { return q.AppendSnapshot(nil), nil })
			must(t, err)
		}
	}
	confirms.Wait()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := q.Stats()
	t.Logf("depth %d: %d spilled, %d paged out, accounted %d KiB, live heap %d KiB", s.Messages(), s.Spilled, s.PagedOut, mem.Used()>>10, ms.HeapAlloc>>10)
	if s.Messages() != depth || s.Spilled < depth/2 {
		t.Fatalf("stats %+v", s)
	}
	if ms.HeapAlloc > 24<<20 {
		t.Fatalf("live heap %d MiB with a 4 MiB budget", ms.HeapAlloc>>20)
	}
}
