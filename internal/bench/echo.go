package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
)

// echoDriver is no broker: requests go to handler goroutines over a
// channel and back (the fewest steps a request and its response between
// goroutines take), each published message is handed to its
// subscribers' callbacks in the publisher's goroutine, and a queue is a
// slice in memory whose submits are confirmed at once. A run against it
// shows how many cycles or messages per second the load generator itself
// sustains on this machine: a broker measured near that figure is
// measured by the harness, not the other way round.
type echoDriver struct {
	cfg  *Config
	quit chan struct{} // closed by close
	wg   sync.WaitGroup

	reqs chan echoRequest // to the handlers

	mu     sync.Mutex // guards pong, subs, users, queues, done
	pong   []byte
	subs   []*echoSub            // by subscriber
	users  map[string][]*echoSub // by routing key
	queues map[string]*echoQueue
	done   bool
}

// echoSub is a subscriber's callback; its lock keeps the callback to one
// caller at a time, as a subscription's goroutine would.
type echoSub struct {
	mu sync.Mutex // held while fn runs
	fn func([]byte)
}

func (s *echoSub) deliver(b []byte) {
	s.mu.Lock()
	s.fn(b)
	s.mu.Unlock()
}

var (
	_ driver     = (*echoDriver)(nil)
	_ userDriver = (*echoDriver)(nil)
)

type echoRequest struct {
	body  []byte
	reply chan []byte
}

func newEchoDriver(cfg *Config) *echoDriver {
	return &echoDriver{cfg: cfg, quit: make(chan struct{}), reqs: make(chan echoRequest, 1024), users: map[string][]*echoSub{}}
}

// errEchoClosed is returned by an echo driver's calls after close.
var errEchoClosed = errors.New("bench: echo closed")

func (d *echoDriver) serve(ctx context.Context, n int, pong []byte) error {
	d.mu.Lock()
	d.pong = pong
	d.mu.Unlock()
	for range n {
		d.wg.Go(func() {
			for {
				select {
				case r := <-d.reqs:
					r.reply <- pong
				case <-d.quit:
					return
				}
			}
		})
	}
	return nil
}

type echoRequester struct {
	d     *echoDriver
	reply chan []byte
	pong  []byte
}

func (d *echoDriver) requester(ctx context.Context) (requester, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pong == nil {
		return nil, errors.New("bench: requester before serve")
	}
	return &echoRequester{d: d, reply: make(chan []byte, 1), pong: d.pong}, nil
}

func (r *echoRequester) request(ctx context.Context, body []byte) error {
	select {
	case r.d.reqs <- echoRequest{body: body, reply: r.reply}:
	case <-ctx.Done():
		return ctx.Err()
	case <-r.d.quit:
		return errEchoClosed
	}
	select {
	case b := <-r.reply:
		if !bytes.Equal(b, r.pong) {
			return fmt.Errorf("bench: unexpected response %.20q", b)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-r.d.quit:
		return errEchoClosed
	}
}

func (r *echoRequester) close() error { return nil }

func (d *echoDriver) subscribe(ctx context.Context, n int, fn func(int, []byte)) error {
	subs := make([]*echoSub, n)
	for i := range subs {
		subs[i] = &echoSub{fn: func(b []byte) { fn(i, b) }}
	}
	d.mu.Lock()
	d.subs = subs
	d.mu.Unlock()
	return nil
}

type echoPublisher struct{ d *echoDriver }

func (d *echoDriver) publisher(ctx context.Context) (publisher, error) {
	return echoPublisher{d}, nil
}

// publish hands body to every subscriber's callback.
func (p echoPublisher) publish(ctx context.Context, body []byte) error {
	p.d.mu.Lock()
	subs, done := p.d.subs, p.d.done
	p.d.mu.Unlock()
	if done {
		return errEchoClosed
	}
	for _, s := range subs {
		s.deliver(body)
	}
	return nil
}

func (p echoPublisher) flush(ctx context.Context) error { return nil }

type echoUser struct {
	d   *echoDriver
	req *echoRequester
}

func (d *echoDriver) user(ctx context.Context, i int, keys []string, fn func([]byte)) (userConn, error) {
	r, err := d.requester(ctx)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	for _, k := range keys {
		d.users[k] = append(d.users[k], &echoSub{fn: fn})
	}
	d.mu.Unlock()
	return &echoUser{d: d, req: r.(*echoRequester)}, nil
}

func (u *echoUser) request(ctx context.Context, body []byte) error { return u.req.request(ctx, body) }

// publish hands body to the callbacks of the users of key, and drops it
// if there are none, as a broker drops a message no subscriber matches.
func (u *echoUser) publish(ctx context.Context, key string, body []byte) error {
	u.d.mu.Lock()
	subs := u.d.users[key]
	u.d.mu.Unlock()
	for _, s := range subs {
		s.deliver(body)
	}
	return nil
}

func (u *echoUser) close() error { return nil }

func (d *echoDriver) notes() []string {
	return []string{"no broker: an in-process echo, to show what the load generator itself sustains"}
}

func (d *echoDriver) close() error {
	d.mu.Lock()
	done := d.done
	d.done = true
	queues := d.queues
	d.queues = nil
	d.mu.Unlock()
	if !done {
		close(d.quit)
		for _, q := range queues {
			q.close()
		}
		d.wg.Wait()
	}
	return nil
}

// echoQueue is the echo's durable queue, in memory: submits are
// confirmed at once, and each consumer takes messages while it holds
// fewer than its prefetch.
type echoQueue struct {
	mu      sync.Mutex // guards msgs, unacked, closed
	ready   sync.Cond  // on mu: a message came, or the queue closed
	msgs    [][]byte   // FIFO from head
	head    int
	unacked int64
	closed  bool
}

var _ queueDriver = (*echoDriver)(nil)

func (d *echoDriver) queue(name string) (*echoQueue, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		return nil, errEchoClosed
	}
	if d.queues == nil {
		d.queues = map[string]*echoQueue{}
	}
	q := d.queues[name]
	if q == nil {
		q = &echoQueue{}
		q.ready.L = &q.mu
		d.queues[name] = q
	}
	return q, nil
}

