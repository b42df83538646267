package meta

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

// fakeLeader accepts forwarding connections on 127.0.0.1:0 and answers
// with serve(conn).
type fakeLeader struct {
	ln    net.Listener
	dials int
	mu    sync.Mutex
}

func (f *fakeLeader) Accept() (net.Conn, error) { return f.ln.Accept() }
func (f *fakeLeader) Close() error              { return f.ln.Close() }
func (f *fakeLeader) Addr() net.Addr            { return f.ln.Addr() }
func (f *fakeLeader) Dial(ctx context.Context, _, _ string) (net.Conn, error) {
	f.mu.Lock()
	f.dials++
	f.mu.Unlock()
	var d net.Dialer
	return d.DialContext(ctx, "tcp", f.ln.Addr().String())
}

func startFakeLeader(t *testing.T, serve func(net.Conn)) (*fakeLeader, *forwardPool) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeLeader{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	pool := &forwardPool{m: &Meta{cfg: Config{Forward: f}}}
	t.Cleanup(func() { pool.closeAll(); ln.Close() })
	return f, pool
}

// TestPipeAnswersOutOfOrder: requests in flight at once on one
// connection, answered in reverse order, each get their own answer.
func TestPipeAnswersOutOfOrder(t *testing.T) {
	const k = 8
	f, pool := startFakeLeader(t, func(c net.Conn) {
		defer c.Close()
		r := bufio.NewReader(c)
		var reqs []request
		for range k {
			var req request
			if _, err := readFrame(r, &req, nil); err != nil {
				return
			}
			reqs = append(reqs, req)
		}
		for i := len(reqs) - 1; i >= 0; i-- {
			writeFrame(c, typeOK, response{ID: reqs[i].ID, Index: uint64(len(reqs[i].Node))})
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, k)
	for i := range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := fmt.Sprintf("%0*d", i+1, 0) // i+1 characters long
			var resp response
			if err := pool.pipelined(ctx, "l", "l", typeRead, &request{Node: node}, &resp); err != nil {
				errs <- err
				return
			}
			if resp.Index != uint64(i+1) {
				errs <- fmt.Errorf("request %d got the answer of %d", i+1, resp.Index)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dials != 1 {
		t.Errorf("%d connections for %d requests at once, want 1", f.dials, k)
	}
}

// TestPipeOldLeader: a node of the version before answers one request at
// a time, in order, without ids: the answers are matched in order.
func TestPipeOldLeader(t *testing.T) {
	_, pool := startFakeLeader(t, func(c net.Conn) {
		defer c.Close()
		r := bufio.NewReader(c)
		for {
			var req struct {
				Node string `json:"node"`
			}
			if _, err := readFrame(r, &req, nil); err != nil {
				return
			}
			writeFrame(c, typeOK, struct {
				Index uint64 `json:"index"`
			}{uint64(len(req.Node))})
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var resp response
			err := pool.pipelined(ctx, "l", "l", typeRead, &request{Node: fmt.Sprintf("%0*d", i+1, 0)}, &resp)
			if err != nil || resp.Index != uint64(i+1) {
				t.Errorf("request %d: %v, answer %d", i+1, err, resp.Index)
			}
		}()
	}
	wg.Wait()
}

// TestPipeFailsInFlight: a connection that breaks fails every request
// in flight with an unknown outcome (ErrNoQuorum), and the next request
// dials again.
func TestPipeFailsInFlight(t *testing.T) {
	var mu sync.Mutex
	conns := 0
	f, pool := startFakeLeader(t, func(c net.Conn) {
		mu.Lock()
		conns++
		first := conns == 1
		mu.Unlock()
		r := bufio.NewReader(c)
		var req request
		if _, err := readFrame(r, &req, nil); err != nil {
			return
		}
		if first {
			c.Close() // no answer
			return
		}
		writeFrame(c, typeOK, response{ID: req.ID, Index: 7})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var resp response
	err := pool.pipelined(ctx, "l", "l", typeApply, &request{}, &resp)
	var ns notSent
	if !errors.Is(err, ErrNoQuorum) || errors.As(err, &ns) || !unknownOutcome(err) {
		t.Fatalf("a request whose connection broke: %v, want an unknown outcome", err)
	}
	if err := pool.pipelined(ctx, "l", "l", typeApply, &request{}, &resp); err != nil || resp.Index != 7 {
		t.Fatalf("the next request: %v, %+v", err, resp)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dials != 2 {
		t.Fatalf("%d dials, want 2", f.dials)
	}
}
