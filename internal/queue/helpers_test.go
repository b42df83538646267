package queue

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeClock is a Clock whose time moves only when a test calls Advance;
// timers fire then, each at its deadline, on the test's goroutine.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	fires  int
}

type fakeTimer struct {
	c      *fakeClock
	at     time.Time
	f      func()
	active bool
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newFakeClock() *fakeClock { return &fakeClock{now: epoch} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f, active: true}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.active = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.active, t.at = true, t.c.now.Add(d)
	return was
}

// Advance moves the time forward by d, firing the timers due on the way
// in deadline order, each with the clock set to its deadline.
func (c *fakeClock) Advance(d time.Duration) {
	c.AdvanceTo(c.Now().Add(d))
}

// AdvanceTo moves the time forward to end.
func (c *fakeClock) AdvanceTo(end time.Time) {
	for {
		c.mu.Lock()
		var next *fakeTimer
		for _, t := range c.timers {
			if t.active && !t.at.After(end) && (next == nil || t.at.Before(next.at)) {
				next = t
			}
		}
		if next == nil {
			if end.After(c.now) {
				c.now = end
			}
			c.mu.Unlock()
			return
		}
		if next.at.After(c.now) {
			c.now = next.at
		}
		next.active = false
		c.fires++
		c.mu.Unlock()
		next.f()
	}
}

// armed returns the number of timers set.
func (c *fakeClock) armed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if t.active {
			n++
		}
	}
	return n
}

// env is a test's world: a fake clock, a scheduler on it, a journal, and
// a dead-letter sink that records.
type env struct {
	t     testing.TB
	clk   *fakeClock
	sched *Scheduler
	j     *MemJournal

	mu     sync.Mutex
	dead   []DeadLetter
	active []string
}

func newEnv(t testing.TB) *env {
	clk := newFakeClock()
	e := &env{t: t, clk: clk, sched: NewScheduler(SchedulerOptions{Clock: clk, MaxSleep: 1000 * time.Hour}), j: NewMemJournal()}
	t.Cleanup(e.sched.Close)
	return e
}

// config returns a config on e's scheduler, journal and sinks, with the
// defaults otherwise.
func (e *env) config() Config {
	cfg := DefaultConfig()
	cfg.Scheduler = e.sched
	cfg.Journal = e.j
	cfg.DeadLetter = func(dl DeadLetter) {
		e.mu.Lock()
		e.dead = append(e.dead, dl)
		e.mu.Unlock()
	}
	cfg.OnActive = func(id string) {
		e.mu.Lock()
		e.active = append(e.active, id)
		e.mu.Unlock()
	}
	return cfg
}

func (e *env) queue(edit func(*Config)) *Queue {
	e.t.Helper()
	cfg := e.config()
	if edit != nil {
		edit(&cfg)
	}
	q, err := New("q", cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return q
}

func (e *env) deadLetters() []DeadLetter {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.dead)
}

func (e *env) actives() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.active)
}

// worker is a consumer that records its deliveries.
type worker struct {
	*Consumer
	q   *Queue
	mu  sync.Mutex
	got []Delivery
	at  []time.Time // when each was delivered
	clk Clock
}

func addWorker(t testing.TB, q *Queue, id string, prefetch int) *worker {
	t.Helper()
	w := &worker{q: q, clk: q.clock}
	c, err := q.AddConsumer(id, ConsumerConfig{Prefetch: prefetch, Deliver: w.deliver})
	if err != nil {
		t.Fatal(err)
	}
	w.Consumer = c
	return w
}

func (w *worker) deliver(d Delivery) {
	w.mu.Lock()
	w.got = append(w.got, d)
	w.at = append(w.at, w.clk.Now())
	w.mu.Unlock()
}

// take returns and forgets the deliveries so far.
func (w *worker) take() []Delivery {
	w.mu.Lock()
	defer w.mu.Unlock()
	got := w.got
	w.got, w.at = nil, nil
	return got
}

func (w *worker) n() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.got)
}

func ids(ds []Delivery) []uint64 {
	out := make([]uint64, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

func mustEnqueue(t testing.TB, q *Queue, m Message) uint64 {
	t.Helper()
	id, err := q.Enqueue(m, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func body(i int) []byte { return fmt.Appendf(nil, "m%d", i) }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// checkStats compares the gauges of q with want (ready, unacked, delayed).
func checkStats(t testing.TB, q *Queue, ready, unacked, delayed int64) {
	t.Helper()
	s := q.Stats()
	if s.Ready != ready || s.Unacked != unacked || s.Delayed != delayed {
		t.Fatalf("stats: ready %d unacked %d delayed %d; want %d %d %d", s.Ready, s.Unacked, s.Delayed, ready, unacked, delayed)
	}
}

// jump moves the wall clock forward without firing timers, as an NTP
// step does: timers run on the monotonic clock and do not notice.
func (c *fakeClock) jump(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, t := range c.timers {
		t.at = t.at.Add(d)
	}
}

// created returns the number of timers ever created.
func (c *fakeClock) created() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}
