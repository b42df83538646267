package queue

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSpillRoundTrip: a deep queue under a tiny budget spills its index
// to runs and reads it back; every message comes out once, in priority
// then FIFO order, with its body, headers and attempts.
func TestSpillRoundTrip(t *testing.T) {
	smallRuns(t)
	e := newEnv(t)
	mem := NewMemory(16 << 10)
	q := e.queue(func(c *Config) { c.Memory = mem })
	const n = 600
	want := map[uint8][]uint64{}
	for i := range n {
		m := Message{Body: body(i), Priority: uint8(i%3) * 4}
		if i%7 == 0 {
			m.Headers = map[string]string{"i": fmt.Sprint(i)}
		}
		id := mustEnqueue(t, q, m)
		want[m.Priority] = append(want[m.Priority], id)
		if err := q.check(); err != nil {
			t.Fatalf("after %d: %v", i, err)
		}
	}
	s := q.Stats()
	if s.Spilled == 0 || s.Ready != n {
		t.Fatalf("nothing spilled: %+v", s)
	}
	if s.Resident > 40<<10 {
		t.Fatalf("resident %d bytes with %d spilled", s.Resident, s.Spilled)
	}
	if ms := mem.Stats(); ms.Spilled != s.Spilled || ms.Used != s.Resident {
		t.Fatalf("budget %+v, queue %+v", ms, s)
	}
	d := q.dump(false)
	for p, ids := range want {
		if !slices.Equal(d.Levels[p], ids) {
			t.Fatalf("level %d: %v, want %v", p, d.Levels[p], ids)
		}
	}
	// Deliver with a nack now and then: retried messages come back with
	// their attempts, first in their level.
	w := addWorker(t, q, "w", 5)
	var got []Delivery
	nacked := map[uint64]bool{}
	for len(got) < n+len(nacked) {
		ds := w.take()
		if len(ds) == 0 {
			e.clk.Advance(time.Second)
			continue
		}
		for _, dl := range ds {
			i := int(dl.ID - 1)
			if string(dl.Body) != string(body(i)) || i%7 == 0 && dl.Headers["i"] != fmt.Sprint(i) {
				t.Fatalf("message %d: body %q headers %v", dl.ID, dl.Body, dl.Headers)
			}
			got = append(got, dl)
			if dl.ID%50 == 0 && !nacked[dl.ID] {
				nacked[dl.ID] = true
				must(t, q.Nack(w.Consumer, dl.ID, true))
				continue
			}
			if nacked[dl.ID] && dl.Attempts != 1 {
				t.Fatalf("message %d retried with attempts %d", dl.ID, dl.Attempts)
			}
			must(t, q.Ack(w.Consumer, dl.ID))
		}
		if err := q.check(); err != nil {
			t.Fatal(err)
		}
	}
	// First deliveries: by priority, FIFO within.
	var first []uint64
	seen := map[uint64]bool{}
	for _, dl := range got {
		if !seen[dl.ID] {
			seen[dl.ID] = true
			first = append(first, dl.ID)
		}
	}
	var order []uint64
	for _, p := range []uint8{8, 4, 0} {
		order = append(order, want[p]...)
	}
	// The consumer's prefetch lets the first few go before higher
	// priorities arrive; the order holds once the queue is full, which
	// it is before the worker attaches.
	if !slices.Equal(first, order) {
		t.Fatalf("first deliveries in the wrong order:\n got %v\nwant %v", first, order)
	}
	if s := q.Stats(); s.Messages() != 0 || s.Spilled != 0 || s.Resident != 0 {
		t.Fatalf("after draining: %+v", s)
	}
	if runs := e.j.Runs(); len(runs) != 0 {
		t.Fatalf("runs left: %v", runs)
	}
}

