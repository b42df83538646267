package queue

import (
	"errors"
	"testing"
	"time"
)

func TestTakeGivesOneMessageAtATime(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	defer q.Close()
	p, err := q.AddPuller("getter")
	must(t, err)
	if _, ok, err := q.Take(p); ok || err != nil {
		t.Fatalf("take of an empty queue: ok %v, err %v", ok, err)
	}
	for i := range 3 {
		mustEnqueue(t, q, Message{Body: body(i)})
	}
	d, ok, err := q.Take(p)
	if err != nil || !ok || string(d.Body) != "m0" {
		t.Fatalf("take: %q, %v, %v; want m0", d.Body, ok, err)
	}
	checkStats(t, q, 2, 1, 0)
	if st := q.Stats(); st.Consumers != 0 {
		t.Fatalf("a puller counts as %d consumers, want 0", st.Consumers)
	}
	// Never pushed: only Take gives it more.
	d2, ok, err := q.Take(p)
	if err != nil || !ok || string(d2.Body) != "m1" {
		t.Fatalf("second take: %q, %v, %v; want m1", d2.Body, ok, err)
	}
	must(t, q.Ack(p, d.ID))
	must(t, q.Nack(p, d2.ID, true)) // back to the queue
	checkStats(t, q, 1, 0, 1)
	// A pushed consumer takes the rest, the puller's requeued one when its
	// backoff is over.
	w := addWorker(t, q, "getter", 10) // the puller's id may repeat
	e.clk.Advance(time.Minute)
	if got := w.take(); len(got) != 2 {
		t.Fatalf("worker got %d, want 2", len(got))
	}
	if _, ok, _ := q.Take(p); ok {
		t.Fatal("take found a message the worker holds")
	}
	// Removing the puller returns what it holds.
	must(t, q.SetPrefetch(w.Consumer, 2)) // full: the worker holds 2
	mustEnqueue(t, q, Message{Body: body(3)})
	d3, ok, err := q.Take(p)
	if !ok || err != nil {
		t.Fatalf("take: %v, %v", ok, err)
	}
	must(t, q.RemoveConsumer(p))
	if _, _, err := q.Take(p); !errors.Is(err, ErrUnknownConsumer) {
		t.Fatalf("take by a removed puller: %v", err)
	}
	if st := q.Stats(); st.Consumers != 1 {
		t.Fatalf("consumers %d after removing the puller, want the worker's 1", st.Consumers)
	}
	must(t, q.SetPrefetch(w.Consumer, 3))
	e.clk.Advance(time.Minute)
	if got := w.take(); len(got) != 1 || got[0].ID != d3.ID || got[0].Attempts != 1 {
		t.Fatalf("worker got %+v, want the puller's message redelivered", got)
	}
}

func TestTakeSkipsExpired(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	defer q.Close()
	p, err := q.AddPuller("getter")
	must(t, err)
	mustEnqueue(t, q, Message{Body: body(0), TTL: time.Second})
	mustEnqueue(t, q, Message{Body: body(1)})
	e.clk.jump(2 * time.Second)
	d, ok, err := q.Take(p)
	if err != nil || !ok || string(d.Body) != "m1" {
		t.Fatalf("take: %q, %v, %v; want m1, the expired m0 skipped", d.Body, ok, err)
	}
	if dl := e.deadLetters(); len(dl) != 1 || dl[0].Reason != ReasonExpired {
		t.Fatalf("dead letters %+v, want m0 expired", dl)
	}
	q.Close()
	if _, _, err := q.Take(p); !errors.Is(err, ErrClosed) {
		t.Fatalf("take on a closed queue: %v", err)
	}
	if _, err := q.AddPuller("x"); !errors.Is(err, ErrClosed) {
		t.Fatalf("puller on a closed queue: %v", err)
	}
}

func TestTakeKeyed(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	defer q.Close()
	p, err := q.AddPuller("getter")
	must(t, err)
	mustEnqueue(t, q, Message{Body: body(0), Key: "a"})
	mustEnqueue(t, q, Message{Body: body(1), Key: "a"})
	mustEnqueue(t, q, Message{Body: body(2), Key: "b"})
	d, ok, err := q.Take(p)
	if err != nil || !ok || string(d.Body) != "m0" {
		t.Fatalf("take: %q, %v, %v; want m0", d.Body, ok, err)
	}
	// Key a waits for m0: b's message is next.
	d2, ok, err := q.Take(p)
	if err != nil || !ok || string(d2.Body) != "m2" {
		t.Fatalf("take: %q, %v, %v; want m2", d2.Body, ok, err)
	}
	if _, ok, _ := q.Take(p); ok {
		t.Fatal("took m1 while its key waits for m0")
	}
	must(t, q.Ack(p, d.ID))
	d3, ok, err := q.Take(p)
	if err != nil || !ok || string(d3.Body) != "m1" {
		t.Fatalf("take after the ack: %q, %v, %v; want m1", d3.Body, ok, err)
	}
	must(t, q.Ack(p, d2.ID))
	must(t, q.Ack(p, d3.ID))
	checkStats(t, q, 0, 0, 0)
	// A key a pushed consumer owns waits for it.
	w := addWorker(t, q, "w", 1)
	mustEnqueue(t, q, Message{Body: body(4), Key: "c"})
	mustEnqueue(t, q, Message{Body: body(5), Key: "c"})
	if got := w.take(); len(got) != 1 || string(got[0].Body) != "m4" {
		t.Fatalf("worker got %v", got)
	}
	if _, ok, _ := q.Take(p); ok {
		t.Fatal("the puller took a key the worker owns")
	}
}
