// Package courier is the Go API of Courier, a broker for distributed,
// reactive services. The same [Conn] works with a broker embedded in the
// process (node.Start(...).Connect()) and with a server over the network
// (client.Dial), so code moves between the two unchanged.
//
// A Conn opens exchanges: [Conn.ReqResp] for request-response with a
// balancing [Strategy], [Conn.PubSub] for publish-subscribe with topic
// patterns. Handlers, subscribers and controllers attach to an exchange;
// every attachment is an [Attachment] that sees its group's leader and
// members.
//
//	users, err := conn.ReqResp(ctx, "users", courier.RoundRobin)
//	users.Handle(ctx, func(r *courier.Request) { r.Reply(pong) })
//	resp, err := users.Request(ctx, courier.Message{Body: ping})
package courier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier/wire"
)

// Transport carries frames between a Conn and a broker. The embedded node
// and the network client implement it; applications never call it.
type Transport interface {
	// Start is called once by [NewConn] with the function that takes
	// frames from the broker. recv may be called from several goroutines
	// at once; it never blocks for long.
	Start(recv func(f *wire.Frame))
	// Send hands f to the broker and takes ownership of it. It may block
	// for flow control.
	Send(f *wire.Frame) error
	// Close ends the transport; recv is not called afterwards, except
	// by a [WaiterTransport] with frames that have a Waiter.
	Close() error
}

// ContextSender is implemented by transports whose Send can wait (for
// credit, or for a peer to read) and can stop waiting when ctx ends.
type ContextSender interface {
	SendContext(ctx context.Context, f *wire.Frame) error
}

// WaiterTransport is implemented by transports that give a REQUEST's
// [wire.Frame.Waiter] back on every frame they bring for that request,
// even after Close (an in-process broker does). A Conn over one hands its
// requests' frames straight to the waiting call instead of looking the
// call up by Ref.
type WaiterTransport interface {
	KeepsWaiters() bool
}

// FuncDeclarer is implemented by transports that can declare exchanges
// with Go routing functions, which only an embedded node can run.
type FuncDeclarer interface {
	DeclareFuncs(name string, spec ExchangeSpec) (wire.ExchangeInfo, error)
}

// Conn is a connection to a broker. It is safe for concurrent use.
type Conn struct {
	t   Transport
	id  atomic.Pointer[string] // changes when a transport reconnects
	log *slog.Logger

	producer string        // ConnOptions.ProducerID
	pseq     atomic.Uint64 // the last seq given to a confirmed submit

	nextAttach atomic.Uint32

	calls callTable
	atts  sync.Map // attachment id → *Attachment
	// waiters: the transport keeps requests' waiters, so requests are
	// not in calls (see [WaiterTransport]).
	waiters bool

	mu     sync.Mutex // guards err, decls
	err    error
	closed chan struct{}
	// decls are the exchanges this Conn declared, in order, which it
	// declares again when its transport reconnects.
	decls []decl

	// down is set while the transport reconnects (see [Conn.Interrupted]):
	// new calls wait for it to be closed. sess counts the connections
	// lost: requests and jobs of an earlier one are not answered on the
	// next.
	down atomic.Pointer[chan struct{}]
	sess atomic.Uint32
	// attachMu orders attaching with re-attaching: an attach holds it
	// read-locked from its ATTACH to its answer, a resume write-locked.
	attachMu sync.RWMutex

	onError     atomic.Pointer[func(error)]
	onConnEvent atomic.Pointer[func(ConnEvent)]
}

// decl is an exchange declared through the Conn.
type decl struct {
	name string
	spec ExchangeSpec
}

// ConnOptions configure [NewConn].
type ConnOptions struct {
	// ID is the broker's name for this connection, such as "n1/c7": the
	// node's name and the connection's number there (docs/protocol.md
	// §5.3).
	ID string
	// Log receives what the Conn cannot return to a caller, such as a
	// handler that panicked. Default: slog.Default().
	Log *slog.Logger
	// OnConnEvent, if set, is called as [Conn.OnConnEvent] sets it, from
	// the first event on.
	OnConnEvent func(ConnEvent)
	// ProducerID, if set, names the Conn's confirmed submits for
	// deduplication: each carries (ProducerID, seq), seq counting up
	// from a start taken from the clock (or [Task.Seq]), and a queue
	// stores one task per pair within its window (docs/queues.md,
	// "Deduplication"). At most wire.MaxProducerLen bytes of
	// [A-Za-z0-9._:-]. The network client sets it (client.Options);
	// empty: no deduplication.
	ProducerID string
}

