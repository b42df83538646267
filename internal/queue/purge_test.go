package queue

import (
	"testing"
	"time"
)

func TestPurge(t *testing.T) {
	j := NewMemJournal()
	cfg := DefaultConfig()
	cfg.Journal = j
	cfg.BackoffBase, cfg.BackoffMax = time.Hour, time.Hour
	q, err := New("p", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var failed []Reason
	for i := range 6 {
		m := Message{Body: []byte{byte(i)}}
		switch i {
		case 1:
			m.DueAt = time.Now().Add(time.Hour)
		case 2, 3:
			m.Key = "k"
		}
		if _, err := q.Enqueue(m, nil, func(ev Event) {
			if ev.Kind == EventFailed {
				failed = append(failed, ev.Reason)
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	var got []Delivery
	c, err := q.AddConsumer("c", ConsumerConfig{Prefetch: 2, Deliver: func(d Delivery) { got = append(got, d) }})
	if err != nil {
		t.Fatal(err)
	}
	// c holds two messages; nack one so it backs off for an hour.
	if len(got) != 2 {
		t.Fatalf("%d delivered, want 2", len(got))
	}
	if err := q.Nack(c, got[0].ID, true); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d delivered, want 3 (the nack gave credit back)", len(got))
	}
	n, err := q.Purge()
	if err != nil {
		t.Fatal(err)
	}
	st := q.Stats()
	if st.Ready != 0 || st.Delayed != 0 || st.Unacked != 2 {
		t.Fatalf("after purge: %+v", st)
	}
	if want := 6 - int(st.Unacked); n != want || len(failed) != want {
		t.Fatalf("purged %d, %d watchers told; want %d", n, len(failed), want)
	}
	for _, r := range failed {
		if r != ReasonPurged {
			t.Fatalf("reason %q", r)
		}
	}
	if live := j.Live(); live != int(st.Unacked) {
		t.Fatalf("%d records live after the purge, want %d (the messages in flight)", live, st.Unacked)
	}
	// The queue still works, keys included.
	if _, err := q.Enqueue(Message{Key: "k"}, nil, nil); err != nil {
		t.Fatal(err)
	}
	for _, d := range got[1:] {
		q.Ack(c, d.ID)
	}
	if st := q.Stats(); st.Messages() != 1 || st.Unacked != 1 {
		t.Fatalf("after acks: %+v", q.Stats())
	}
}
