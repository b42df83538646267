package queue

import "testing"

func TestPeekLeavesTheQueueAsItIs(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Journal = NewMemJournal()
	q, err := New("peek", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	for i, prio := range []uint8{0, 5, 0, 9} {
		if _, err := q.Enqueue(Message{Body: []byte{'a' + byte(i)}, Priority: prio, Headers: map[string]string{"n": string(rune('0' + i))}}, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	before := q.Stats()
	got, err := q.Peek(3)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || string(got[0].Body) != "d" || string(got[1].Body) != "b" || string(got[2].Body) != "a" {
		t.Fatalf("peeked %+v, want d, b, a (priority order, FIFO within a level)", got)
	}
	if got[0].Headers["n"] != "3" || got[0].Priority != 9 || got[0].Attempts != 0 {
		t.Fatalf("first peeked %+v", got[0])
	}
	if all, _ := q.Peek(10); len(all) != 4 {
		t.Fatalf("peek 10 returned %d, want the 4 there are", len(all))
	}
	if after := q.Stats(); after.Ready != before.Ready || after.Delivered != before.Delivered || after.Unacked != 0 {
		t.Fatalf("peek changed the queue: before %+v, after %+v", before, after)
	}
	// A consumer then receives them in the order peeked, first attempts.
	var order []string
	if _, err := q.AddConsumer("c", ConsumerConfig{Prefetch: 10, Deliver: func(d Delivery) {
		if d.Attempts != 0 || d.Redelivered {
			t.Errorf("delivery %q after a peek: attempts %d, redelivered %v", d.Body, d.Attempts, d.Redelivered)
		}
		order = append(order, string(d.Body))
	}}); err != nil {
		t.Fatal(err)
	}
	if want := "d b a c"; joinAll(order) != want {
		t.Fatalf("delivered %v, want %s", order, want)
	}
	q.Close()
	if _, err := q.Peek(1); err != ErrClosed {
		t.Fatalf("peek on a closed queue: %v, want ErrClosed", err)
	}
}

func TestPeekShowsKeyedMessages(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Journal = NewMemJournal()
	q, err := New("peek-keyed", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	for i, key := range []string{"b", "a", "", "b", "a", "c"} {
		if _, err := q.Enqueue(Message{Body: []byte{'0' + byte(i)}, Key: key}, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	var bodies []string
	peek := func(n int) string {
		got, err := q.Peek(n)
		if err != nil {
			t.Fatal(err)
		}
		bodies = bodies[:0]
		for _, d := range got {
			bodies = append(bodies, string(d.Body))
		}
		return joinAll(bodies)
	}
	// The unkeyed message first, then the keyed ones, oldest first.
	if got := peek(10); got != "2 0 1 3 4 5" {
		t.Fatalf("peek 10: %s, want 2 0 1 3 4 5", got)
	}
	if got := peek(3); got != "2 0 1" {
		t.Fatalf("peek 3: %s, want 2 0 1", got)
	}
	if st := q.Stats(); st.Ready != 6 || st.Delivered != 0 {
		t.Fatalf("peek changed the queue: %+v", st)
	}
}

func joinAll(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out
}