// NewConn returns a Conn over t. It is for transport implementations; use
// node.Node.Connect or client.Dial.
func NewConn(t Transport, opts ConnOptions) *Conn {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	c := &Conn{
		t: t, log: opts.Log,
		closed: make(chan struct{}),
	}
	c.id.Store(&opts.ID)
	if opts.ProducerID != "" {
		c.producer = opts.ProducerID
		// From the clock, so that a process that restarts with the same
		// producer id does not reuse the numbers of its previous run:
		// one submit a nanosecond would be needed to catch up.
		c.pseq.Store(uint64(time.Now().UnixNano()))
	}
	if opts.OnConnEvent != nil {
		c.onConnEvent.Store(&opts.OnConnEvent)
	}
	if wt, ok := t.(WaiterTransport); ok {
		c.waiters = wt.KeepsWaiters()
	}
	t.Start(c.receive)
	return c
}

// ProducerID returns the id that names the Conn's confirmed submits for
// deduplication ("" if they carry none): see [ConnOptions.ProducerID].
func (c *Conn) ProducerID() string { return c.producer }

// ID returns the broker's name for this connection, the prefix of its
// attachments' member ids. It changes when a network connection is
// re-established (see [ConnReconnected]).
func (c *Conn) ID() string { return *c.id.Load() }

// OnError sets a function that receives errors no call can return, such as
// a publish to an exchange deleted meanwhile. It replaces the default,
// which logs them.
func (c *Conn) OnError(fn func(error)) { c.onError.Store(&fn) }

// Err returns why the connection closed, or nil while it is open.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Done is closed when the connection closes.
func (c *Conn) Done() <-chan struct{} { return c.closed }

// Close closes the connection. Its attachments leave their exchanges and
// calls in progress fail with [ErrClosed].
func (c *Conn) Close() error {
	c.shutdown(ErrClosed)
	return c.t.Close()
}

// Closed is called by a transport when the connection ended under it.
func (c *Conn) Closed(err error) {
	if err == nil {
		err = ErrClosed
	}
	c.shutdown(err)
}

func (c *Conn) shutdown(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	close(c.closed)
	c.mu.Unlock()
	c.calls.close()
	c.atts.Range(func(id, a any) bool {
		c.atts.Delete(id)
		a.(*Attachment).stop(err)
		return true
	})
}

// attachment returns the attachment id, or nil.
func (c *Conn) attachment(id uint32) *Attachment {
	if a, ok := c.atts.Load(id); ok {
		return a.(*Attachment)
	}
	return nil
}

func (c *Conn) report(err error) {
	if fn := c.onError.Load(); fn != nil {
		(*fn)(err)
		return
	}
	c.log.Warn("courier: asynchronous error", "conn", c.ID(), "err", err)
}

// send hands a frame to the transport, failing fast once closed.
func (c *Conn) send(f *wire.Frame) error {
	if err := c.admit(f); err != nil {
		return err
	}
	return c.t.Send(f)
}

// sendCtx is send for a caller with a context: a transport that must wait
// (flow control) stops waiting when ctx ends.
func (c *Conn) sendCtx(ctx context.Context, f *wire.Frame) error {
	cs, ok := c.t.(ContextSender)
	if !ok || ctx.Done() == nil {
		return c.send(f)
	}
	if err := c.admit(f); err != nil {
		return err
	}
	return cs.SendContext(ctx, f)
}

// admit checks f before it goes out; on an error f is released.
func (c *Conn) admit(f *wire.Frame) error {
	select {
	case <-c.closed:
		f.Release()
		return c.Err()
	default:
	}
	if err := f.Check(); err != nil {
		f.Release()
		return fmt.Errorf("courier: %w", err)
	}
	return nil
}

