package courier

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier/wire"
)

// Response is one handler's answer to a request.
type Response struct {
	// Tag is the request tag given to [ReqResp.Go].
	Tag string
	// From is the member id of the handler that answered.
	From   string
	Header map[string]string
	Body   []byte
	// Err is set when this handler failed the request, or when no
	// handler could take it.
	Err error
	// Last is set on the final response to a request.
	Last bool
}

// CallOption configures one request.
type CallOption func(*call)

// AskFunc answers a question a handler asks while serving a request. It
// runs on a goroutine of its own.
type AskFunc func(ctx context.Context, question []byte) ([]byte, error)

// OnAsk lets the handler ask this requester questions mid-request; fn
// answers them. Without it, questions fail.
func OnAsk(fn AskFunc) CallOption { return func(cl *call) { cl.onAsk = fn } }

// startRequest sends a REQUEST for cl.
func (e *ReqResp) startRequest(ctx context.Context, cl *call, m *Message, opts []CallOption) error {
	for _, o := range opts {
		o(cl)
	}
	f := wire.NewFrame(wire.TypeRequest)
	f.Ref, f.Name, f.Key, f.Header, f.Body, f.Tag = cl.ref, e.name, m.Key, m.Header, m.Body, m.ServiceTag
	if err := e.c.waitUp(ctx); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok {
		ms := time.Until(d).Milliseconds()
		if ms < 1 {
			f.Release()
			return fmt.Errorf("courier: request to %q: %w", e.name, context.DeadlineExceeded)
		}
		f.Aux = uint64(ms)
	}
	if e.c.waiters {
		cl.direct.Store(cl.ref)
		f.Waiter = cl
	} else if err := e.c.register(cl, f); err != nil {
		f.Release()
		return err
	}
	if err := e.c.sendCtx(ctx, f); err != nil {
		if !e.c.waiters {
			e.c.unregister(cl)
		}
		return err
	}
	return nil
}

// abandon gives up on a request: the broker is told to cancel it.
func (e *ReqResp) abandon(cl *call) {
	if cl.direct.Load() == 0 && !e.c.unregister(cl) {
		return // the final frame took it out of the table meanwhile
	}
	f := wire.NewFrame(wire.TypeCancel)
	f.Ref = cl.ref
	e.c.send(f)
	cl.release()
}

// responseErr is the error an error RESPONSE carries. A deadline the
// broker saw pass is the same timeout as one the Conn saw: it matches
// both [ErrTimeout] and context.DeadlineExceeded.
func responseErr(f *wire.Frame) error {
	err := &wire.Error{Code: wire.Code(f.Aux), Msg: f.Tag}
	if err.Code == wire.CodeTimeout {
		return fmt.Errorf("%w (%w)", err, context.DeadlineExceeded)
	}
	return err
}

func responseOf(f *wire.Frame) *Response {
	r := &Response{From: f.Name, Header: f.Header, Body: f.Body, Last: f.Flags&wire.FlagLast != 0}
	if f.Flags&wire.FlagError != 0 {
		r.Err = responseErr(f)
	}
	return r
}

// Request sends a request and returns its response. On a [Broadcast]
// exchange it returns the first successful response (or, if every handler
// failed, the last failure) and cancels the rest; [ReqResp.RequestAll]
// collects them all.
// The context's deadline travels with the request. A request that no
// handler can take fails at once with [ErrNoHandler].
func (e *ReqResp) Request(ctx context.Context, m Message, opts ...CallOption) (*Response, error) {
	cl := e.c.newCall()
	if err := e.startRequest(ctx, cl, &m, opts); err != nil {
		cl.release()
		return nil, err
	}
	for {
		f, err := e.c.next(ctx, cl)
		if err != nil {
			e.abandon(cl)
			return nil, e.wrap(err)
		}
		if f.Flags&(wire.FlagChunk|wire.FlagEnd) != 0 && f.Flags&wire.FlagError == 0 {
			f.Release()
			e.abandon(cl)
			return nil, fmt.Errorf("courier: request to %q: the handler streams its response: use RequestStream", e.name)
		}
		r := responseOf(f)
		f.Release()
		if r.Err != nil && !r.Last {
			continue // a broadcast: another handler may still succeed
		}
		if r.Last {
			cl.release()
		} else {
			e.abandon(cl) // a broadcast: the first success is enough
		}
		if r.Err != nil {
			return r, r.Err
		}
		return r, nil
	}
}

