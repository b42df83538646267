package queue

import (
	"testing"
	"unsafe"
)

// TestCountersSummary checks that a queue's block of counters follows
// the queue, and that Summary reads the same figures as Stats.
func TestCountersSummary(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	c := q.Counters()
	for i := range 5 {
		mustEnqueue(t, q, Message{Body: body(i)})
	}
	w := addWorker(t, q, "w", 2)
	got := w.take()
	if len(got) != 2 {
		t.Fatalf("%d deliveries, want 2", len(got))
	}
	must(t, q.Ack(w.Consumer, got[0].ID)) // the worker gets a third
	if q.Counters() != c {
		t.Fatal("the queue's block of counters changed")
	}
	st, sum := q.Stats(), c.Summary()
	want := Summary{Ready: st.Ready, Unacked: st.Unacked, Delayed: st.Delayed, Consumers: st.Consumers,
		Resident: st.Resident, Published: st.Published, Delivered: st.Delivered, Acked: st.Acked}
	if sum != want {
		t.Fatalf("summary %+v, stats %+v", sum, st)
	}
	if sum.Ready != 2 || sum.Unacked != 2 || sum.Consumers != 1 || sum.Published != 5 || sum.Delivered != 3 || sum.Acked != 1 {
		t.Fatalf("summary %+v", sum)
	}
	if st.Bytes != 8 || sum.Resident != q.Resident() {
		t.Fatalf("stats %+v, resident %d", st, q.Resident())
	}
}

// TestCountersLayout checks what a listing of many queues relies on:
// every block is one cache line of its own, and a block is never given
// to another queue while the old one's holder may still read it.
func TestCountersLayout(t *testing.T) {
	e := newEnv(t)
	old := e.queue(nil)
	mustEnqueue(t, old, Message{Body: []byte("x")})
	held := old.Counters()
	must(t, old.Close())
	old = nil
	seen := map[*Counters]bool{held: true}
	for range 3 * countersPerSlab {
		c := e.queue(nil).Counters()
		if p := uintptr(unsafe.Pointer(c)); p%cacheLine != 0 {
			t.Fatalf("block at %#x: not aligned to a cache line", p)
		}
		if seen[c] {
			t.Fatal("a block was handed out twice")
		}
		seen[c] = true
	}
	if s := held.Summary(); s.Ready != 1 || s.Published != 1 {
		t.Fatalf("a closed queue's block lost its figures: %+v", s)
	}
}

// TestQueueSize: an idle queue's struct stays within the allocator's
// 2 KiB size class (the next one is 2304 bytes): with 100,000 durable
// queues every byte over it costs 25 MB.
func TestQueueSize(t *testing.T) {
	if n := unsafe.Sizeof(Queue{}); n > 2048 {
		t.Errorf("Queue is %d bytes: over 2048, it takes 2304 a queue", n)
	}
}
