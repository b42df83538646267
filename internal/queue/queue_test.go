package queue

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestEnqueueDeliverAck(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	hdr := map[string]string{"traceparent": "00-abc"}
	id1 := mustEnqueue(t, q, Message{Body: []byte("hello"), Headers: hdr})
	id2 := mustEnqueue(t, q, Message{Body: []byte("world")})
	if id1 != 1 || id2 != 2 {
		t.Fatalf("ids %d %d, want 1 2", id1, id2)
	}
	checkStats(t, q, 2, 0, 0)
	w := addWorker(t, q, "w1", 10)
	got := w.take()
	if len(got) != 2 {
		t.Fatalf("delivered %d, want 2", len(got))
	}
	d := got[0]
	if d.ID != id1 || string(d.Body) != "hello" || d.Headers["traceparent"] != "00-abc" || d.Redelivered || d.Attempts != 0 || !d.Enqueued.Equal(epoch) {
		t.Fatalf("delivery %+v", d)
	}
	checkStats(t, q, 0, 2, 0)
	must(t, q.Ack(w.Consumer, id1))
	if err := q.Ack(w.Consumer, id1); !errors.Is(err, ErrNotInFlight) {
		t.Fatalf("second ack: %v, want ErrNotInFlight", err)
	}
	must(t, q.Ack(w.Consumer, id2))
	checkStats(t, q, 0, 0, 0)
	s := q.Stats()
	if s.Published != 2 || s.Delivered != 2 || s.Acked != 2 || s.Bytes != 0 {
		t.Fatalf("counters %+v", s)
	}
	if n := e.j.Live(); n != 0 {
		t.Fatalf("%d journal records live after acking everything", n)
	}
}

func TestPriorityThenFIFO(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	prios := []uint8{0, 5, 9, 5, 0, 9, 1}
	for i, p := range prios {
		mustEnqueue(t, q, Message{Body: body(i), Priority: p})
	}
	w := addWorker(t, q, "w", 100)
	// 9s (ids 3, 6), then 5s (2, 4), then 1 (7), then 0s (1, 5).
	want := []uint64{3, 6, 2, 4, 7, 1, 5}
	if got := ids(w.take()); !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	if _, err := q.Enqueue(Message{Priority: 10}, nil, nil); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("priority 10: %v", err)
	}
}

func TestPrefetchLimitsInFlight(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	w := addWorker(t, q, "w", 3)
	for i := range 10 {
		mustEnqueue(t, q, Message{Body: body(i)})
	}
	got := w.take()
	if !slices.Equal(ids(got), []uint64{1, 2, 3}) {
		t.Fatalf("first deliveries %v", ids(got))
	}
	checkStats(t, q, 7, 3, 0)
	must(t, q.Ack(w.Consumer, 2))
	if got := ids(w.take()); !slices.Equal(got, []uint64{4}) {
		t.Fatalf("after one ack: %v", got)
	}
	must(t, q.SetPrefetch(w.Consumer, 5))
	if got := ids(w.take()); !slices.Equal(got, []uint64{5, 6}) {
		t.Fatalf("after raising prefetch: %v", got)
	}
}

func TestRoundRobinCompetingConsumers(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	ws := []*worker{addWorker(t, q, "a", 100), addWorker(t, q, "b", 100), addWorker(t, q, "c", 100)}
	for i := range 30 {
		mustEnqueue(t, q, Message{Body: body(i)})
	}
	for i, w := range ws {
		got := ids(w.take())
		if len(got) != 10 {
			t.Fatalf("%s got %d, want 10", w.ID(), len(got))
		}
		for j, id := range got {
			if want := uint64(1 + i + 3*j); id != want {
				t.Fatalf("%s got %v; not round-robin", w.ID(), got)
			}
		}
	}
}