// receive dispatches a frame from the broker.
func (c *Conn) receive(f *wire.Frame) {
	switch f.Type {
	case wire.TypeResponse, wire.TypeAsk:
		if f.Waiter != nil {
			c.toWaiter(f)
			return
		}
		if !c.toCall(f) {
			f.Release()
		}
	case wire.TypeOK, wire.TypeTaskEvent:
		if !c.toCall(f) {
			f.Release()
		}
	case wire.TypeError:
		if f.Ref != 0 && c.toCall(f) {
			return
		}
		err := &wire.Error{Code: wire.Code(f.Aux), Msg: f.Tag, Fatal: f.Flags&wire.FlagFatal != 0}
		f.Release()
		c.report(err)
	case wire.TypeRequest, wire.TypeMessage, wire.TypeEvent, wire.TypeSubRequest, wire.TypeTask:
		a := c.attachment(f.Attach)
		if a == nil {
			c.orphan(f)
			return
		}
		if !a.in.push(f, f.Type == wire.TypeRequest || f.Type == wire.TypeMessage || f.Type == wire.TypeTask) {
			c.orphan(f) // it stopped meanwhile: a request still gets an answer
		}
	case wire.TypeCancel, wire.TypeAnswer:
		if a := c.attachment(f.Attach); a != nil {
			a.inline(f)
		} else {
			f.Release()
		}
	default:
		f.Release()
	}
}

// orphan handles a frame for an attachment this Conn no longer has.
func (c *Conn) orphan(f *wire.Frame) {
	if f.Type == wire.TypeRequest {
		r := wire.NewFrame(wire.TypeResponse)
		r.Ref, r.Flags, r.Aux, r.Tag = f.Ref, wire.FlagError, uint64(wire.CodeHandlerGone), "the handler detached"
		c.send(r)
	}
	f.Release()
}

// toCall routes a frame to the call waiting on its Ref and reports
// whether one took it; when none did (the call gave up), f is still the
// caller's.
func (c *Conn) toCall(f *wire.Frame) bool {
	sh := c.calls.lock(f.Ref)
	cl := sh.m[f.Ref]
	if cl == nil {
		sh.mu.Unlock()
		return false
	}
	if f.Type == wire.TypeAsk {
		onAsk := cl.onAsk // under the lock: once it is released cl may be recycled
		sh.mu.Unlock()
		go c.answer(onAsk, f)
		return true
	}
	if !more(f) {
		delete(sh.m, f.Ref)
	}
	if fn := cl.fn; fn != nil {
		sh.mu.Unlock()
		fn(f)
		return true
	}
	cl.push(f)
	sh.mu.Unlock()
	return true
}

// toWaiter routes a frame to the call that is its Waiter: a request made
// over a [WaiterTransport], which is not in the call table. The call takes
// it only if it still waits for f.Ref: a frame that comes after its
// requester gave up (a late response, a broadcast's others) is dropped.
func (c *Conn) toWaiter(f *wire.Frame) {
	cl := f.Waiter.(*call)
	f.Waiter = nil
	if f.Type == wire.TypeAsk {
		if c.Err() != nil {
			f.Release() // the requester is gone: nobody asks its OnAsk
			return
		}
		var onAsk AskFunc
		cl.mu.Lock()
		ok := cl.direct.Load() == f.Ref
		if ok { // else cl may be another request's, setting onAsk now
			onAsk = cl.onAsk
		}
		cl.mu.Unlock()
		if !ok {
			f.Release()
			return
		}
		go c.answer(onAsk, f)
		return
	}
	if f.Flags&wire.FlagError != 0 && c.Err() != nil {
		// The connection closed under the request, which the broker
		// reports to each one: the caller gets the Conn's error.
		ref := f.Ref
		f.Release()
		cl.pushDirect(ref, nil)
		return
	}
	cl.pushDirect(f.Ref, f)
}

// more reports whether frames may follow f for the same call: a response
// that is not the last, the OK of a watched submit, or a task event that
// is not the last.
func more(f *wire.Frame) bool {
	switch f.Type {
	case wire.TypeResponse, wire.TypeTaskEvent:
		return f.Flags&wire.FlagLast == 0
	case wire.TypeOK:
		return f.Flags&wire.FlagWatch != 0
	}
	return false
}

