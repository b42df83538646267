package queue

import (
	"slices"
	"testing"
	"time"
)

func TestSingleActive(t *testing.T) {
	e := newEnv(t)
	q := e.queue(func(c *Config) { c.SingleActive = true })
	if _, ok := q.Active(); ok {
		t.Fatal("active consumer before any attached")
	}
	a := addWorker(t, q, "a", 2)
	b := addWorker(t, q, "b", 2)
	c := addWorker(t, q, "c", 2)
	for i := range 6 {
		mustEnqueue(t, q, Message{Body: body(i), Key: []string{"", "k1", "k2"}[i%3]})
	}
	if a.n() != 2 || b.n() != 0 || c.n() != 0 {
		t.Fatalf("deliveries a %d b %d c %d; only a (the oldest) should receive", a.n(), b.n(), c.n())
	}
	if id, ok := q.Active(); !ok || id != "a" {
		t.Fatalf("active %q %v", id, ok)
	}
	// A consumer that is not active leaving changes nothing.
	must(t, q.RemoveConsumer(c.Consumer))
	if got := e.actives(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("OnActive calls %v", got)
	}
	// The active one leaves: b takes over, and gets a's messages after
	// the backoff.
	must(t, q.RemoveConsumer(a.Consumer))
	if id, _ := q.Active(); id != "b" {
		t.Fatalf("active %q after a left, want b", id)
	}
	if got := e.actives(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("OnActive calls %v", got)
	}
	e.clk.Advance(100 * time.Millisecond)
	r := newKeyRun(t, q, b)
	r.run()
	if s := q.Stats(); s.Acked != 6 || s.Messages() != 0 || s.Redelivered != 2 {
		t.Fatalf("after b took over: %+v", s)
	}
	must(t, q.RemoveConsumer(b.Consumer))
	if _, ok := q.Active(); ok {
		t.Fatal("active consumer after all left")
	}
	if got := e.actives(); !slices.Equal(got, []string{"a", "b", ""}) {
		t.Fatalf("OnActive calls %v", got)
	}
	// Keys wait for the next consumer.
	mustEnqueue(t, q, Message{Key: "k1"})
	d := addWorker(t, q, "d", 1)
	if d.n() != 1 {
		t.Fatal("a key queued while no consumer was attached was not delivered")
	}
}