// TestSpillCheckpointReplay: a random workload on a queue that spills,
// checkpointed in the middle (the snapshot names its runs), rebuilds to
// the same state from the snapshot and the records after it, whatever
// was read back, acked or failed in between.
func TestSpillCheckpointReplay(t *testing.T) {
	smallRuns(t)
	seeds := uint64(20)
	if s := os.Getenv("COURIER_SPILL_SEEDS"); s != "" {
		seeds, _ = strconv.ParseUint(s, 10, 64)
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config()
			cfg.MaxAttempts = 4
			cfg.BackoffBase, cfg.BackoffMax = time.Second, 8*time.Second
			cfg.Memory = NewMemory(8 << 10)
			q, err := New("q", cfg)
			must(t, err)
			fill(t, q, seed, 300)
			workload(t, e, q, seed, 300)
			at := len(e.j.Records())
			workload(t, e, q, seed+100, 30)
			snap := q.AppendSnapshot(nil)
			spilledAtSnap := q.Stats().Spilled
			workload(t, e, q, seed+200, 600)
			before, inflight := q.dump(true), inflightIDs(q)
			must(t, q.Close())

			rb := NewRebuilder()
			must(t, rb.LoadSnapshot(snap))
			for _, r := range e.j.Crash().Records()[at:] {
				must(t, rb.Apply(Entry(r)))
			}
			r, err := rb.Build("q", cfg)
			must(t, err)
			if err := r.check(); err != nil {
				t.Fatal(err)
			}
			sameState(t, before, r.dump(false), inflight)
			t.Logf("spilled at the snapshot %d, at the end %d", spilledAtSnap, r.Stats().Spilled)
			drain(t, e, r)
		})
	}
}

// fill enqueues n plain messages over three priorities.
func fill(t *testing.T, q *Queue, seed uint64, n int) {
	for i := range n {
		mustEnqueue(t, q, Message{Body: fmt.Appendf(nil, "fill-%d-%d", seed, i), Priority: uint8(i%3) * 4})
	}
}

// drain consumes and acks everything and checks that the journal keeps
// no live record and no run.
func drain(t *testing.T, e *env, q *Queue) {
	t.Helper()
	w := addWorker(t, q, "drain", 1000)
	for range 200 {
		e.clk.Advance(time.Minute)
		for _, d := range w.take() {
			if len(d.Body) == 0 {
				t.Fatalf("message %d without its body", d.ID)
			}
			must(t, q.Ack(w.Consumer, d.ID))
		}
		if q.Stats().Messages() == 0 {
			break
		}
	}
	if s := q.Stats(); s.Messages() != 0 {
		t.Fatalf("left after draining: %+v", s)
	}
	if err := q.check(); err != nil {
		t.Fatal(err)
	}
	if n := e.j.Live(); n != 0 {
		t.Fatalf("%d journal records live after draining", n)
	}
	if runs := e.j.Runs(); len(runs) != 0 {
		t.Fatalf("runs left after draining: %v", runs)
	}
}

// TestPagingGrowsWithFill: bodies stay in RAM while the budget is under
// PageAt, and the share paged out grows as it fills.
func TestPagingGrowsWithFill(t *testing.T) {
	e := newEnv(t)
	mem := NewMemory(4 << 20)
	q := e.queue(func(c *Config) { c.Memory = mem })
	msg := Message{Body: make([]byte, 1024)}
	lastPaged := int64(0)
	reached := false
	for i := range 6000 {
		reached = reached || mem.Fill() >= PageAt
		mustEnqueue(t, q, msg)
		s := q.Stats()
		if !reached && s.PagedOut > 0 {
			t.Fatalf("paged at a fill of %.2f", mem.Fill())
		}
		if i%500 == 499 {
			t.Logf("%d messages: fill %.2f, paged %d, resident %d", i+1, mem.Fill(), s.PagedOut, s.Resident)
		}
		if s.PagedOut < lastPaged {
			t.Fatalf("paged out fell from %d to %d while filling", lastPaged, s.PagedOut)
		}
		lastPaged = s.PagedOut
	}
	if lastPaged == 0 || mem.Fill() > 1 {
		t.Fatalf("paged %d, fill %.2f", lastPaged, mem.Fill())
	}
	if err := q.check(); err != nil {
		t.Fatal(err)
	}
}