const callShards = 8 // power of two

// callTable holds the calls in flight by Ref, sharded so that many
// goroutines of one Conn do not queue on one lock. A call is touched by
// the receiving side only under its shard's lock, and only while it is
// in the table; whoever removes it owns it.
type callTable struct {
	shard [callShards]callShard
}

type callShard struct {
	mu     sync.Mutex // guards m, closed
	m      map[uint64]*call
	closed bool
	_      [40]byte
}

func (t *callTable) lock(ref uint64) *callShard {
	sh := &t.shard[ref&(callShards-1)]
	sh.mu.Lock()
	return sh
}

// close fails every call in flight and refuses new ones.
func (t *callTable) close() {
	for i := range t.shard {
		sh := &t.shard[i]
		sh.mu.Lock()
		sh.closed = true
		var fns []func(*wire.Frame)
		for ref, cl := range sh.m {
			delete(sh.m, ref)
			if cl.fn != nil {
				fns = append(fns, cl.fn)
				continue
			}
			cl.push(nil)
		}
		sh.mu.Unlock()
		for _, fn := range fns {
			fn(nil)
		}
	}
}

// call is one operation waiting for frames with its Ref.
type call struct {
	ref  uint64
	refs refBlock
	// direct is ref while the call is a request that its frames reach
	// as their Waiter (see [WaiterTransport]), and 0 otherwise; it
	// changes under mu, or before the request goes out.
	direct atomic.Uint64

	mu    sync.Mutex // guards q, head, closed
	q     []*wire.Frame
	head  int // q[head:] are waiting
	ready chan struct{}
	onAsk AskFunc
	// fn, if set, takes the call's frames in the receiving goroutine
	// instead of the queue, and nil when the Conn closes; it must not
	// block. The call is not pooled.
	fn func(*wire.Frame)
	// closed: the Conn closed under the call (a nil frame was pushed).
	closed bool
	// resend: the call's frame is a confirmed publish or submit, which a
	// reconnecting transport sends again (see [Conn.Interrupted]).
	resend bool
	// err, when set, is why the call ended without its answer (the
	// connection was lost); else the Conn's error.
	err error
}

var callPool = sync.Pool{New: func() any { return &call{ready: make(chan struct{}, 1)} }}

func (c *Conn) newCall() *call {
	cl := callPool.Get().(*call)
	cl.ref = cl.refs.next()
	return cl
}

// Call refs are unique in the process, not only in their Conn, and are
// handed out from blocks that each call takes in turn (calls are pooled,
// so a thread reuses its own), so that goroutines on different cores do
// not take turns at one counter. A block's refs all end in the same three
// bits, which pick the shard of the call table here and of the broker's
// request tables: the calls a core makes stay in shards of that core's.
//
//	ref = block<<13 | i<<3 | block&7, i in [0, refsPerBlock)
const refsPerBlock = 1 << 10

// refBlock is the block a call takes its refs from; the zero value
// takes a new block on first use.
type refBlock struct{ block, i uint64 }

var (
	refBlocks    atomic.Uint64 // the last block taken
	refBlockPool = sync.Pool{New: func() any { return new(refBlock) }}
)

// newRef returns a ref for a call that is not pooled.
func newRef() uint64 {
	b := refBlockPool.Get().(*refBlock)
	ref := b.next()
	refBlockPool.Put(b)
	return ref
}

func (b *refBlock) next() uint64 {
	if b.block == 0 || b.i == refsPerBlock {
		b.block, b.i = refBlocks.Add(1), 0
	}
	ref := b.block<<13 | b.i<<3 | b.block&7
	b.i++
	return ref
}

// pushDirect is push for a frame that found cl as its Waiter: it takes
// the frame only if cl still waits for request ref.
func (cl *call) pushDirect(ref uint64, f *wire.Frame) {
	cl.mu.Lock()
	if cl.direct.Load() != ref {
		cl.mu.Unlock()
		if f != nil {
			f.Release()
		}
		return
	}
	cl.queue(f)
}

// push queues f for the call; nil tells it the Conn closed.
func (cl *call) push(f *wire.Frame) {
	cl.mu.Lock()
	cl.queue(f)
}