func (e *ReqResp) wrap(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("courier: request to %q: %w (%w)", e.name, ErrTimeout, err)
	}
	return fmt.Errorf("courier: request to %q: %w", e.name, err)
}

// RequestAll sends a request and collects every response, one per handler
// on a [Broadcast] exchange. Responses that are errors carry Err.
func (e *ReqResp) RequestAll(ctx context.Context, m Message, opts ...CallOption) ([]*Response, error) {
	cl := e.c.newCall()
	if err := e.startRequest(ctx, cl, &m, opts); err != nil {
		cl.release()
		return nil, err
	}
	var out []*Response
	for {
		f, err := e.c.next(ctx, cl)
		if err != nil {
			e.abandon(cl)
			return out, e.wrap(err)
		}
		r := responseOf(f)
		f.Release()
		out = append(out, r)
		if r.Last {
			cl.release()
			if len(out) == 1 && r.Err != nil {
				return out, r.Err
			}
			return out, nil
		}
	}
}

// Go sends a request and returns at once. Every response arrives on out
// with Tag set to tag, the final one with Last set. out must have room or
// a reader: the Conn waits for it.
func (e *ReqResp) Go(ctx context.Context, m Message, tag string, out chan<- *Response, opts ...CallOption) error {
	cl := e.c.newCall()
	if err := e.startRequest(ctx, cl, &m, opts); err != nil {
		cl.release()
		return err
	}
	go func() {
		for {
			f, err := e.c.next(ctx, cl)
			if err != nil {
				e.abandon(cl)
				out <- &Response{Tag: tag, Err: e.wrap(err), Last: true}
				return
			}
			r := responseOf(f)
			f.Release()
			r.Tag = tag
			if r.Last {
				cl.release()
			}
			out <- r
			if r.Last {
				return
			}
		}
	}()
	return nil
}

// Stream is a chunked response being read.
type Stream struct {
	e     *ReqResp
	ctx   context.Context
	cl    *call
	chunk []byte
	from  string
	err   error
	done  bool
}

// RequestStream sends a request whose handler answers in chunks.
func (e *ReqResp) RequestStream(ctx context.Context, m Message, opts ...CallOption) (*Stream, error) {
	cl := e.c.newCall()
	if err := e.startRequest(ctx, cl, &m, opts); err != nil {
		cl.release()
		return nil, err
	}
	return &Stream{e: e, ctx: ctx, cl: cl}, nil
}

// Next waits for the next chunk. It returns false at the end of the
// stream or on an error; see [Stream.Err].
func (s *Stream) Next() bool {
	if s.done {
		return false
	}
	f, err := s.e.c.next(s.ctx, s.cl)
	if err != nil {
		s.finish(s.e.wrap(err), true)
		return false
	}
	defer f.Release()
	s.from = f.Name
	switch {
	case f.Flags&wire.FlagError != 0:
		s.finish(responseErr(f), f.Flags&wire.FlagLast == 0)
		return false
	case f.Flags&wire.FlagChunk != 0:
		s.chunk = f.Body
		return true
	case f.Flags&wire.FlagEnd != 0:
		s.finish(nil, f.Flags&wire.FlagLast == 0)
		return false
	}
	// A plain response is a stream of one chunk.
	s.chunk = f.Body
	s.finish(nil, f.Flags&wire.FlagLast == 0)
	s.done = true
	return true
}

func (s *Stream) finish(err error, abandon bool) {
	s.done, s.err = true, err
	if abandon {
		s.e.abandon(s.cl)
	} else {
		s.cl.release()
	}
	s.cl = nil
}

