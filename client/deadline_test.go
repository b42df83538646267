package client_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
)

// freezer forwards TCP connections to a server until it is frozen: then
// it stops moving bytes both ways and keeps the sockets open, as a peer
// whose process hangs (or a network that drops every packet) does: the
// client's writes are taken by the kernel, nothing comes back, and no
// error ever comes.
type freezer struct {
	ln     net.Listener
	frozen chan struct{}
	once   sync.Once
	mu     sync.Mutex
	conns  []net.Conn
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	z := &freezer{ln: ln, frozen: make(chan struct{})}
	t.Cleanup(func() {
		ln.Close()
		z.mu.Lock()
		for _, c := range z.conns {
			c.Close()
		}
		z.mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			z.mu.Lock()
			z.conns = append(z.conns, c, s)
			z.mu.Unlock()
			go z.pipe(s, c)
			go z.pipe(c, s)
		}
	}()
	return z
}

// pipe copies r to w until the freezer is frozen; then it holds.
func (z *freezer) pipe(w, r net.Conn) {
	b := make([]byte, 32<<10)
	for {
		n, err := r.Read(b)
		select {
		case <-z.frozen:
			return // what was read is dropped; the sockets stay open
		default:
		}
		if n > 0 {
			if _, werr := w.Write(b[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (z *freezer) freeze() { z.once.Do(func() { close(z.frozen) }) }

func (z *freezer) url() string { return "courier://" + z.ln.Addr().String() }

// deadlineSlack is how late after its deadline a request may end on this
// loaded machine: the promise is deadline + a small ε, and a test only
// proves it within a scheduler's delay.
const deadlineSlack = time.Second

// TestDeadlineOnFrozenConnection: a request's outcome comes by its
// deadline whatever the server does. The server's link freezes (bytes
// stop both ways, no error, no close): requests in flight and requests
// made after the freeze end with ErrTimeout at their deadline, from the
// client's own timer, long before any heartbeat notices.
func TestDeadlineOnFrozenConnection(t *testing.T) {
	n := startNode(t, "127.0.0.1:0", t.TempDir())
	ctx := testutil.Context(t, 2*wait)
	svc, err := client.Dial(ctx, "courier://"+n.Addr().String(), client.Options{Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	ex, err := svc.ReqResp(ctx, "frozen", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan *courier.Request, 16)
	if _, err := ex.Handle(ctx, func(r *courier.Request) { held <- r }); err != nil {
		t.Fatal(err)
	}
	z := newFreezer(t, n.Addr().String())
	// A long heartbeat: only the request's own deadline can end it.
	req, err := client.Dial(ctx, z.url(), client.Options{Log: quiet(), NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer req.Close()
	rr, err := req.ReqResp(ctx, "frozen")
	if err != nil {
		t.Fatal(err)
	}
	const deadline = 500 * time.Millisecond
	type result struct {
		took time.Duration
		err  error
	}
	results := make(chan result, 8)
	ask := func() {
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		_, err := rr.Request(rctx, courier.Message{Body: []byte("x")})
		results <- result{time.Since(start), err}
	}
	go ask()
	testutil.Recv(t, held, wait) // in flight at the handler
	z.freeze()
	for range 3 {
		go ask() // sent into the frozen connection
	}
	for range 4 {
		r := testutil.Recv(t, results, wait)
		if !errors.Is(r.err, courier.ErrTimeout) || !errors.Is(r.err, context.DeadlineExceeded) {
			t.Errorf("request ended with %v after %v; want ErrTimeout", r.err, r.took)
		}
		if r.took > deadline+deadlineSlack {
			t.Errorf("request ended %v after it started: its deadline was %v (+%v)", r.took, deadline, deadlineSlack)
		}
	}
}

// gate forwards TCP connections to a server on a fixed port, and can be
// shut (its listener closed and its connections cut: the server looks
// gone) and opened again on the same port.
type gate struct {
	t      *testing.T
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  []net.Conn
}

func newGate(t *testing.T, target string) *gate {
	g := &gate{t: t, target: target}
	g.open("127.0.0.1:0")
	t.Cleanup(g.shut)
	return g
}

func (g *gate) open(addr string) {
	var ln net.Listener
	testutil.WaitForf(g.t, wait, func() bool {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err == nil
	}, "listening on %s", addr)
	g.mu.Lock()
	g.ln, g.addr = ln, ln.Addr().String()
	g.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", g.target)
			if err != nil {
				c.Close()
				continue
			}
			g.mu.Lock()
			g.conns = append(g.conns, c, s)
			g.mu.Unlock()
			go func() { io.Copy(s, c); s.Close() }()
			go func() { io.Copy(c, s); c.Close() }()
		}
	}()
}

func (g *gate) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ln != nil {
		g.ln.Close()
	}
	for _, c := range g.conns {
		c.Close()
	}
	g.conns = nil
}

// TestRequestWhileReconnectingKeepsItsDeadline: a request made while
// the client has no connection waits for one, and then goes out with
// the time its deadline has left, not the whole timeout again: the
// handler sees the deadline the requester set.
func TestRequestWhileReconnectingKeepsItsDeadline(t *testing.T) {
	n := startNode(t, "127.0.0.1:0", t.TempDir())
	ctx := testutil.Context(t, 2*wait)
	svc, err := client.Dial(ctx, "courier://"+n.Addr().String(), client.Options{Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	ex, err := svc.ReqResp(ctx, "later", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	deadlines := make(chan time.Time, 1)
	if _, err := ex.Handle(ctx, func(r *courier.Request) {
		d, _ := r.Deadline()
		deadlines <- d
		r.Reply(nil)
	}); err != nil {
		t.Fatal(err)
	}
	g := newGate(t, n.Addr().String())
	events := newConnEvents()
	req, err := client.Dial(ctx, "courier://"+g.addr, client.Options{Log: quiet(), OnConnEvent: events.fn, IgnoreDiscoveredURLs: true,
		ReconnectWait: 20 * time.Millisecond, ReconnectWaitMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer req.Close()
	rr, err := req.ReqResp(ctx, "later")
	if err != nil {
		t.Fatal(err)
	}
	g.shut()
	events.next(t, courier.ConnDisconnected)
	const timeout = 4 * time.Second
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		_, err := rr.Request(rctx, courier.Message{})
		done <- err
	}()
	// The server stays away for a while: the request waits for it.
	const away = 1500 * time.Millisecond
	time.Sleep(away)
	g.open(g.addr)
	if err := testutil.Recv(t, done, wait); err != nil {
		t.Fatalf("request made while reconnecting: %v", err)
	}
	d := testutil.Recv(t, deadlines, wait)
	t.Logf("the handler's deadline: %v after the request was made (timeout %v, the server away %v)", d.Sub(start), timeout, away)
	// The handler's deadline is the requester's (start + timeout), give
	// or take the milliseconds the deadline is carried in; had the
	// timeout started again when the request went out, it would be
	// start + away + timeout.
	if limit := start.Add(timeout + 200*time.Millisecond); d.After(limit) {
		t.Fatalf("the handler's deadline is %v after the request was made; the requester's was %v", d.Sub(start), timeout)
	}
}
