package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
)

// echoDriver is no broker: requests go to handler goroutines over a
// channel and back, and each message goes straight to its subscribers'
// goroutines. It does the hand-offs a broker does in the fewest steps Go
// allows, so a run against it shows how many cycles or messages per
// second the load generator itself sustains on this machine: a broker
// measured near that figure is measured by the harness, not the other
// way round.
type echoDriver struct {
	cfg  *Config
	quit chan struct{} // closed by close
	wg   sync.WaitGroup

	reqs chan echoRequest // to the handlers

	mu    sync.Mutex // guards pong, subs, users, closed
	pong  []byte
	subs  []chan []byte       // by subscriber
	users map[int]chan []byte // by user
	done  bool
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
	return &echoDriver{cfg: cfg, quit: make(chan struct{}), reqs: make(chan echoRequest, 1024), users: map[int]chan []byte{}}
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

// inbox starts a goroutine that calls fn with what arrives on the
// channel it returns, until close.
func (d *echoDriver) inbox(fn func([]byte)) chan []byte {
	ch := make(chan []byte, 1024)
	d.wg.Go(func() {
		for {
			select {
			case b := <-ch:
				fn(b)
			case <-d.quit:
				return
			}
		}
	})
	return ch
}

func (d *echoDriver) subscribe(ctx context.Context, n int, fn func(int, []byte)) error {
	subs := make([]chan []byte, n)
	for i := range subs {
		subs[i] = d.inbox(func(b []byte) { fn(i, b) })
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

// publish hands body to every subscriber, waiting while one's inbox is
// full: back-pressure, as a broker's credit gives.
func (p echoPublisher) publish(ctx context.Context, body []byte) error {
	p.d.mu.Lock()
	subs := p.d.subs
	p.d.mu.Unlock()
	for _, ch := range subs {
		if err := p.d.send(ctx, ch, body); err != nil {
			return err
		}
	}
	return nil
}

func (d *echoDriver) send(ctx context.Context, ch chan []byte, body []byte) error {
	select {
	case ch <- body:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-d.quit:
		return errEchoClosed
	}
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
	ch := d.inbox(fn)
	d.mu.Lock()
	d.users[i] = ch
	d.mu.Unlock()
	return &echoUser{d: d, req: r.(*echoRequester)}, nil
}

func (u *echoUser) request(ctx context.Context, body []byte) error { return u.req.request(ctx, body) }

// publish hands body to user to, and drops it if that user is not
// there, as a broker drops a message no subscriber matches.
func (u *echoUser) publish(ctx context.Context, to int, body []byte) error {
	u.d.mu.Lock()
	ch := u.d.users[to]
	u.d.mu.Unlock()
	if ch == nil {
		return nil
	}
	return u.d.send(ctx, ch, body)
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