func TestNackRequeueBacksOffExponentially(t *testing.T) {
	e := newEnv(t)
	q := e.queue(func(c *Config) {
		c.BackoffBase = 100 * time.Millisecond
		c.BackoffMax = time.Second
		c.MaxAttempts = 0
	})
	w := addWorker(t, q, "w", 1)
	id := mustEnqueue(t, q, Message{Body: []byte("x")})
	w.take()
	// 100ms, 200ms, 400ms, 800ms, then capped at 1s.
	for i, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		want *= time.Millisecond
		must(t, q.Nack(w.Consumer, id, true))
		checkStats(t, q, 0, 0, 1)
		e.clk.Advance(want - time.Millisecond)
		if n := w.n(); n != 0 {
			t.Fatalf("attempt %d: redelivered before %v", i+1, want)
		}
		e.clk.Advance(time.Millisecond)
		got := w.take()
		if len(got) != 1 {
			t.Fatalf("attempt %d: not redelivered after %v", i+1, want)
		}
		if d := got[0]; !d.Redelivered || d.Attempts != uint32(i+1) || string(d.Body) != "x" {
			t.Fatalf("attempt %d: delivery %+v", i+1, d)
		}
	}
	if s := q.Stats(); s.Redelivered != 6 || s.Delivered != 7 {
		t.Fatalf("counters %+v", s)
	}
}

func TestBackoffJitter(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BackoffJitter = 0.5
	for _, r := range []float64{0, 0.5, 0.999} {
		d := cfg.backoff(3, r) // 400ms before jitter
		lo, hi := 200*time.Millisecond, 400*time.Millisecond
		if d < lo || d > hi {
			t.Fatalf("jitter r=%v: %v not in [%v, %v]", r, d, lo, hi)
		}
	}
	cfg.BackoffJitter = 0
	if d := cfg.backoff(100, 0.3); d != cfg.BackoffMax {
		t.Fatalf("backoff after 100 attempts %v, want the max %v", d, cfg.BackoffMax)
	}
}

func TestNackWithoutRequeueDeadLetters(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	w := addWorker(t, q, "w", 1)
	id := mustEnqueue(t, q, Message{Body: []byte("bad"), Key: "k"})
	w.take()
	must(t, q.Nack(w.Consumer, id, false))
	dl := e.deadLetters()
	if len(dl) != 1 || dl[0].Reason != ReasonRejected || dl[0].Message.ID != id || string(dl[0].Message.Body) != "bad" || dl[0].Queue != "q" {
		t.Fatalf("dead letters %+v", dl)
	}
	checkStats(t, q, 0, 0, 0)
	if s := q.Stats(); s.DeadLettered != 1 || s.Keys != 0 {
		t.Fatalf("counters %+v", s)
	}
	if n := e.j.Live(); n != 0 {
		t.Fatalf("%d records live after the dead letter", n)
	}
}

func TestMaxAttemptsDeadLetters(t *testing.T) {
	e := newEnv(t)
	q := e.queue(func(c *Config) { c.MaxAttempts = 3 })
	w := addWorker(t, q, "w", 1)
	id := mustEnqueue(t, q, Message{Body: []byte("poison")})
	for attempt := 1; attempt <= 3; attempt++ {
		e.clk.Advance(time.Minute)
		got := w.take()
		if len(got) != 1 || got[0].Attempts != uint32(attempt-1) {
			t.Fatalf("attempt %d: deliveries %+v", attempt, got)
		}
		must(t, q.Nack(w.Consumer, id, true))
	}
	e.clk.Advance(time.Hour)
	if n := w.n(); n != 0 {
		t.Fatalf("delivered a 4th time")
	}
	dl := e.deadLetters()
	if len(dl) != 1 || dl[0].Reason != ReasonMaxAttempts || dl[0].Message.Attempts != 3 {
		t.Fatalf("dead letters %+v", dl)
	}
}

func TestRemovedConsumerMessagesRedelivered(t *testing.T) {
	e := newEnv(t)
	q := e.queue(func(c *Config) { c.MaxAttempts = 2 })
	a := addWorker(t, q, "a", 5)
	for i := range 3 {
		mustEnqueue(t, q, Message{Body: body(i)})
	}
	if a.n() != 3 {
		t.Fatal("a did not get its messages")
	}
	b := addWorker(t, q, "b", 5)
	must(t, q.RemoveConsumer(a.Consumer))
	if err := q.Ack(a.Consumer, 1); !errors.Is(err, ErrUnknownConsumer) {
		t.Fatalf("ack from a removed consumer: %v", err)
	}
	checkStats(t, q, 0, 0, 3)
	if b.n() != 0 {
		t.Fatal("redelivered before the backoff")
	}
	e.clk.Advance(100 * time.Millisecond)
	got := b.take()
	if !slices.Equal(ids(got), []uint64{1, 2, 3}) {
		t.Fatalf("b got %v", ids(got))
	}
	for _, d := range got {
		if !d.Redelivered || d.Attempts != 1 {
			t.Fatalf("redelivery %+v", d)
		}
	}
	// b dies too: the second failure reaches MaxAttempts 2.
	must(t, q.RemoveConsumer(b.Consumer))
	dl := e.deadLetters()
	if len(dl) != 3 || dl[0].Reason != ReasonMaxAttempts {
		t.Fatalf("dead letters %+v", dl)
	}
	checkStats(t, q, 0, 0, 0)
	if s := q.Stats(); s.Consumers != 0 {
		t.Fatalf("consumers %d", s.Consumers)
	}
}

