package queue_test

import (
	"fmt"

	"github.com/courier-mq/courier/internal/queue"
)

// A worker with prefetch 2 takes tasks, reports progress and acks; the
// submitter watches its task to completion.
func Example() {
	sched := queue.NewScheduler(queue.SchedulerOptions{})
	defer sched.Close()
	cfg := queue.DefaultConfig()
	cfg.Scheduler = sched
	cfg.Journal = queue.NewMemJournal() // the store, in a node
	q, err := queue.New("media", cfg)
	if err != nil {
		panic(err)
	}

	// The consumer side buffers: Deliver must not block.
	inbox := make(chan queue.Delivery, 2)
	w, err := q.AddConsumer("worker-1", queue.ConsumerConfig{Prefetch: 2, Deliver: func(d queue.Delivery) { inbox <- d }})
	if err != nil {
		panic(err)
	}

	id, err := q.Enqueue(queue.Message{Body: []byte("transcode a.mp4"), Key: "user-42"},
		func(err error) { fmt.Println("confirmed:", err == nil) },
		func(ev queue.Event) { fmt.Println("event:", ev.Kind, ev.Percent) })
	if err != nil {
		panic(err)
	}

	d := <-inbox
	fmt.Printf("delivered %d %q\n", d.ID, d.Body)
	q.Progress(w, d.ID, 50, "half done")
	q.Ack(w, id)
	fmt.Printf("%+v\n", q.Stats().Messages())
	// Output:
	// confirmed: true
	// delivered 1 "transcode a.mp4"
	// event: progress 50
	// event: completed 0
	// 0
}
