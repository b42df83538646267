package node_test

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
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

// BenchmarkPublishDurableSub measures publishing 1 KiB messages into a
// durable subscription on the real disk (the test's temporary
// directory), embedded and over TCP: without confirms (Publish), with
// pipelined confirms (PublishAsync, 1,000 in flight) and with a confirm
// at a time (PublishSync). Each confirm waits for the group commit's
// fsync.
func BenchmarkPublishDurableSub(b *testing.B) {
	ctx := testutil.Context(b, 10*time.Minute)
	n, err := node.Start(node.Config{DataDir: b.TempDir(), Listen: "127.0.0.1:0", Log: quiet()})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	remote, err := client.Dial(ctx, "courier://"+n.Addr().String(), client.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer remote.Close()
	m := courier.Message{Key: "audit.x", Body: make([]byte, 1024)}
	for _, via := range []struct {
		name string
		conn *courier.Conn
	}{{"embedded", n.Connect()}, {"tcp", remote}} {
		ps, err := via.conn.PubSub(ctx, "events")
		if err != nil {
			b.Fatal(err)
		}
		publish := map[string]func(b *testing.B){
			"Publish": func(b *testing.B) {
				for b.Loop() {
					if err := ps.PublishMsg(ctx, m); err != nil {
						b.Fatal(err)
					}
				}
				if err := ps.PublishSync(ctx, m); err != nil { // all routed
					b.Fatal(err)
				}
			},
			"PublishAsync": func(b *testing.B) {
				window := make(chan struct{}, 1000)
				var wg sync.WaitGroup
				for b.Loop() {
					window <- struct{}{}
					wg.Add(1)
					if err := ps.PublishAsync(ctx, m, func(err error) {
						if err != nil {
							b.Error(err)
						}
						<-window
						wg.Done()
					}); err != nil {
						b.Fatal(err)
					}
				}
				wg.Wait()
			},
			"PublishSync": func(b *testing.B) {
				for b.Loop() {
					if err := ps.PublishSync(ctx, m); err != nil {
						b.Fatal(err)
					}
				}
			},
		}
		for _, how := range []string{"Publish", "PublishAsync", "PublishSync"} {
			b.Run(via.name+"/"+how, func(b *testing.B) {
				a, err := ps.Subscribe(ctx, "audit.#", func(*courier.Delivery) {}, courier.Durable("bench"))
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Detach(ctx); err != nil {
					b.Fatal(err)
				}
				defer via.conn.DeleteQueue(ctx, "events/bench")
				b.ReportAllocs()
				publish[how](b)
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			})
		}
	}
}
