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
