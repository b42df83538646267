package meta

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"
)

// Writes and read indexes go to the leader over a pipelined forwarding
// connection: many requests at once on one stream, each with an id, the
// answers in any order, matched by id. A node of the version before
// answers without ids, one request at a time in order: its answers are
// matched in the order the requests were sent. The other requests
// (status, removal, heartbeats, marks, fencing) keep the pool of
// one-at-a-time connections.

// maxPipelined bounds the requests in flight on one pipelined
// connection, on both sides: a caller beyond it waits for a slot, and
// the serving node reads no further frame until one is answered.
const maxPipelined = 64

// pipeAnswer is what a pipelined request got back.
type pipeAnswer struct {
	resp response
	err  error
}

// pipe is one pipelined forwarding connection to a node.
type pipe struct {
	node  string
	conn  net.Conn
	r     *bufio.Reader
	slots chan struct{}

	wmu sync.Mutex // held while a request is numbered and written

	mu      sync.Mutex // guards the fields below
	next    uint64
	waiting map[uint64]chan pipeAnswer
	order   []uint64 // ids sent and not answered, oldest first
	dead    error    // set once the connection failed; no request is sent after
}

func newPipe(node string, c net.Conn) *pipe {
	p := &pipe{node: node, conn: c, r: bufio.NewReader(c), slots: make(chan struct{}, maxPipelined), waiting: map[uint64]chan pipeAnswer{}}
	go p.readLoop()
	return p
}

// call sends one request and waits for its answer into resp, as
// forwardPool.call: an error before the request was written is a
// notSent; one after leaves the outcome unknown and is an ErrNoQuorum.
func (p *pipe) call(ctx context.Context, typ byte, req *request, resp *response) error {
	select {
	case p.slots <- struct{}{}:
		defer func() { <-p.slots }()
	case <-ctx.Done():
		return notSent{ctx.Err()}
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(maxRequestTime)
	}
	ch := make(chan pipeAnswer, 1)
	id, err := p.send(typ, req, deadline, ch)
	if err != nil {
		return err
	}
	select {
	case a := <-ch:
		if a.err != nil {
			return a.err
		}
		*resp = a.resp
		return nil
	case <-ctx.Done():
		p.mu.Lock()
		delete(p.waiting, id) // the answer, if it comes, is dropped
		p.mu.Unlock()
		return fmt.Errorf("%w: no answer from %s: %w", ErrNoQuorum, p.node, ctx.Err())
	}
}

// send numbers req and writes it; the answer goes to ch.
func (p *pipe) send(typ byte, req *request, deadline time.Time, ch chan pipeAnswer) (uint64, error) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	p.mu.Lock()
	if p.dead != nil {
		err := p.dead
		p.mu.Unlock()
		return 0, notSent{err}
	}
	p.next++
	id := p.next
	p.waiting[id] = ch
	p.order = append(p.order, id)
	p.mu.Unlock()
	req.ID = id
	req.TimeoutMS = max(time.Until(deadline).Milliseconds(), 1)
	p.conn.SetWriteDeadline(time.Now().Add(ioTimeout))
	if err := writeFrame(p.conn, typ, req); err != nil {
		p.mu.Lock()
		delete(p.waiting, id)
		p.order = slices.DeleteFunc(p.order, func(x uint64) bool { return x == id })
		p.mu.Unlock()
		if errors.Is(err, ErrBadFrame) {
			return 0, err // too large: the connection is fine
		}
		p.fail(err)
		return 0, notSent{err}
	}
	return id, nil
}

