package client_test

import (
	"context"
	"errors"
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
