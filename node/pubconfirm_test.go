package node_test

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
)

// TestPublishAsyncConfirms: on an embedded node, PublishAsync pipelines
// confirmed publishes into a durable subscription, each confirmed once,
// and PublishSync waits for its confirm; every confirmed message is in
// the subscription's queue when the node comes back.
func TestPublishAsyncConfirms(t *testing.T) {
	dir := t.TempDir()
	ctx := testutil.Context(t, time.Minute)
	n, err := node.Start(node.Config{DataDir: dir, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { n.Close() }()
	c := n.Connect()
	ps, err := c.PubSub(ctx, "events")
	if err != nil {
		t.Fatal(err)
	}
	a, err := ps.Subscribe(ctx, "audit.#", func(*courier.Delivery) {}, courier.Durable("audit"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	const total = 2000
	var mu sync.Mutex
	confirms := map[int]int{}
	var failed []error
	for i := range total {
		err := ps.PublishAsync(ctx, courier.Message{Key: "audit.x", Body: []byte(strconv.Itoa(i))}, func(err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, err)
			}
			confirms[i]++
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := ps.PublishSync(ctx, courier.Message{Key: "audit.x", Body: []byte("sync")}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForf(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(confirms) == total
	}, "%d confirms", total)
	mu.Lock()
	for i, k := range confirms {
		if k != 1 {
			t.Errorf("message %d confirmed %d times", i, k)
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d publishes failed, the first: %v", len(failed), failed[0])
	}
	mu.Unlock()
	c.Close()
	n.Close()

	n, err = node.Start(node.Config{DataDir: dir, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := n.Broker().Queue("events/audit").Stats().Messages(), int64(total+1); got != want {
		t.Fatalf("after the restart the subscription holds %d messages, want %d", got, want)
	}
}