// readLoop hands each answer to its caller until the connection fails,
// or stays idle (nothing in flight) for maxIdleAge.
func (p *pipe) readLoop() {
	for {
		p.conn.SetReadDeadline(time.Now().Add(maxIdleAge))
		var resp response
		started := false
		typ, err := readFrame(p.r, &resp, func() {
			started = true
			p.conn.SetReadDeadline(time.Now().Add(ioTimeout))
		})
		if err != nil {
			var ne net.Error
			if !started && errors.As(err, &ne) && ne.Timeout() {
				if p.idle() {
					p.fail(errors.New("idle"))
					return
				}
				continue // answers are still due: their callers' deadlines bound them
			}
			p.fail(err)
			return
		}
		if typ != typeOK && typ != typeError {
			p.fail(fmt.Errorf("%w: answer of type %d from %s", ErrBadFrame, typ, p.node))
			return
		}
		if typ == typeError && resp.Err == nil {
			resp.Err = &errInfo{Msg: "meta: error without detail from " + p.node}
		}
		p.deliver(resp)
	}
}

// idle reports, and marks the pipe dead if so, that nothing is in
// flight.
func (p *pipe) idle() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.waiting) > 0 {
		return false
	}
	if p.dead == nil {
		p.dead = errors.New("idle")
	}
	return true
}

// deliver hands resp to the request it answers: by id, or, without an
// id (a node of the version before), the oldest one.
func (p *pipe) deliver(resp response) {
	p.mu.Lock()
	id := resp.ID
	if id == 0 && len(p.order) > 0 {
		id = p.order[0]
	}
	if i := slices.Index(p.order, id); i >= 0 {
		p.order = slices.Delete(p.order, i, i+1)
	}
	ch := p.waiting[id]
	delete(p.waiting, id)
	p.mu.Unlock()
	if ch != nil {
		ch <- pipeAnswer{resp: resp}
	}
}

// fail closes the connection and fails every request in flight: their
// outcome is unknown.
func (p *pipe) fail(err error) {
	p.mu.Lock()
	if p.dead == nil {
		p.dead = err
	}
	waiting := p.waiting
	p.waiting = map[uint64]chan pipeAnswer{}
	p.order = nil
	p.mu.Unlock()
	p.conn.Close()
	for _, ch := range waiting {
		ch <- pipeAnswer{err: fmt.Errorf("%w: no answer from %s: %w", ErrNoQuorum, p.node, err)}
	}
}

func (p *pipe) isDead() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dead != nil
}

// pipeTo returns the pipelined connection to node id, dialing one if
// there is none or it failed; one caller dials, the others wait for it.
func (fp *forwardPool) pipeTo(ctx context.Context, id, addr string) (*pipe, error) {
	for {
		fp.mu.Lock()
		if fp.closed {
			fp.mu.Unlock()
			return nil, ErrClosed
		}
		if p := fp.pipes[id]; p != nil && !p.isDead() {
			fp.mu.Unlock()
			return p, nil
		}
		wait, busy := fp.dialing[id]
		if !busy {
			break // this caller dials; fp.mu is held
		}
		fp.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	done := make(chan struct{})
	if fp.dialing == nil {
		fp.dialing = map[string]chan struct{}{}
	}
	fp.dialing[id] = done
	fp.mu.Unlock()
	c, err := fp.m.cfg.Forward.Dial(ctx, id, addr)
	fp.mu.Lock()
	defer fp.mu.Unlock()
	delete(fp.dialing, id)
	close(done)
	if err != nil {
		return nil, err
	}
	if fp.closed {
		c.Close()
		return nil, ErrClosed
	}
	if fp.pipes == nil {
		fp.pipes = map[string]*pipe{}
	}
	p := newPipe(id, c)
	fp.pipes[id] = p
	return p, nil
}

// pipelined sends a write or read index to node id over its pipelined
// connection. A request refused before it was sent because the
// connection had just failed is sent once more on a new one.
func (fp *forwardPool) pipelined(ctx context.Context, id, addr string, typ byte, req *request, resp *response) error {
	for attempt := 0; ; attempt++ {
		p, err := fp.pipeTo(ctx, id, addr)
		if err != nil {
			return notSent{err}
		}
		err = p.call(ctx, typ, req, resp)
		var ns notSent
		if attempt == 0 && errors.As(err, &ns) && ctx.Err() == nil {
			continue
		}
		return err
	}
}
