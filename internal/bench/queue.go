package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// QueueConfig configures the durable-queue scenarios, tasks and backlog.
// Zero fields take their defaults.
type QueueConfig struct {
	// Window bounds the messages published and not yet confirmed by the
	// broker: the producer pipelines its publishes and waits for a slot
	// when Window confirms are outstanding. Default: 1000.
	Window int
	// Prefetch is each consumer's credit: how many messages it may hold
	// delivered and not yet acked. Default: 100 for tasks, 10 for backlog.
	Prefetch int
	// Depth is the queue depth at which backlog stops. Default: 1000000.
	Depth int
	// SampleEvery is how many backlog iterations go between two samples
	// of the server's memory. Default: 50000.
	SampleEvery int
	// MaxRSS, if above 0, stops backlog once the server's resident
	// memory passes it, in bytes: a guard for a shared machine when the
	// broker keeps the queue in memory. Default: no limit.
	MaxRSS int64
}

func (q QueueConfig) withDefaults(scenario string) QueueConfig {
	if q.Window == 0 {
		q.Window = 1000
	}
	if q.Prefetch == 0 {
		q.Prefetch = 100
		if scenario == "backlog" {
			q.Prefetch = 10
		}
	}
	if q.Depth == 0 {
		q.Depth = 1000000
	}
	if q.SampleEvery == 0 {
		q.SampleEvery = 50000
	}
	return q
}

func (q QueueConfig) validate() error {
	for _, f := range []struct {
		name  string
		value int
	}{{"window", q.Window}, {"prefetch", q.Prefetch}, {"depth", q.Depth}, {"sample-every", q.SampleEvery}, {"max-rss", int(q.MaxRSS)}} {
		if f.value < 0 {
			return fmt.Errorf("bench: %s must be positive, got %d", f.name, f.value)
		}
	}
	if q.Prefetch > 65535 {
		return fmt.Errorf("bench: prefetch at most 65535, got %d", q.Prefetch)
	}
	return nil
}

// queueDriver is a driver's optional capability for the tasks and
// backlog scenarios: a durable queue of persistent messages, producers
// whose publishes the broker confirms once they are safe, and consumers
// with a prefetch limit that ack each message.
type queueDriver interface {
	// declareQueue declares the durable queue name, empty.
	declareQueue(ctx context.Context, name string) error
	// producer returns a producer to the queue, on a connection of its
	// own.
	producer(ctx context.Context, name string) (producer, error)
	// consume attaches a consumer to the queue, on a connection of its
	// own, that holds at most prefetch messages unacked. fn is called
	// with each message, from one goroutine per consumer; it must ack
	// the message, at once or later from any goroutine, and may block
	// only while the consumer holds prefetch messages.
	consume(ctx context.Context, name string, prefetch int, fn func(delivery)) error
	// depth returns how many messages the queue holds, delivered and
	// unacked ones included, as the broker counts them.
	depth(ctx context.Context, name string) (int64, error)
	// deleteQueue deletes the queue and its messages.
	deleteQueue(ctx context.Context, name string) error
}

// producer publishes persistent messages to a queue with confirms. Used
// from one goroutine.
type producer interface {
	// submit publishes body, which it may keep. done is called once,
	// with nil when the broker confirmed the message (it is durable
	// under the broker's policy) or with the error that failed it, from
	// another goroutine or before submit returns; it must not block.
	// submit itself waits only for the broker's flow control.
	submit(ctx context.Context, body []byte, done func(error)) error
	// close closes the producer's connection; a submit waiting for flow
	// control returns. Safe from any goroutine.
	close() error
}

// delivery is a message a consumer received.
type delivery interface {
	body() []byte
	// ack settles the message as handled; safe from any goroutine, once.
	ack() error
}

// window bounds the publishes awaiting their confirm.
type window struct {
	slots chan struct{}
}

func newWindow(n int) *window { return &window{slots: make(chan struct{}, n)} }