// Chunk returns the current chunk.
func (s *Stream) Chunk() []byte { return s.chunk }

// From returns the member id of the handler streaming.
func (s *Stream) From() string { return s.from }

// Err returns the error that ended the stream, nil at a clean end.
func (s *Stream) Err() error { return s.err }

// Close cancels the stream if it has not ended; the handler is told.
func (s *Stream) Close() {
	if !s.done {
		s.done = true
		s.e.abandon(s.cl)
		s.cl = nil
	}
}

// answer runs the requester's AskFunc for a question from a handler.
func (c *Conn) answer(fn AskFunc, f *wire.Frame) {
	a := wire.NewFrame(wire.TypeAnswer)
	a.Ref, a.Aux = f.Ref, f.Aux
	if fn == nil {
		a.Flags, a.Tag = wire.FlagError, "the requester takes no questions"
	} else {
		body, err := c.runAsk(fn, f.Body)
		if err != nil {
			a.Flags, a.Tag = wire.FlagError, err.Error()
		} else {
			a.Body = body
		}
	}
	f.Release()
	c.send(a)
}

// runAsk calls fn; a panic becomes an error answer.
func (c *Conn) runAsk(fn AskFunc, q []byte) (body []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("courier: OnAsk function panicked", "conn", c.ID(), "panic", p)
			body, err = nil, errors.New("the requester's OnAsk function failed")
		}
	}()
	return fn(context.Background(), q)
}

// HandlerFunc serves requests. It may respond before or after it returns,
// from any goroutine, with [Request.Reply], [Request.Chunk] and
// [Request.End], or [Request.Fail].
type HandlerFunc func(r *Request)

// Request is a request being served by a handler.
type Request struct {
	a         *Attachment
	id        uint64
	key       string
	header    map[string]string
	body      []byte
	tag       string
	from      string
	deadline  time.Time    // arrival + Aux, with its monotonic reading; zero for none
	sess      uint32       // the connection it came on (see Conn.Interrupted)
	state     atomic.Int32 // reqServing, reqParked or reqFinished
	cancelled atomic.Bool
	ext       atomic.Pointer[reqExtra] // made by Context or Ask
}

// reqExtra is what a request needs only once its handler asks for its
// context or asks the requester a question, kept apart so that the
// common request is small.
type reqExtra struct {
	mu     sync.Mutex // guards ctx, cancel, asks, next
	ctx    context.Context
	cancel context.CancelFunc
	asks   map[uint64]chan *wire.Frame
	next   uint64
}

// extra returns the request's reqExtra, made on first use.
func (r *Request) extra() *reqExtra {
	if e := r.ext.Load(); e != nil {
		return e
	}
	if e := new(reqExtra); r.ext.CompareAndSwap(nil, e) {
		return e
	}
	return r.ext.Load()
}

// Body returns the request's payload.
func (r *Request) Body() []byte { return r.body }

// Key returns the request's key.
func (r *Request) Key() string { return r.key }

// Header returns the request's headers (nil if none).
func (r *Request) Header() map[string]string { return r.header }

// ServiceTag returns the service tag the request named, if any.
func (r *Request) ServiceTag() string { return r.tag }

// From returns the connection id of the requester.
func (r *Request) From() string { return r.from }

// Attachment returns the attachment the request came through.
func (r *Request) Attachment() *Attachment { return r.a }

// Deadline returns the request's deadline, if it has one.
func (r *Request) Deadline() (time.Time, bool) {
	if r.deadline.IsZero() {
		return time.Time{}, false
	}
	return r.deadline, true
}

// Context returns a context that ends when the request's deadline passes
// or the requester cancels or goes away.
func (r *Request) Context() context.Context {
	e := r.extra()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ctx == nil {
		if d, ok := r.Deadline(); ok {
			e.ctx, e.cancel = context.WithDeadline(context.Background(), d)
		} else {
			e.ctx, e.cancel = context.WithCancel(context.Background())
		}
		// Read after ext was set: a cancelCtx that found no ext set
		// cancelled before, and is seen here.
		if r.cancelled.Load() {
			e.cancel()
		}
	}
	return e.ctx
}