func TestTTL(t *testing.T) {
	e := newEnv(t)
	q := e.queue(func(c *Config) { c.TTL = 10 * time.Second })
	mustEnqueue(t, q, Message{Body: []byte("queue ttl")})                                                        // expires at 10s
	mustEnqueue(t, q, Message{Body: []byte("own ttl"), TTL: 2 * time.Second})                                    // 2s
	mustEnqueue(t, q, Message{Body: []byte("longer own ttl"), TTL: time.Minute})                                 // the queue's 10s wins
	mustEnqueue(t, q, Message{Body: []byte("delayed"), DueAt: epoch.Add(5 * time.Second), TTL: 3 * time.Second}) // due 5s, expires 8s
	e.clk.Advance(2*time.Second - 1)
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d expired early", n)
	}
	e.clk.Advance(1)
	if dl := e.deadLetters(); len(dl) != 1 || string(dl[0].Message.Body) != "own ttl" || dl[0].Reason != ReasonExpired {
		t.Fatalf("at 2s: %+v", dl)
	}
	e.clk.Advance(6 * time.Second) // 8s: the delayed one, due at 5s, expired at 8s
	if dl := e.deadLetters(); len(dl) != 2 || string(dl[1].Message.Body) != "delayed" {
		t.Fatalf("at 8s: %+v", dl)
	}
	checkStats(t, q, 2, 0, 0)
	e.clk.Advance(2 * time.Second)
	if dl := e.deadLetters(); len(dl) != 4 {
		t.Fatalf("at 10s: %d dead letters", len(dl))
	}
	checkStats(t, q, 0, 0, 0)
	if s := q.Stats(); s.Expired != 4 {
		t.Fatalf("expired %d", s.Expired)
	}
}

func TestTTLNotInFlightButOnRequeue(t *testing.T) {
	e := newEnv(t)
	q := e.queue(func(c *Config) { c.TTL = time.Second; c.BackoffBase = 0; c.BackoffMax = 0 })
	w := addWorker(t, q, "w", 1)
	id := mustEnqueue(t, q, Message{Body: []byte("x")})
	w.take()
	e.clk.Advance(time.Hour)
	if n := len(e.deadLetters()); n != 0 {
		t.Fatal("a message in flight expired")
	}
	must(t, q.Nack(w.Consumer, id, true))
	if dl := e.deadLetters(); len(dl) != 1 || dl[0].Reason != ReasonExpired {
		t.Fatalf("requeued past its TTL: %+v", dl)
	}
	// A ready message is not delivered once expired, even if its timer
	// has not run yet.
	mustEnqueue(t, q, Message{Body: []byte("y"), TTL: time.Second})
	if got := w.take(); len(got) != 1 {
		t.Fatalf("got %d", len(got))
	}
}

func TestBackoffMessageExpires(t *testing.T) {
	e := newEnv(t)
	q := e.queue(func(c *Config) { c.BackoffBase = 10 * time.Second; c.BackoffMax = 10 * time.Second })
	w := addWorker(t, q, "w", 1)
	id := mustEnqueue(t, q, Message{Body: []byte("x"), TTL: 3 * time.Second})
	w.take()
	must(t, q.Nack(w.Consumer, id, true)) // due again at 10s, expires at 3s
	e.clk.Advance(3 * time.Second)
	if dl := e.deadLetters(); len(dl) != 1 || dl[0].Reason != ReasonExpired {
		t.Fatalf("%+v", dl)
	}
	checkStats(t, q, 0, 0, 0)
}

