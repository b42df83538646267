package queue

import (
	"math/rand/v2"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

func TestDelayedDeliveryAtDueTime(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	w := addWorker(t, q, "w", 10)
	due := epoch.Add(90*time.Second + 250*time.Millisecond)
	mustEnqueue(t, q, Message{Body: []byte("later"), DueAt: due})
	mustEnqueue(t, q, Message{Body: []byte("past"), DueAt: epoch.Add(-time.Hour)})
	if got := w.take(); len(got) != 1 || string(got[0].Body) != "past" {
		t.Fatalf("got %v; a due time in the past is due now", got)
	}
	checkStats(t, q, 0, 1, 1)
	e.clk.AdvanceTo(due.Add(-time.Nanosecond))
	if w.n() != 0 {
		t.Fatal("delivered early")
	}
	e.clk.AdvanceTo(due)
	if w.n() != 1 || !w.at[0].Equal(due) {
		t.Fatalf("delivered %d at %v, want at %v", w.n(), w.at, due)
	}
}

func TestManyDelayedExactlyWhenDueWithOneTimer(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	n := 100_000
	if testing.Short() {
		n = 10_000
	}
	rng := rand.New(rand.NewPCG(3, 4))
	dues := map[uint64]time.Time{}
	for range n {
		due := epoch.Add(time.Duration(rng.Int64N(int64(365 * 24 * time.Hour))))
		dues[mustEnqueue(t, q, Message{DueAt: due})] = due
	}
	checkStats(t, q, 0, 0, int64(n))
	if a, c := e.clk.armed(), e.clk.created(); a != 1 || c != 1 {
		t.Fatalf("%d timers armed, %d created, for %d delayed messages; want 1", a, c, n)
	}
	var c *Consumer
	var last time.Time
	delivered := 0
	c, err := q.AddConsumer("w", ConsumerConfig{Prefetch: 1, Deliver: func(d Delivery) {
		now := e.clk.Now()
		if due := dues[d.ID]; !now.Equal(due) || now.Before(last) {
			t.Errorf("message %d due %v delivered at %v (previous at %v)", d.ID, due, now, last)
		}
		last = now
		delivered++
		must(t, q.Ack(c, d.ID)) // from inside Deliver: the lock is not held
	}})
	must(t, err)
	e.clk.Advance(366 * 24 * time.Hour)
	if delivered != n {
		t.Fatalf("delivered %d of %d", delivered, n)
	}
	checkStats(t, q, 0, 0, 0)
}

func TestFarFutureDue(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	w := addWorker(t, q, "w", 1)
	due := time.Date(2200, 6, 1, 12, 0, 0, 0, time.UTC)
	mustEnqueue(t, q, Message{DueAt: due})
	e.clk.AdvanceTo(due.Add(-time.Second))
	if w.n() != 0 {
		t.Fatal("delivered early")
	}
	e.clk.AdvanceTo(due)
	if w.n() != 1 || !w.at[0].Equal(due) {
		t.Fatalf("delivered %d at %v, want %v", w.n(), w.at, due)
	}
}

func TestSharedSchedulerManyQueues(t *testing.T) {
	e := newEnv(t)
	const nq = 10_000
	var ws []*worker
	for i := range nq {
		q := e.queue(nil)
		ws = append(ws, addWorker(t, q, "w", 10))
		for j := range 3 {
			mustEnqueue(t, q, Message{DueAt: epoch.Add(time.Duration(1+(i*7+j*3)%50) * time.Second)})
		}
	}
	if a, c := e.clk.armed(), e.clk.created(); a != 1 || c != 1 {
		t.Fatalf("%d timers armed, %d created for %d queues; want 1", a, c, nq)
	}
	e.clk.Advance(time.Minute)
	for i, w := range ws {
		if w.n() != 3 {
			t.Fatalf("queue %d delivered %d of 3", i, w.n())
		}
		var want []time.Time
		for k := range 3 {
			want = append(want, epoch.Add(time.Duration(1+(i*7+k*3)%50)*time.Second))
		}
		slices.SortFunc(want, time.Time.Compare)
		if !slices.EqualFunc(w.at, want, time.Time.Equal) {
			t.Fatalf("queue %d delivered at %v, want %v", i, w.at, want)
		}
	}
	if e.clk.armed() != 0 {
		t.Fatal("timer still armed with nothing due")
	}
}

func TestWallClockStepCaughtWithinMaxSleep(t *testing.T) {
	clk := newFakeClock()
	sched := NewScheduler(SchedulerOptions{Clock: clk, MaxSleep: time.Second})
	t.Cleanup(sched.Close)
	cfg := DefaultConfig()
	cfg.Scheduler = sched
	q, err := New("q", cfg)
	must(t, err)
	w := addWorker(t, q, "w", 1)
	due := epoch.Add(time.Hour)
	mustEnqueue(t, q, Message{DueAt: due})
	clk.jump(time.Hour) // the wall clock steps; the armed timer does not notice
	clk.Advance(time.Second)
	if w.n() != 1 {
		t.Fatal("not delivered within MaxSleep of a wall clock step past its due time")
	}
	if late := w.at[0].Sub(due); late > time.Second {
		t.Fatalf("delivered %v late", late)
	}
}

func TestSchedulerRealClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sched := NewScheduler(SchedulerOptions{})
		defer sched.Close()
		cfg := DefaultConfig()
		cfg.Scheduler = sched
		q, err := New("q", cfg)
		must(t, err)
		got := make(chan time.Time, 10)
		_, err = q.AddConsumer("w", ConsumerConfig{Prefetch: 10, Deliver: func(Delivery) { got <- time.Now() }})
		must(t, err)
		start := time.Now()
		dues := []time.Duration{5 * time.Second, 2*time.Hour + 300*time.Millisecond, 1500 * time.Millisecond}
		for _, d := range dues {
			mustEnqueue(t, q, Message{DueAt: start.Add(d)})
		}
		slices.Sort(dues)
		for _, d := range dues {
			at := <-got
			if at.Sub(start) != d {
				t.Fatalf("delivered at +%v, want +%v", at.Sub(start), d)
			}
		}
		synctest.Wait()
		if len(got) != 0 {
			t.Fatal("extra deliveries")
		}
	})
}
