package node_test

import (
	"io"
	"log/slog"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestRestartKeepsTasks: durable task exchanges, their tasks (ready,
// unsettled, delayed, retried) and durable subscriptions with their
// backlog come back when a node restarts on the same data directory;
// transient exchanges do not. Tasks held by workers when the node stops
// are ready again, not failed. With a checkpoint taken in the middle, the
// restart reads it and replays the records after it; without, it replays
// the log from the start (the node's own checkpoints at start and stop
// aside).
func TestRestartKeepsTasks(t *testing.T) {
	t.Run("Checkpoint", func(t *testing.T) { restartKeepsTasks(t, true) })
	t.Run("LogOnly", func(t *testing.T) { restartKeepsTasks(t, false) })
}

func restartKeepsTasks(t *testing.T, checkpoint bool) {
	dir := t.TempDir()
	ctx := testutil.Context(t, 30*time.Second)
	n, err := node.Start(node.Config{DataDir: dir, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	c := n.Connect()
	jobs, err := c.Tasks(ctx, "jobs", courier.MaxAttempts(5), courier.Backoff(time.Hour, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Tasks(ctx, "scratch", courier.Transient()); err != nil {
		t.Fatal(err)
	}
	ps, err := c.PubSub(ctx, "events")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := c.PubSub(ctx, "events")
	if err != nil {
		t.Fatal(err)
	}
	a, err := sub.Subscribe(ctx, "order.#", func(*courier.Delivery) {}, courier.Durable("audit"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := jobs.Submit(ctx, courier.Task{Body: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
		if i == 4 && checkpoint {
			if err := n.Broker().Checkpoint(); err != nil {
				t.Fatal(err)
			}
		}
	}
	due := time.Now().Add(time.Hour)
	delayedID, err := jobs.Submit(ctx, courier.Task{Body: []byte("later"), DueAt: due})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"order.1", "other", "order.2"} {
		if err := ps.PublishSync(ctx, courier.Message{Key: k}); err != nil {
			t.Fatal(err)
		}
	}
	// One task acked, one failed once (backing off for an hour), one left
	// unsettled: after the restart the first is gone, the second still
	// waits with its attempt counted, the third is ready again.
	got := make(chan *courier.Job, 16)
	w, err := jobs.Work(ctx, func(j *courier.Job) error { j.Defer(); got <- j; return nil }, courier.Prefetch(3))
	if err != nil {
		t.Fatal(err)
	}
	var held []*courier.Job
	for range 3 {
		select {
		case j := <-got:
			held = append(held, j)
		case <-ctx.Done():
			t.Fatal("tasks not delivered")
		}
	}
	held[0].Ack()
	held[1].Nack(true)
	testutil.WaitForf(t, 10*time.Second, func() bool {
		q := n.Broker().Queue("jobs").Stats()
		return q.Acked == 1 && q.Delayed == 2
	}, "ack and nack applied")
	_ = w
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	n, err = node.Start(node.Config{DataDir: dir, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	c = n.Connect()
	list, err := c.Exchanges(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, x := range list {
		names = append(names, x.Name)
	}
	if !slices.Equal(names, []string{"events", "jobs"}) {
		t.Fatalf("exchanges after restart %q: want events and jobs (scratch was transient)", names)
	}
	q := n.Broker().Queue("jobs").Stats()
	if q.Ready != 8 || q.Delayed != 2 || q.Unacked != 0 {
		t.Fatalf("after restart: %d ready, %d delayed, %d unacked; want 8, 2 (one retry, one due later), 0", q.Ready, q.Delayed, q.Unacked)
	}
	jobs, err = c.Tasks(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	var bodies []string
	done := make(chan struct{})
	if _, err := jobs.Work(ctx, func(j *courier.Job) error {
		bodies = append(bodies, string(j.Body))
		if j.ID == delayedID {
			t.Errorf("the delayed task came early")
		}
		if len(bodies) == 8 {
			close(done)
		}
		return nil
	}, courier.Prefetch(1)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("after restart only %q delivered", bodies)
	}
	slices.Sort(bodies)
	want := []string{"2", "3", "4", "5", "6", "7", "8", "9"}
	if !slices.Equal(bodies, want) {
		t.Fatalf("after restart delivered %q, want %q", bodies, want)
	}
	var keys []string
	ev, err := c.PubSub(ctx, "events")
	if err != nil {
		t.Fatal(err)
	}
	kc := make(chan string, 4)
	if _, err := ev.Subscribe(ctx, "", func(d *courier.Delivery) { kc <- d.Key }, courier.Durable("audit")); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case k := <-kc:
			keys = append(keys, k)
		case <-ctx.Done():
			t.Fatalf("durable subscription backlog: only %q", keys)
		}
	}
	if !slices.Equal(keys, []string{"order.1", "order.2"}) {
		t.Fatalf("durable subscription backlog %q", keys)
	}
	// Its binding survived too.
	if err := ev.PublishSync(ctx, courier.Message{Key: "order.3"}); err != nil {
		t.Fatal(err)
	}
	select {
	case k := <-kc:
		if k != "order.3" {
			t.Fatalf("after restart got %q", k)
		}
	case <-ctx.Done():
		t.Fatal("the durable subscription's binding did not survive")
	}
}

// TestDeleteReleasesRecords: deleting a durable task exchange releases
// every record of its queue, tasks in flight included, so that the
// store's segments can go; the exchange does not come back at restart.
func TestDeleteReleasesRecords(t *testing.T) {
	dir := t.TempDir()
	ctx := testutil.Context(t, 30*time.Second)
	n, err := node.Start(node.Config{DataDir: dir, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	c := n.Connect()
	ex, err := c.Tasks(ctx, "doomed")
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if _, err := ex.Submit(ctx, courier.Task{Body: make([]byte, 100)}); err != nil {
			t.Fatal(err)
		}
	}
	held := make(chan struct{}, 10)
	if _, err := ex.Work(ctx, func(j *courier.Job) error { j.Defer(); held <- struct{}{}; return nil }, courier.Prefetch(10)); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		<-held
	}
	live := n.Broker().Store().Stats().LiveRecords
	if live < 100 {
		t.Fatalf("%d live records with 100 tasks queued", live)
	}
	if err := c.DeleteExchange(ctx, "doomed"); err != nil {
		t.Fatal(err)
	}
	if err := n.Broker().Checkpoint(); err != nil {
		t.Fatal(err)
	}
	// What may stay: the definition's records until the next checkpoint
	// releases them.
	if live := n.Broker().Store().Stats().LiveRecords; live > 2 {
		t.Fatalf("%d records still live after the exchange was deleted", live)
	}
	n.Close()
	n, err = node.Start(node.Config{DataDir: dir, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.Broker().Exchange("doomed") != nil {
		t.Fatal("the deleted exchange came back")
	}
}