// queue is push with cl.mu held; it releases it.
func (cl *call) queue(f *wire.Frame) {
	if f == nil {
		cl.closed = true
	} else {
		cl.q = append(cl.q, f)
	}
	cl.mu.Unlock()
	select {
	case cl.ready <- struct{}{}:
	default:
	}
}

// register adds cl to the calls in flight; it fails once the Conn closed.
func (c *Conn) register(cl *call, f *wire.Frame) error {
	cl.resend = (f.Type == wire.TypePublish || f.Type == wire.TypeSubmit) && f.Flags&wire.FlagReply != 0
	sh := c.calls.lock(cl.ref)
	if sh.closed {
		sh.mu.Unlock()
		return c.Err()
	}
	if sh.m == nil {
		sh.m = make(map[uint64]*call)
	}
	sh.m[cl.ref] = cl
	sh.mu.Unlock()
	return nil
}

// unregister removes cl; it reports whether cl was still registered.
func (c *Conn) unregister(cl *call) bool {
	sh := c.calls.lock(cl.ref)
	defer sh.mu.Unlock()
	if sh.m[cl.ref] == cl {
		delete(sh.m, cl.ref)
		return true
	}
	return false
}

// next waits for the call's next frame. It returns nil and an error when
// ctx ends or the Conn closes.
func (c *Conn) next(ctx context.Context, cl *call) (*wire.Frame, error) {
	for {
		cl.mu.Lock()
		if cl.head < len(cl.q) {
			f := cl.q[cl.head]
			cl.q[cl.head] = nil
			cl.head++
			if cl.head == len(cl.q) {
				cl.q, cl.head = cl.q[:0], 0
			}
			cl.mu.Unlock()
			return f, nil
		}
		closed, err := cl.closed, cl.err
		cl.mu.Unlock()
		if closed {
			if err != nil {
				return nil, err
			}
			return nil, c.Err()
		}
		done := ctx.Done()
		if done == nil {
			<-cl.ready
			continue
		}
		select {
		case <-cl.ready:
		case <-done:
			return nil, ctx.Err()
		}
	}
}

// release returns a finished call to the pool. The call must no longer
// be registered.
func (cl *call) release() {
	cl.mu.Lock() // a direct call's late frames may be arriving
	cl.direct.Store(0)
	for _, f := range cl.q[cl.head:] {
		f.Release()
	}
	clear(cl.q)
	cl.q, cl.head = cl.q[:0], 0
	cl.closed = false
	cl.resend = false
	cl.err = nil
	cl.onAsk = nil
	cl.mu.Unlock()
	select {
	case <-cl.ready:
	default:
	}
	callPool.Put(cl)
}

// call sends f as a new call, registered under f.Ref, whose frames the
// caller reads with next. On an error f and the call are released.
func (c *Conn) call(ctx context.Context, f *wire.Frame) (*call, error) {
	if f.Type != wire.TypePublish && f.Type != wire.TypeSubmit {
		// Confirmed publishes and submits are held by the transport
		// while it reconnects; the rest waits for the connection.
		if err := c.waitUp(ctx); err != nil {
			f.Release()
			return nil, err
		}
	}
	return c.callNow(ctx, f)
}

// callNow is call without waiting for a lost connection: a frame sent
// while there is none fails with [ErrConnectionLost].
func (c *Conn) callNow(ctx context.Context, f *wire.Frame) (*call, error) {
	cl := c.newCall()
	f.Ref = cl.ref
	if err := c.register(cl, f); err != nil {
		f.Release()
		cl.release()
		return nil, err
	}
	if err := c.sendCtx(ctx, f); err != nil {
		c.unregister(cl)
		cl.release()
		return nil, err
	}
	return cl, nil
}

// roundTrip sends a control frame and waits for its OK or ERROR.
func (c *Conn) roundTrip(ctx context.Context, f *wire.Frame, out any) error {
	cl, err := c.call(ctx, f)
	if err != nil {
		return err
	}
	return c.await(ctx, cl, out)
}

// roundTripNow is roundTrip with callNow.
func (c *Conn) roundTripNow(ctx context.Context, f *wire.Frame, out any) error {
	t := f.Type
	cl, err := c.callNow(ctx, f)
	if err != nil {
		return err
	}
	if err := c.await(ctx, cl, out); err != nil {
		return fmt.Errorf("courier: %s: %w", t, err)
	}
	return nil
}

