package queue

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"
)

// nullJournal accepts records and keeps nothing: it measures what the
// queue spends on encoding them.
type nullJournal struct{ off uint32 }

func (j *nullJournal) Append(_ Kind, p []byte, done func(error)) (Ref, error) {
	j.off += 16 + uint32(len(p))
	if done != nil {
		done(nil)
	}
	return Ref{Seg: 1, Off: j.off, Len: uint32(len(p))}, nil
}

func (j *nullJournal) Release([]Ref, func(error)) error { return nil }

func benchQueue(b *testing.B, journal bool) *Queue {
	cfg := DefaultConfig()
	cfg.Scheduler = NewScheduler(SchedulerOptions{})
	b.Cleanup(cfg.Scheduler.Close)
	if journal {
		cfg.Journal = &nullJournal{}
	}
	q, err := New("bench", cfg)
	if err != nil {
		b.Fatal(err)
	}
	return q
}

func report(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkEnqueueDeliverAck: one queue, 1 KiB messages, one consumer
// with prefetch 100 acking as it goes, on one goroutine: the cost of the
// queue itself per message.
func BenchmarkEnqueueDeliverAck(b *testing.B) {
	for _, journal := range []bool{false, true} {
		b.Run(fmt.Sprintf("journal=%v", journal), func(b *testing.B) {
			q := benchQueue(b, journal)
			var pending []uint64
			c, err := q.AddConsumer("w", ConsumerConfig{Prefetch: 100, Deliver: func(d Delivery) { pending = append(pending, d.ID) }})
			if err != nil {
				b.Fatal(err)
			}
			msg := Message{Body: make([]byte, 1024)}
			b.SetBytes(1024)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := q.Enqueue(msg, nil, nil); err != nil {
					b.Fatal(err)
				}
				if len(pending) == 100 {
					for _, id := range pending {
						q.Ack(c, id)
					}
					pending = pending[:0]
				}
			}
			report(b)
		})
	}
}

// BenchmarkEnqueueDeliverAckParallel: a producer goroutine and a
// consumer goroutine (prefetch 100) that acks each message: the queue's
// lock is contended as it would be by a connection's read loop and a
// worker's.
func BenchmarkEnqueueDeliverAckParallel(b *testing.B) {
	q := benchQueue(b, true)
	ch := make(chan uint64, 100)
	c, err := q.AddConsumer("w", ConsumerConfig{Prefetch: 100, Deliver: func(d Delivery) { ch <- d.ID }})
	if err != nil {
		b.Fatal(err)
	}
	msg := Message{Body: make([]byte, 1024)}
	b.SetBytes(1024)
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range b.N {
			q.Ack(c, <-ch)
		}
	}()
	for range b.N {
		if _, err := q.Enqueue(msg, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
	report(b)
}

// BenchmarkKeyed: 10,000 keys over 4 consumers (prefetch 100 each), one
// goroutine: enqueue, deliver and ack with the keyed machinery (one in
// flight per key, the ring).
func BenchmarkKeyed(b *testing.B) {
	q := benchQueue(b, true)
	const nkeys, ncons = 10_000, 4
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	type cons struct {
		c       *Consumer
		pending []uint64
	}
	cs := make([]*cons, ncons)
	for i := range cs {
		x := &cons{}
		c, err := q.AddConsumer(fmt.Sprint("w", i), ConsumerConfig{Prefetch: 100, Deliver: func(d Delivery) { x.pending = append(x.pending, d.ID) }})
		if err != nil {
			b.Fatal(err)
		}
		x.c = c
		cs[i] = x
	}
	msg := Message{Body: make([]byte, 1024)}
	b.SetBytes(1024)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		msg.Key = keys[i%nkeys]
		i++
		if _, err := q.Enqueue(msg, nil, nil); err != nil {
			b.Fatal(err)
		}
		if i%64 == 0 {
			for _, x := range cs {
				p := x.pending
				x.pending = nil
				for _, id := range p {
					q.Ack(x.c, id)
				}
			}
		}
	}
	report(b)
}

// BenchmarkKeyedParallel: 10,000 keys, 4 consumer goroutines acking and
// one producer goroutine.
func BenchmarkKeyedParallel(b *testing.B) {
	q := benchQueue(b, true)
	const nkeys, ncons = 10_000, 4
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	var acked sync.WaitGroup
	acked.Add(b.N)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range ncons {
		ch := make(chan uint64, 100)
		c, err := q.AddConsumer(fmt.Sprint("w", i), ConsumerConfig{Prefetch: 100, Deliver: func(d Delivery) { ch <- d.ID }})
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case id := <-ch:
					q.Ack(c, id)
					acked.Done()
				case <-stop:
					return
				}
			}
		}()
	}
	msg := Message{Body: make([]byte, 1024)}
	b.SetBytes(1024)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		msg.Key = keys[i%nkeys]
		if _, err := q.Enqueue(msg, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
	acked.Wait()
	b.StopTimer()
	close(stop)
	wg.Wait()
	report(b)
}

// BenchmarkDelayed: enqueue messages due at random times in the next
// hour into a queue already holding 1,000,000 delayed ones (heap
// insertion), then stats.
func BenchmarkDelayedEnqueue(b *testing.B) {
	q := benchQueue(b, false)
	now := q.clock.Now()
	for i := range 1_000_000 {
		q.Enqueue(Message{DueAt: now.Add(1e9 + 3600e9*int64Dur(i*7919%1_000_000)/1_000_000)}, nil, nil)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		q.Enqueue(Message{DueAt: now.Add(1e9 + 3600e9*int64Dur(i*104729%1_000_000)/1_000_000)}, nil, nil)
	}
	report(b)
}

func BenchmarkStats(b *testing.B) {
	q := benchQueue(b, false)
	b.ReportAllocs()
	for b.Loop() {
		_ = q.Stats()
	}
}

// BenchmarkListStats reads the figures of 100,000 queues, one a queue,
// in an order unrelated to the order they were created in, as a listing
// by name does: Stats (both lines of the block and the queue's own
// counters) against Summary (the one line a listing needs). Each
// queue holds one message, so its struct has a map and a message.
//
//	go test ./internal/queue -run '^$' -bench ListStats
func BenchmarkListStats(b *testing.B) {
	const n = 100_000
	sched := NewScheduler(SchedulerOptions{})
	b.Cleanup(sched.Close)
	cfg := DefaultConfig()
	cfg.Scheduler = sched
	qs := make([]*Queue, n)
	for i := range qs {
		q, err := New("q", cfg)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := q.Enqueue(Message{Body: make([]byte, 256)}, nil, nil); err != nil {
			b.Fatal(err)
		}
		qs[(i*7919)%n] = q
	}
	b.Run("Stats", func(b *testing.B) {
		var sum int64
		for b.Loop() {
			for _, q := range qs {
				sum += q.Stats().Ready
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/queue")
	})
	cs := make([]*Counters, n)
	for i, q := range qs {
		cs[i] = q.Counters()
	}
	b.Run("Summary", func(b *testing.B) {
		var sum int64
		for b.Loop() {
			for _, c := range cs {
				sum += c.Summary().Ready
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/queue")
	})
}

type int64Dur = time.Duration