// TestBudgetBelowLimit: with a budget under the limit, a durable queue
// pages from half the budget and keeps to it however deep it grows,
// without slowing its publishers (the limit is far), while a transient
// queue on the same Memory holds past the budget up to the limit, where
// the alarm stops every publisher.
func TestBudgetBelowLimit(t *testing.T) {
	e := newEnv(t)
	const budget, limit = 4 << 20, 24 << 20
	mem := NewMemory(limit)
	mem.SetBudget(budget)
	if mem.Budget() != budget || mem.Limit() != limit {
		t.Fatalf("budget %d, limit %d", mem.Budget(), mem.Limit())
	}
	durable := e.queue(func(c *Config) { c.Memory = mem })
	msg := Message{Body: make([]byte, 1024)}
	for i := range 30_000 { // 30 MiB of bodies
		mustEnqueue(t, durable, msg)
		if used := mem.Used(); used > budget {
			t.Fatalf("message %d: %d bytes in RAM, budget %d", i, used, budget)
		}
	}
	s := durable.Stats()
	t.Logf("durable: %d messages, %d paged out, %d spilled, %d bytes in RAM", s.Messages(), s.PagedOut, s.Spilled, mem.Used())
	if s.PagedOut+s.Spilled < 25_000 || durable.Pressure() != 0 || mem.Alarm() {
		t.Fatalf("paged %d, spilled %d, pressure %.3f, alarm %v", s.PagedOut, s.Spilled, durable.Pressure(), mem.Alarm())
	}
	transient := e.queue(func(c *Config) { c.Memory, c.Journal = mem, nil })
	for mem.Used() < 2*budget {
		mustEnqueue(t, transient, msg)
	}
	if mem.Alarm() || transient.Pressure() != 0 {
		t.Fatalf("at %d bytes, twice the budget and under the limit: alarm %v, pressure %.3f", mem.Used(), mem.Alarm(), transient.Pressure())
	}
	for n := 0; !mem.Alarm(); n++ {
		if n > limit/1024 {
			t.Fatalf("no alarm at %d bytes", mem.Used())
		}
		mustEnqueue(t, transient, msg)
	}
	if mem.Used() < limit || durable.Pressure() != 1 || transient.Pressure() != 1 {
		t.Fatalf("alarm at %d bytes, limit %d; pressure %.3f / %.3f", mem.Used(), limit, durable.Pressure(), transient.Pressure())
	}
	// SetLimit keeps a budget set below it; a budget above the limit is
	// the limit.
	mem.SetLimit(48 << 20)
	if mem.Budget() != budget {
		t.Fatalf("budget %d after SetLimit", mem.Budget())
	}
	mem.SetBudget(64 << 20)
	if mem.Budget() != 48<<20 {
		t.Fatalf("budget %d over a limit of 48 MiB", mem.Budget())
	}
	if err := durable.check(); err != nil {
		t.Fatal(err)
	}
}

// TestPressure: a transient queue holding the memory is throttled first;
// the alarm stops everyone; a durable queue's disk alarm stops it.
func TestPressure(t *testing.T) {
	e := newEnv(t)
	mem := NewMemory(1 << 20)
	hog := e.queue(func(c *Config) { c.Memory, c.Journal = mem, nil })
	small := e.queue(func(c *Config) { c.Memory, c.Journal = mem, nil })
	mustEnqueue(t, small, Message{Body: make([]byte, 100)})
	for mem.Fill() < (ThrottleAt+1)/2 {
		mustEnqueue(t, hog, Message{Body: make([]byte, 4096)})
	}
	ph, ps := hog.Pressure(), small.Pressure()
	if !(ph > 0.3 && ps < ph/10) || mem.Alarm() {
		t.Fatalf("pressure hog %.3f small %.3f alarm %v", ph, ps, mem.Alarm())
	}
	for !mem.Alarm() {
		mustEnqueue(t, hog, Message{Body: make([]byte, 4096)})
	}
	if small.Pressure() != 1 || hog.Pressure() != 1 {
		t.Fatal("alarm does not stop every publisher")
	}
	w := addWorker(t, hog, "w", 1<<20)
	for _, d := range w.take() {
		must(t, hog.Ack(w.Consumer, d.ID))
	}
	if mem.Alarm() || hog.Pressure() != 0 {
		t.Fatalf("alarm %v, pressure %.3f after draining", mem.Alarm(), hog.Pressure())
	}
	dq := e.queue(func(c *Config) { c.Journal = alarmJournal{e.j} })
	if dq.Pressure() != 1 {
		t.Fatal("disk alarm does not stop a durable queue")
	}
}

type alarmJournal struct{ *MemJournal }

func (alarmJournal) DiskAlarm() bool { return true }