func TestWatchProgressCompletion(t *testing.T) {
	e := newEnv(t)
	q := e.queue(func(c *Config) { c.MaxAttempts = 2 })
	var mu sync.Mutex
	var submitter, other []Event
	rec := func(dst *[]Event) WatchFunc {
		return func(ev Event) { mu.Lock(); *dst = append(*dst, ev); mu.Unlock() }
	}
	id, err := q.Enqueue(Message{Body: []byte("job")}, nil, rec(&submitter))
	must(t, err)
	cancel, err := q.Watch(id, rec(&other))
	must(t, err)
	w := addWorker(t, q, "w", 1)
	must(t, q.Progress(w.Consumer, id, 40, "halfway"))
	must(t, q.Progress(w.Consumer, id, 140, "clamped"))
	must(t, q.Nack(w.Consumer, id, true))
	e.clk.Advance(100 * time.Millisecond)
	cancel()
	must(t, q.Ack(w.Consumer, id))
	kinds := func(evs []Event) []EventKind {
		var k []EventKind
		for _, ev := range evs {
			k = append(k, ev.Kind)
		}
		return k
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []EventKind{EventProgress, EventProgress, EventRetry, EventCompleted}; !slices.Equal(kinds(submitter), want) {
		t.Fatalf("submitter saw %v, want %v", kinds(submitter), want)
	}
	if want := []EventKind{EventProgress, EventProgress, EventRetry}; !slices.Equal(kinds(other), want) {
		t.Fatalf("watcher saw %v, want %v (cancelled before the ack)", kinds(other), want)
	}
	if p := submitter[0]; p.Percent != 40 || p.Text != "halfway" || p.Consumer != "w" || p.ID != id {
		t.Fatalf("progress %+v", p)
	}
	if p := submitter[1]; p.Percent != 100 {
		t.Fatalf("percent not clamped: %+v", p)
	}
	if r := submitter[2]; r.Attempts != 1 || !r.Due.Equal(epoch.Add(100*time.Millisecond)) {
		t.Fatalf("retry %+v", r)
	}
	if _, err := q.Watch(id, rec(&other)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("watch after completion: %v", err)
	}
	if err := q.Progress(w.Consumer, id, 1, ""); !errors.Is(err, ErrNotInFlight) {
		t.Fatalf("progress after ack: %v", err)
	}
}

func TestWatchFailure(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	var got []Event
	id, err := q.Enqueue(Message{Body: []byte("job")}, nil, func(ev Event) { got = append(got, ev) })
	must(t, err)
	w := addWorker(t, q, "w", 1)
	must(t, q.Nack(w.Consumer, id, false))
	if len(got) != 1 || got[0].Kind != EventFailed || got[0].Reason != ReasonRejected {
		t.Fatalf("events %+v", got)
	}
}

func TestAckFromDeliverCallback(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	var c *Consumer
	var acked []uint64
	c, err := q.AddConsumer("w", ConsumerConfig{Prefetch: 1, Deliver: func(d Delivery) {
		// The lock is not held: acking here must neither deadlock nor
		// reorder deliveries.
		must(t, q.Ack(c, d.ID))
		acked = append(acked, d.ID)
	}})
	must(t, err)
	for i := range 5 {
		mustEnqueue(t, q, Message{Body: body(i)})
	}
	if !slices.Equal(acked, []uint64{1, 2, 3, 4, 5}) {
		t.Fatalf("acked %v", acked)
	}
	checkStats(t, q, 0, 0, 0)
}

func TestDeadLetterToQueue(t *testing.T) {
	e := newEnv(t)
	dlq := e.queue(nil)
	q := e.queue(func(c *Config) { c.DeadLetter = ToQueue(dlq) })
	w := addWorker(t, q, "w", 1)
	id := mustEnqueue(t, q, Message{Body: []byte("x"), Headers: map[string]string{"a": "b"}, Key: "k", Priority: 3})
	must(t, q.Nack(w.Consumer, id, false))
	d := addWorker(t, dlq, "d", 1).take()
	if len(d) != 1 || string(d[0].Body) != "x" || d[0].Headers["a"] != "b" || d[0].Headers["x-death-reason"] != "rejected" || d[0].Headers["x-death-queue"] != "q" || d[0].Key != "k" || d[0].Priority != 3 {
		t.Fatalf("dead-letter queue got %+v", d)
	}
	// Released from the source only after the target appended it.
	recs := e.j.Records()
	if len(recs) != 3 || recs[0].Kind != KindEnqueue || recs[1].Kind != KindEnqueue || recs[2].Kind != KindRelease || recs[2].Released[0] != recs[0].Ref {
		t.Fatalf("journal %+v", recs)
	}
}

func TestConsumerErrors(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	other := e.queue(nil)
	a := addWorker(t, q, "a", 1)
	if _, err := q.AddConsumer("a", ConsumerConfig{Prefetch: 1, Deliver: func(Delivery) {}}); !errors.Is(err, ErrConsumerExists) {
		t.Fatalf("duplicate id: %v", err)
	}
	if _, err := q.AddConsumer("b", ConsumerConfig{Prefetch: 0, Deliver: func(Delivery) {}}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("prefetch 0: %v", err)
	}
	id := mustEnqueue(t, q, Message{})
	o := addWorker(t, other, "a", 1)
	if err := q.Ack(o.Consumer, id); !errors.Is(err, ErrUnknownConsumer) {
		t.Fatalf("consumer of another queue: %v", err)
	}
	b := addWorker(t, q, "b", 1)
	if err := q.Ack(b.Consumer, id); !errors.Is(err, ErrNotInFlight) {
		t.Fatalf("ack by the wrong consumer: %v", err)
	}
	must(t, q.Ack(a.Consumer, id))
	must(t, q.Close())
	if _, err := q.Enqueue(Message{}, nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("enqueue after close: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"negative attempts", func(c *Config) { c.MaxAttempts = -1 }},
		{"negative ttl", func(c *Config) { c.TTL = -time.Second }},
		{"max below base", func(c *Config) { c.BackoffMax = time.Millisecond }},
		{"jitter above 1", func(c *Config) { c.BackoffJitter = 1.5 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.edit(&cfg)
			if _, err := New("q", cfg); !errors.Is(err, ErrBadConfig) {
				t.Fatalf("got %v, want ErrBadConfig", err)
			}
		})
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestDefaultSchedulerAndAccessors(t *testing.T) {
	cfg := DefaultConfig() // no Scheduler: the shared one, on the real clock
	q, err := New("tasks", cfg)
	must(t, err)
	if q.Name() != "tasks" {
		t.Fatal(q.Name())
	}
	a := addWorker(t, q, "a", 1)
	addWorker(t, q, "b", 1)
	if got := q.Consumers(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("consumers %v", got)
	}
	id := mustEnqueue(t, q, Message{Body: []byte("x")})
	if got := a.take(); len(got) != 1 || got[0].ID != id {
		t.Fatalf("got %v", got)
	}
	if q.NextID() != id+1 {
		t.Fatalf("next id %d", q.NextID())
	}
	must(t, q.RemoveConsumer(a.Consumer))
	if err := q.RemoveConsumer(a.Consumer); !errors.Is(err, ErrUnknownConsumer) {
		t.Fatalf("second remove: %v", err)
	}
	if err := q.SetPrefetch(a.Consumer, 2); !errors.Is(err, ErrUnknownConsumer) {
		t.Fatalf("prefetch of a removed consumer: %v", err)
	}
}

func TestReturnedConsumerMessagesComeBackAsTheyWere(t *testing.T) {
	e := newEnv(t)
	q := e.queue(func(c *Config) { c.MaxAttempts = 1 })
	a := addWorker(t, q, "a", 10)
	for i := range 3 {
		mustEnqueue(t, q, Message{Body: body(i)})
	}
	for i := range 3 {
		mustEnqueue(t, q, Message{Key: "k", Body: body(10 + i)})
	}
	if a.n() != 4 { // three plain, the key's first
		t.Fatalf("a got %d, want 4", a.n())
	}
	must(t, q.ReturnConsumer(a.Consumer))
	checkStats(t, q, 6, 0, 0)
	b := addWorker(t, q, "b", 10)
	got := b.take()
	if len(got) != 4 {
		t.Fatalf("b got %v at once, want 4 (no backoff)", ids(got))
	}
	for _, d := range got {
		if d.Redelivered || d.Attempts != 0 {
			t.Fatalf("a returned task came back as a failed attempt: %+v", d)
		}
	}
	// MaxAttempts 1: a counted attempt would have dead-lettered them.
	if dl := e.deadLetters(); len(dl) != 0 {
		t.Fatalf("dead letters %+v", dl)
	}
	// The key stays in order, one in flight.
	for want := uint64(4); want <= 6; want++ {
		var k *Delivery
		for i := range got {
			if got[i].Key == "k" {
				k = &got[i]
			}
		}
		if k == nil || k.ID != want {
			t.Fatalf("key k: got %+v, want task %d", k, want)
		}
		for _, d := range got {
			must(t, q.Ack(b.Consumer, d.ID))
		}
		got = b.take()
	}
	checkStats(t, q, 0, 0, 0)
}
