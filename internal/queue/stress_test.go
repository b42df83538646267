package queue

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestConcurrentProducersAndConsumers runs producers, consumers that
// ack, nack, report progress and come and go, and a stats reader, all at
// once (run it with -race). Every message must be settled exactly once,
// no key may have two messages in flight, and the counters must end at
// zero.
func TestConcurrentProducersAndConsumers(t *testing.T) {
	e := newEnv(t)
	q := e.queue(func(c *Config) {
		c.BackoffBase, c.BackoffMax = 0, 0 // retries at once: no clock needed
		c.MaxAttempts = 0
	})
	const producers, perProducer, consumers = 4, 3000, 4
	const total = producers * perProducer

	var mu sync.Mutex
	settled := map[uint64]int{}
	type handle struct{ id string }
	keyHeld := map[string]*handle{}
	dead := map[*handle]bool{}
	var nsettled atomic.Int64
	done := make(chan struct{})
	quit := make(chan struct{})
	var quitOnce sync.Once
	stop := func() { quitOnce.Do(func() { close(quit) }) }
	fail := func(format string, args ...any) {
		t.Errorf(format, args...)
		stop()
	}

	settle := func(c *Consumer, d Delivery, how int) {
		mu.Lock()
		if d.Key != "" {
			delete(keyHeld, d.Key)
		}
		mu.Unlock()
		var err error
		switch how {
		case 0:
			err = q.Ack(c, d.ID)
		case 1:
			err = q.Nack(c, d.ID, true)
		case 2:
			err = q.Nack(c, d.ID, false)
		}
		if err != nil {
			fail("settle %d: %v", d.ID, err)
			return
		}
		if how != 1 {
			mu.Lock()
			settled[d.ID]++
			mu.Unlock()
			if nsettled.Add(1) == total {
				close(done)
			}
		}
	}

	attach := func(id string, prefetch int) (*Consumer, *handle, chan Delivery) {
		ch := make(chan Delivery, prefetch)
		h := &handle{id}
		// Deliver may run before AddConsumer returns (on this goroutine):
		// it knows its consumer by h.
		c, err := q.AddConsumer(id, ConsumerConfig{Prefetch: prefetch, Deliver: func(d Delivery) {
			mu.Lock()
			if dead[h] {
				mu.Unlock()
				return
			}
			if d.Key != "" {
				if holder := keyHeld[d.Key]; holder != nil {
					mu.Unlock()
					fail("key %s delivered to %s while in flight with %s", d.Key, h.id, holder.id)
					return
				}
				keyHeld[d.Key] = h
			}
			mu.Unlock()
			select {
			case ch <- d:
			default:
				fail("Deliver would block: credit exceeded")
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		return c, h, ch
	}

	var wg sync.WaitGroup
	for i := range consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 42))
			gen := 0
			id := func() string { return fmt.Sprintf("c%d.%d", i, gen) }
			c, h, ch := attach(id(), 1+rng.IntN(20))
			for {
				select {
				case <-quit:
					return
				case <-done:
					return
				case d := <-ch:
					if rng.IntN(4) == 0 {
						if err := q.Progress(c, d.ID, rng.IntN(100), "working"); err != nil {
							fail("progress: %v", err)
						}
					}
					switch r := rng.IntN(100); {
					case r < 85:
						settle(c, d, 0)
					case r < 95:
						settle(c, d, 1)
					case r < 97:
						settle(c, d, 2)
					default:
						// Die with this and whatever else is in flight.
						mu.Lock()
						dead[h] = true
						for k, holder := range keyHeld {
							if holder == h {
								delete(keyHeld, k)
							}
						}
						mu.Unlock()
						if err := q.RemoveConsumer(c); err != nil {
							fail("remove: %v", err)
						}
						gen++
						c, h, ch = attach(id(), 1+rng.IntN(20))
					}
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // the management API
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-quit:
				return
			default:
			}
			if s := q.Stats(); s.Ready < 0 || s.Unacked < 0 || s.Delayed < 0 {
				fail("negative gauge: %+v", s)
			}
		}
	}()
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perProducer {
				m := Message{Body: body(i), Priority: uint8(i % 3)}
				if i%2 == 0 {
					m.Key = fmt.Sprintf("key-%d", (p*perProducer+i)%97)
				}
				if _, err := q.Enqueue(m, nil, nil); err != nil {
					fail("enqueue: %v", err)
				}
			}
		}()
	}
	select {
	case <-done:
	case <-quit:
	case <-time.After(2 * time.Minute):
		fail("only %d of %d settled: %+v", nsettled.Load(), total, q.Stats())
	}
	stop()
	wg.Wait()
	if t.Failed() {
		return
	}
	for id, n := range settled {
		if n != 1 {
			t.Fatalf("message %d settled %d times", id, n)
		}
	}
	if len(settled) != total {
		t.Fatalf("%d of %d settled", len(settled), total)
	}
	s := q.Stats()
	if s.Messages() != 0 || s.Bytes != 0 || s.Keys != 0 || s.Published != total {
		t.Fatalf("stats at the end: %+v", s)
	}
	if err := q.check(); err != nil {
		t.Fatal(err)
	}
	if n := e.j.Live(); n != 0 {
		t.Fatalf("%d journal records live", n)
	}
	if bad := e.j.Stats().BadReleases; bad != 0 {
		t.Fatalf("%d bad releases", bad)
	}
}
