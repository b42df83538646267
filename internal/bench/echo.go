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
// goroutines take), and each published message is handed to its
// subscribers' callbacks in the publisher's goroutine. A run against it
// shows how many cycles or messages per second the load generator itself
// sustains on this machine: a broker measured near that figure is
// measured by the harness, not the other way round.
type echoDriver struct {
	cfg  *Config
	quit chan struct{} // closed by close
	wg   sync.WaitGroup

	reqs chan echoRequest // to the handlers

	mu    sync.Mutex // guards pong, subs, users, done
	pong  []byte
	subs  []*echoSub       // by subscriber
	users map[int]*echoSub // by user
	done  bool
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
	return &echoDriver{cfg: cfg, quit: make(chan struct{}), reqs: make(chan echoRequest, 1024), users: map[int]*echoSub{}}
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

func (d *echoDriver) user(ctx context.Context, i int, fn func([]byte)) (userConn, error) {
	r, err := d.requester(ctx)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.users[i] = &echoSub{fn: fn}
	d.mu.Unlock()
	return &echoUser{d: d, req: r.(*echoRequester)}, nil
}

func (u *echoUser) request(ctx context.Context, body []byte) error { return u.req.request(ctx, body) }

// publish hands body to user to's callback, and drops it if that user
// is not there, as a broker drops a message no subscriber matches.
func (u *echoUser) publish(ctx context.Context, to int, body []byte) error {
	u.d.mu.Lock()
	s := u.d.users[to]
	u.d.mu.Unlock()
	if s != nil {
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
	d.mu.Unlock()
	if !done {
		close(d.quit)
		d.wg.Wait()
	}
	return nil
}