// declare declares or opens an exchange.
func (c *Conn) declare(ctx context.Context, name string, spec ExchangeSpec) (wire.ExchangeInfo, error) {
	if spec.KeyFunc != nil || spec.RouteFunc != nil {
		fd, ok := c.t.(FuncDeclarer)
		if !ok {
			return wire.ExchangeInfo{}, fmt.Errorf("%w: Go routing functions need an embedded node; over the network use KeyExpr or RouteExpr", ErrBadOptions)
		}
		return fd.DeclareFuncs(name, spec)
	}
	var info wire.ExchangeInfo
	err := c.roundTrip(ctx, declareFrame(name, spec), &info)
	if err == nil {
		c.record(name, spec)
	}
	return info, err
}

// declareFrame is the DECLARE of spec.
func declareFrame(name string, spec ExchangeSpec) *wire.Frame {
	f := wire.NewFrame(wire.TypeDeclare)
	f.Name = name
	f.Body, _ = json.Marshal(spec.ExchangeConfig)
	if spec.Passive {
		f.Aux = 1
	}
	return f
}

// Declare creates an exchange, or checks that the existing one matches.
// Most code uses [Conn.ReqResp] or [Conn.PubSub] instead.
func (c *Conn) Declare(ctx context.Context, name string, spec ExchangeSpec) (ExchangeInfo, error) {
	return c.declare(ctx, name, spec)
}

// Exchanges lists the broker's exchanges.
func (c *Conn) Exchanges(ctx context.Context) ([]ExchangeInfo, error) {
	var list []ExchangeInfo
	err := c.roundTrip(ctx, wire.NewFrame(wire.TypeList), &list)
	return list, err
}

// DeleteExchange deletes an exchange; its attachments are detached.
func (c *Conn) DeleteExchange(ctx context.Context, name string) error {
	f := wire.NewFrame(wire.TypeDelete)
	f.Name = name
	err := c.roundTrip(ctx, f, nil)
	if err == nil {
		c.forget(name)
	}
	return err
}

// ExchangeInfo describes an exchange.
type ExchangeInfo = wire.ExchangeInfo

// Errors, matched with errors.Is against any error of the same code.
var (
	ErrClosed       = errors.New("courier: connection closed")
	ErrNotFound     = &wire.Error{Code: wire.CodeNotFound}
	ErrClash        = &wire.Error{Code: wire.CodeClash}
	ErrBadOptions   = &wire.Error{Code: wire.CodeBadOptions}
	ErrNoHandler    = &wire.Error{Code: wire.CodeNoHandler}
	ErrTimeout      = &wire.Error{Code: wire.CodeTimeout}
	ErrCancelled    = &wire.Error{Code: wire.CodeCancelled}
	ErrRejected     = &wire.Error{Code: wire.CodeRejected}
	ErrHandlerGone  = &wire.Error{Code: wire.CodeHandlerGone}
	ErrNotAllowed   = &wire.Error{Code: wire.CodeNotAllowed}
	ErrApplication  = &wire.Error{Code: wire.CodeApplication}
	ErrLimit        = &wire.Error{Code: wire.CodeLimit}
	ErrUnauthorized = &wire.Error{Code: wire.CodeUnauthorized}
	// ErrConnectionLost is in reconnect.go.
)

// ErrFuncsNotReplicable is the error of declaring an exchange with Go
// functions ([WithRouteFunc], [WithKeyFunc]) on a node that is part of a
// cluster: a function lives in one process and cannot be replicated to
// the other nodes, which must route the exchange's requests too.
// Declare it with [RouteExpr] or [KeyExpr] instead, which every node
// compiles from the replicated definition. A single node accepts Go
// functions as before. docs/cluster.md, "Names and ids", has the
// decision.
var ErrFuncsNotReplicable = errors.New("courier: an exchange with Go functions (WithRouteFunc, WithKeyFunc) cannot be declared in a cluster: " +
	"a function cannot be replicated to the other nodes; use an expression instead (RouteExpr, KeyExpr)")