// Cancelled reports whether the requester cancelled or went away.
func (r *Request) Cancelled() bool { return r.cancelled.Load() }

func (r *Request) cancelCtx() {
	r.cancelled.Store(true)
	e := r.ext.Load()
	if e == nil {
		return // no context or question yet: they see cancelled
	}
	e.mu.Lock()
	cancel := e.cancel
	for _, ch := range e.asks {
		close(ch)
	}
	e.asks = nil
	e.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// ErrResponded is returned when a request is answered twice.
var ErrResponded = errors.New("courier: request already answered")

func (r *Request) respond(flags wire.Flags, code wire.Code, msg string, body []byte) error {
	final := flags&wire.FlagChunk == 0
	if final {
		if !r.finish() {
			return ErrResponded
		}
		r.cancelCtx2()
		r.endAsks() // answers can no longer find the request
	} else if r.state.Load() == reqFinished {
		return ErrResponded
	}
	if r.sess != r.a.c.sess.Load() {
		// The connection it came on was lost: the broker failed it.
		return fmt.Errorf("courier: answering a request: %w", ErrConnectionLost)
	}
	f := wire.NewFrame(wire.TypeResponse)
	f.Ref, f.Flags, f.Aux, f.Tag, f.Body = r.id, flags, uint64(code), msg, body
	// While the handler function runs on the attachment's goroutine,
	// answers join the attachment's write batch.
	var b *wire.Batch
	if r.a.serving.Load() == r {
		b = &r.a.batch
	}
	f.Batch = b
	err := r.a.c.send(f)
	if b != nil && r.a.serving.Load() != r {
		// Sent from another goroutine while serve was returning: the
		// attachment's goroutine may have flushed its batch before this
		// frame joined it, and it flushes only after its next input.
		b.Flush()
	}
	return err
}

// A request's state: while the handler function runs on the attachment's
// goroutine the request is the attachment's serving one; if the function
// returns without a final answer it is parked in the attachment's active
// map, where a CANCEL or an ANSWER finds it, until it is answered. So a
// handler that answers before it returns, the common case, costs no lock
// and no map.
const (
	reqServing int32 = iota
	reqParked
	reqFinished
)

// finish moves the request to reqFinished; it reports false if it was
// already.
func (r *Request) finish() bool {
	for {
		switch r.state.Load() {
		case reqFinished:
			return false
		case reqServing:
			if r.state.CompareAndSwap(reqServing, reqFinished) {
				return true
			}
		case reqParked:
			if r.state.CompareAndSwap(reqParked, reqFinished) {
				r.a.mu.Lock()
				delete(r.a.active, r.id)
				r.a.mu.Unlock()
				return true
			}
		}
	}
}

// endAsks ends the questions still waiting for an answer.
func (r *Request) endAsks() {
	e := r.ext.Load()
	if e == nil {
		return
	}
	e.mu.Lock()
	for _, ch := range e.asks {
		close(ch)
	}
	e.asks = nil
	e.mu.Unlock()
}

// cancelCtx2 releases the context's resources once the request is done.
func (r *Request) cancelCtx2() {
	e := r.ext.Load()
	if e == nil {
		return
	}
	e.mu.Lock()
	cancel := e.cancel
	e.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// Reply answers the request with body.
func (r *Request) Reply(body []byte) error { return r.respond(0, 0, "", body) }

// Chunk sends one chunk of a streamed response.
func (r *Request) Chunk(body []byte) error { return r.respond(wire.FlagChunk, 0, "", body) }

// End ends a streamed response.
func (r *Request) End() error { return r.respond(wire.FlagEnd, 0, "", nil) }

// Fail answers the request with an error. A *wire.Error keeps its code;
// other errors travel as [ErrApplication] with their text.
func (r *Request) Fail(err error) error {
	var we *wire.Error
	if errors.As(err, &we) {
		return r.respond(wire.FlagError, we.Code, we.Msg, nil)
	}
	return r.respond(wire.FlagError, wire.CodeApplication, err.Error(), nil)
}

// Ask sends the requester a question and waits for its answer, for a
// handler that needs a confirmation or missing data before it responds.
func (r *Request) Ask(ctx context.Context, question []byte) ([]byte, error) {
	ch := make(chan *wire.Frame, 1)
	e := r.extra()
	e.mu.Lock()
	// Both read after ext was set: a cancelCtx or an answer that found
	// no ext set came before, and is seen here.
	if r.cancelled.Load() {
		e.mu.Unlock()
		return nil, ErrCancelled
	}
	if r.state.Load() == reqFinished {
		// Answered already: no answer could find its way back.
		e.mu.Unlock()
		return nil, ErrResponded
	}
	e.next++
	id := e.next
	if e.asks == nil {
		e.asks = make(map[uint64]chan *wire.Frame)
	}
	e.asks[id] = ch
	e.mu.Unlock()
	if r.sess != r.a.c.sess.Load() {
		e.mu.Lock()
		delete(e.asks, id)
		e.mu.Unlock()
		return nil, fmt.Errorf("courier: ask: %w", ErrConnectionLost)
	}
	f := wire.NewFrame(wire.TypeAsk)
	f.Ref, f.Attach, f.Aux, f.Body = r.id, r.a.id, id, question
	if err := r.a.c.sendCtx(ctx, f); err != nil {
		e.mu.Lock()
		delete(e.asks, id)
		e.mu.Unlock()
		return nil, err
	}
	select {
	case a, ok := <-ch:
		if !ok {
			return nil, fmt.Errorf("courier: ask: %w", ErrCancelled)
		}
		defer a.Release()
		if a.Flags&wire.FlagError != 0 {
			return nil, &wire.Error{Code: wire.CodeApplication, Msg: a.Tag}
		}
		return a.Body, nil
	case <-ctx.Done():
		e.mu.Lock()
		delete(e.asks, id)
		e.mu.Unlock()
		return nil, ctx.Err()
	}
}

func (r *Request) answer(f *wire.Frame) {
	e := r.ext.Load()
	if e == nil {
		f.Release() // no question was asked
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	ch := e.asks[f.Aux]
	delete(e.asks, f.Aux)
	if ch == nil {
		f.Release()
		return
	}
	ch <- f // room for one, never blocks
}

// serve runs the handler for a delivered REQUEST.
func (a *Attachment) serve(f *wire.Frame) {
	r := &Request{a: a, id: f.Ref, key: f.Key, header: f.Header, body: f.Body, tag: f.Tag, from: f.Name, sess: a.c.sess.Load()}
	if f.Aux != 0 { // its timeout in ms
		// Counted from arrival on this process's monotonic clock: a wall
		// clock set back or forth meanwhile changes nothing.
		r.deadline = time.Now().Add(time.Duration(f.Aux) * time.Millisecond)
	}
	f.Release()
	a.serving.Store(r)
	defer func() {
		if p := recover(); p != nil {
			a.c.log.Error("courier: handler panicked", "attachment", a.ID(), "panic", p)
			r.Fail(&wire.Error{Code: wire.CodeApplication, Msg: fmt.Sprintf("the handler panicked: %v", p)})
		}
		if r.state.Load() == reqServing {
			a.park(r)
		}
		a.serving.Store(nil) // after park: inline looks here first, then in active
	}()
	a.handler(r)
}

// park keeps a request its handler returned from unanswered, for a later
// answer, a CANCEL or an ANSWER; a stopped attachment cancels it at once.
func (a *Attachment) park(r *Request) {
	a.mu.Lock()
	if !r.state.CompareAndSwap(reqServing, reqParked) {
		a.mu.Unlock()
		return // answered meanwhile
	}
	stopped := a.err != nil
	a.active[r.id] = r
	a.mu.Unlock()
	if stopped {
		r.cancelCtx()
	}
}