func (d *echoDriver) declareQueue(ctx context.Context, name string) error {
	_, err := d.queue(name)
	return err
}

type echoProducer struct{ q *echoQueue }

func (d *echoDriver) producer(ctx context.Context, name string) (producer, error) {
	q, err := d.queue(name)
	return echoProducer{q}, err
}

func (p echoProducer) submit(ctx context.Context, body []byte, done func(error)) error {
	p.q.mu.Lock()
	if p.q.closed {
		p.q.mu.Unlock()
		return errEchoClosed
	}
	p.q.msgs = append(p.q.msgs, body)
	p.q.mu.Unlock()
	p.q.ready.Signal()
	done(nil)
	return nil
}

func (p echoProducer) close() error { return nil }

// echoDelivery gives its consumer's credit back when acked.
type echoDelivery struct {
	q      *echoQueue
	b      []byte
	credit chan struct{}
}

func (m echoDelivery) body() []byte { return m.b }

func (m echoDelivery) ack() error {
	m.q.mu.Lock()
	m.q.unacked--
	m.q.mu.Unlock()
	<-m.credit
	return nil
}

func (d *echoDriver) consume(ctx context.Context, name string, prefetch int, fn func(delivery)) error {
	q, err := d.queue(name)
	if err != nil {
		return err
	}
	credit := make(chan struct{}, prefetch)
	d.wg.Go(func() {
		for {
			select {
			case credit <- struct{}{}:
			case <-d.quit:
				return
			}
			q.mu.Lock()
			for q.head == len(q.msgs) && !q.closed {
				q.ready.Wait()
			}
			if q.closed {
				q.mu.Unlock()
				return
			}
			b := q.msgs[q.head]
			q.msgs[q.head] = nil
			q.head++
			if q.head > 4096 && q.head*2 > len(q.msgs) {
				q.msgs, q.head = append([][]byte(nil), q.msgs[q.head:]...), 0
			}
			q.unacked++
			q.mu.Unlock()
			fn(echoDelivery{q: q, b: b, credit: credit})
		}
	})
	return nil
}

func (d *echoDriver) depth(ctx context.Context, name string) (int64, error) {
	q, err := d.queue(name)
	if err != nil {
		return 0, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return int64(len(q.msgs)-q.head) + q.unacked, nil
}

func (d *echoDriver) deleteQueue(ctx context.Context, name string) error {
	d.mu.Lock()
	q := d.queues[name]
	delete(d.queues, name)
	d.mu.Unlock()
	if q != nil {
		q.close()
	}
	return nil
}

func (q *echoQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.msgs = nil
	q.mu.Unlock()
	q.ready.Broadcast()
}