// TestMessageOverhead checks MessageOverhead against the heap a message
// takes in a queue.
func TestMessageOverhead(t *testing.T) {
	e := newEnv(t)
	q := e.queue(func(c *Config) { c.Journal = nil })
	const n = 100_000
	msg := Message{}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range n {
		mustEnqueue(t, q, msg)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes a message (MessageOverhead %d)", per, MessageOverhead)
	if per > MessageOverhead*1.3 || per < MessageOverhead*0.7 {
		t.Fatalf("a message takes %.0f bytes, MessageOverhead says %d", per, MessageOverhead)
	}
	runtime.KeepAlive(q)
}

// TestPurgeSpilled: Purge removes the messages in runs too, releases
// their records, tells their watchers, and drops the runs.
func TestPurgeSpilled(t *testing.T) {
	smallRuns(t)
	e := newEnv(t)
	q := e.queue(func(c *Config) { c.Memory = NewMemory(8 << 10) })
	failed := 0
	for i := range 300 {
		var watch WatchFunc
		if i%10 == 0 {
			watch = func(ev Event) {
				if ev.Kind == EventFailed && ev.Reason == ReasonPurged {
					failed++
				}
			}
		}
		if _, err := q.Enqueue(Message{Body: body(i), Priority: uint8(i % 2)}, nil, watch); err != nil {
			t.Fatal(err)
		}
	}
	w := addWorker(t, q, "w", 2)
	if s := q.Stats(); s.Spilled == 0 || s.Unacked != 2 {
		t.Fatalf("stats %+v", s)
	}
	n, err := q.Purge()
	must(t, err)
	if n != 298 || failed != 30-countWatched(w.take()) {
		t.Fatalf("purged %d, %d watchers told", n, failed)
	}
	if s := q.Stats(); s.Messages() != 2 || s.Spilled != 0 || s.Bytes != int64(len(body(0))+len(body(1))) {
		t.Fatalf("after the purge: %+v", s)
	}
	if err := q.check(); err != nil {
		t.Fatal(err)
	}
	if e.j.Live() != 2 || len(e.j.Runs()) != 0 {
		t.Fatalf("%d records live, runs %v", e.j.Live(), e.j.Runs())
	}
	fill(t, q, 1, 100)
	if err := q.check(); err != nil {
		t.Fatal(err)
	}
}

// countWatched counts the deliveries of watched messages (every tenth).
func countWatched(ds []Delivery) int {
	n := 0
	for _, d := range ds {
		if (d.ID-1)%10 == 0 {
			n++
		}
	}
	return n
}

// brokenRuns is a journal whose runs cannot be read back.
type brokenRuns struct{ *MemJournal }

func (brokenRuns) ReadRun(uint32, int64, []byte) (int, error) { return 0, errors.New("disk gone") }

// TestUnreadableRun: a run that cannot be read back loses its messages
// to the queue (logged); the queue goes on with the others and its
// counters stay right.
func TestUnreadableRun(t *testing.T) {
	smallRuns(t)
	e := newEnv(t)
	q := e.queue(func(c *Config) { c.Memory, c.Journal = NewMemory(8<<10), brokenRuns{e.j} })
	for i := range 200 {
		mustEnqueue(t, q, Message{Body: body(i)})
	}
	if q.Stats().Spilled == 0 {
		t.Fatal("nothing spilled")
	}
	w := addWorker(t, q, "w", 1000)
	n := 0
	for range 10 {
		for _, d := range w.take() {
			must(t, q.Ack(w.Consumer, d.ID))
			n++
		}
	}
	if err := q.check(); err != nil {
		t.Fatal(err)
	}
	if s := q.Stats(); s.Messages() != 0 || n == 0 || n == 200 {
		t.Fatalf("delivered %d; stats %+v", n, s)
	}
}

// TestDamagedRunHeader: a run whose header fails its checksum is not
// read, although its entries check (the file is not known to be the run
// the queue wrote): its messages are lost to the queue, the log says why,
// and the queue goes on with the other runs with its counters right.
func TestDamagedRunHeader(t *testing.T) {
	smallRuns(t)
	e := newEnv(t)
	var logged strings.Builder
	q := e.queue(func(c *Config) {
		c.Memory = NewMemory(8 << 10)
		c.Logger = slog.New(slog.NewTextHandler(&logged, nil)) // written under the queue's lock
	})
	for i := range 200 {
		mustEnqueue(t, q, Message{Body: body(i)})
	}
	spilled := q.Stats().Spilled
	if spilled == 0 {
		t.Fatal("nothing spilled")
	}
	e.j.mu.Lock()
	first := ^uint32(0)
	for num := range e.j.runs {
		first = min(first, num)
	}
	e.j.runs[first][12] ^= 0xff // the header's checksum
	e.j.mu.Unlock()

	w := addWorker(t, q, "w", 1000)
	n := 0
	for range 10 {
		for _, d := range w.take() {
			must(t, q.Ack(w.Consumer, d.ID))
			n++
		}
	}
	if err := q.check(); err != nil {
		t.Fatal(err)
	}
	q.mu.Lock()
	log := logged.String()
	q.mu.Unlock()
	if s := q.Stats(); s.Messages() != 0 || n == 200 || n < 200-int(spilled) {
		t.Fatalf("delivered %d of 200 (%d spilled); stats %+v", n, spilled, s)
	}
	if !strings.Contains(log, "bad run header") {
		t.Errorf("the log does not say the run header is bad:\n%s", log)
	}
}
