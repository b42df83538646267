package meta

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// notSent is a forwarding failure before the request was whole on the
// wire: the leader cannot have acted on it, so it may be retried.
type notSent struct{ err error }

func (e notSent) Error() string { return "meta: request not sent: " + e.err.Error() }
func (e notSent) Unwrap() error { return e.err }

// Bounds of the client side.
const (
	// maxIdlePerNode is how many idle forwarding connections are kept
	// per node.
	maxIdlePerNode = 4
	// maxIdleAge drops an idle connection well before the server's
	// idleTimeout closes it, so that a request is not sent on a
	// connection the server is closing.
	maxIdleAge = idleTimeout / 2
)

type pooledConn struct {
	net.Conn
	r    *bufio.Reader
	idle time.Time
}

// forwardPool keeps connections to the forwarding listeners of other
// nodes, one request at a time on each.
type forwardPool struct {
	m     *Meta
	mu    sync.Mutex
	idle  map[string][]*pooledConn
	pipes map[string]*pipe // see pipe.go
	// dialing holds, per node, a channel closed when the dial of its
	// pipe ends.
	dialing map[string]chan struct{}
	closed  bool
}

func (p *forwardPool) get(ctx context.Context, id, addr string) (*pooledConn, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	for list := p.idle[id]; len(list) > 0; list = p.idle[id] {
		c := list[len(list)-1]
		p.idle[id] = list[:len(list)-1]
		if time.Since(c.idle) < maxIdleAge {
			p.mu.Unlock()
			return c, nil
		}
		c.Close()
	}
	p.mu.Unlock()
	c, err := p.m.cfg.Forward.Dial(ctx, id, addr)
	if err != nil {
		return nil, err
	}
	return &pooledConn{Conn: c, r: bufio.NewReader(c)}, nil
}

func (p *forwardPool) put(id string, c *pooledConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle[id]) >= maxIdlePerNode {
		c.Close()
		return
	}
	if p.idle == nil {
		p.idle = map[string][]*pooledConn{}
	}
	c.idle = time.Now()
	p.idle[id] = append(p.idle[id], c)
}

func (p *forwardPool) closeAll() {
	p.mu.Lock()
	p.closed = true
	for _, list := range p.idle {
		for _, c := range list {
			c.Close()
		}
	}
	p.idle = nil
	pipes := p.pipes
	p.pipes = nil
	p.mu.Unlock()
	for _, pp := range pipes {
		pp.fail(ErrClosed)
	}
}

// call sends one request to node id and reads its answer into resp. An
// error before the request was written is a notSent; one after leaves
// the outcome unknown and is an ErrNoQuorum.
func (p *forwardPool) call(ctx context.Context, id, addr string, typ byte, req *request, resp *response) error {
	c, err := p.get(ctx, id, addr)
	if err != nil {
		return notSent{err}
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(maxRequestTime)
	}
	c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	req.TimeoutMS = max(time.Until(deadline).Milliseconds(), 1)
	if err := writeFrame(c, typ, req); err != nil {
		c.Close()
		if errors.Is(err, ErrBadFrame) {
			return err // too large: sending it again would not help
		}
		return notSent{err}
	}
	rtyp, err := readFrame(c.r, resp, nil)
	if err != nil {
		c.Close()
		return fmt.Errorf("%w: no answer from %s: %w", ErrNoQuorum, id, err)
	}
	if rtyp != typeOK && rtyp != typeError {
		c.Close()
		return fmt.Errorf("%w: answer of type %d from %s", ErrBadFrame, rtyp, id)
	}
	if rtyp == typeError && resp.Err == nil {
		resp.Err = &errInfo{Msg: "meta: error without detail from " + id}
	}
	if !stop() {
		// ctx ended while the answer came: the deadline moved; the
		// connection is fine but not worth keeping.
		c.Close()
		return nil
	}
	c.SetDeadline(time.Time{})
	p.put(id, c)
	return nil
}