// acquire waits for a free slot, or for ctx to end.
func (w *window) acquire(ctx context.Context) error {
	select {
	case w.slots <- struct{}{}:
		return nil
	default:
	}
	select {
	case w.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// release frees a slot; it never blocks.
func (w *window) release() { <-w.slots }

// drain waits until no publish awaits its confirm, or ctx ends.
func (w *window) drain(ctx context.Context) error {
	n := 0
	defer func() {
		for range n {
			<-w.slots
		}
	}()
	for range cap(w.slots) {
		if err := w.acquire(ctx); err != nil {
			return err
		}
		n++
	}
	return nil
}

// confirmer publishes through a producer within a window, and counts the
// confirms and the failures.
type confirmer struct {
	p   producer
	win *window

	confirmed, failed atomic.Int64
	lastAt            atomic.Int64 // of the last confirm, in ns since epoch
	epoch             time.Time
	lat               *recorder // publish (or due) to confirm; may be nil

	mu       sync.Mutex // guards firstErr
	firstErr error
}

func newConfirmer(p producer, window int, epoch time.Time, lat *recorder) *confirmer {
	return &confirmer{p: p, win: newWindow(window), epoch: epoch, lat: lat}
}

// submit publishes body once a window slot is free; the confirm's
// latency counts from due.
func (c *confirmer) submit(ctx context.Context, body []byte, due time.Time) error {
	if err := c.win.acquire(ctx); err != nil {
		return err
	}
	err := c.p.submit(ctx, body, func(err error) {
		now := time.Now()
		if err != nil {
			c.failed.Add(1)
			c.mu.Lock()
			if c.firstErr == nil {
				c.firstErr = err
			}
			c.mu.Unlock()
		} else {
			if c.lat != nil {
				c.lat.record(0, now.Sub(due))
			}
			c.confirmed.Add(1)
			c.lastAt.Store(int64(now.Sub(c.epoch)))
		}
		c.win.release()
	})
	if err != nil {
		c.win.release()
	}
	return err
}

// wait waits for every confirm, and returns the first failure.
func (c *confirmer) wait(ctx context.Context) error {
	if err := c.win.drain(ctx); err != nil {
		return fmt.Errorf("bench: waiting for confirms: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.firstErr != nil {
		return fmt.Errorf("bench: %d publishes failed, the first: %w", c.failed.Load(), c.firstErr)
	}
	return nil
}

// lastConfirm returns when the last confirm came (epoch if none did).
func (c *confirmer) lastConfirm() time.Time {
	return c.epoch.Add(time.Duration(c.lastAt.Load()))
}

// unblockAtEnd closes the producer if ctx ends before the returned func
// is called, so that a submit stuck in the broker's flow control
// returns when the time is up.
func unblockAtEnd(ctx context.Context, p producer) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			p.close()
		case <-done:
		}
	}()
	return func() { close(done) }
}

// openQueue returns the driver's queue capability with a new durable
// queue of a name unique to the run, and a func that deletes it.
func openQueue(ctx context.Context, d driver, cfg *Config, what string) (queueDriver, string, func(), error) {
	qd, ok := d.(queueDriver)
	if !ok {
		return nil, "", nil, fmt.Errorf("%w: %s on %s", ErrNoMapping, what, cfg.Target)
	}
	name := fmt.Sprintf("%s.%d", names(what), queueRuns.Add(1))
	if err := qd.declareQueue(ctx, name); err != nil {
		return nil, "", nil, fmt.Errorf("bench: declare queue %s: %w", name, err)
	}
	return qd, name, func() {
		// A deep queue is gigabytes on disk: delete it even when the
		// run's time is up.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		if err := qd.deleteQueue(dctx, name); err != nil {
			cfg.Log.Warn("bench: delete queue", "queue", name, "err", err)
		}
	}, nil
}

// queueRuns numbers the queues of this process, so that two runs against
// one broker never share a queue.
var queueRuns atomic.Int64

// settleDepth polls the queue's depth until it equals want, or stays the
// same for a second (acks are not confirmed: the last of them may still
// be on their way), or ctx ends, and returns the last reading.
func settleDepth(ctx context.Context, qd queueDriver, name string, want int64) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	last, lastAt := int64(-1), time.Now()
	for {
		n, err := qd.depth(ctx, name)
		if err != nil {
			return last, err
		}
		if n == want {
			return n, nil
		}
		if n != last {
			last, lastAt = n, time.Now()
		} else if time.Since(lastAt) > time.Second {
			return n, nil
		}
		sleepCtx(ctx, 20*time.Millisecond)
		if ctx.Err() != nil {
			return n, nil
		}
	}
}
