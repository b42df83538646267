package courier

import (
	"context"

	"github.com/courier-mq/courier/wire"
)

// Strategy is how a request-response exchange picks handlers. It is fixed
// when the exchange is created. A Strategy is also an [ExchangeOption].
type Strategy string

// Request-response strategies.
const (
	// Broadcast sends every request to every handler; the requester gets
	// every response. It is the default.
	Broadcast Strategy = "broadcast"
	// RoundRobin gives requests to handlers in turn.
	RoundRobin Strategy = "round-robin"
	// Leader gives every request to the group's leader.
	Leader Strategy = "leader"
	// LeaderRoundRobin appoints a leader but shares requests among all.
	LeaderRoundRobin Strategy = "leader-round-robin"
	// Sticky hashes the request's Key onto a consistent-hash ring of
	// handlers: one key, one handler, and a handler that leaves moves only
	// its own keys.
	Sticky Strategy = "sticky"
	// StickyFun is Sticky with the key computed by a function ([KeyFunc]
	// embedded, [KeyExpr] over the network).
	StickyFun Strategy = "sticky-fun"
	// Fun routes by a function that may pick, redirect, reject or rewrite
	// ([RouteFunc] embedded, [RouteExpr] over the network).
	Fun Strategy = "fun"
	// LeastBusy picks the handler with the fewest requests in flight.
	LeastBusy Strategy = "least-busy"
)

// ExchangeOption configures an exchange at declaration.
type ExchangeOption interface{ applyExchange(*ExchangeSpec) }

func (s Strategy) applyExchange(e *ExchangeSpec) { e.Strategy = string(s) }

type exchangeOptionFunc func(*ExchangeSpec)

func (f exchangeOptionFunc) applyExchange(e *ExchangeSpec) { f(e) }

// KeyExpr sets the sticky-key expression of a [StickyFun] exchange. The
// expression, in CEL (https://cel.dev; docs/protocol.md §5.1 lists what
// it may use and its limits), sees key, headers, size, tag and members,
// and yields a string, e.g. `headers["user"]`.
func KeyExpr(src string) ExchangeOption {
	return exchangeOptionFunc(func(e *ExchangeSpec) { e.Strategy, e.KeyExpr = string(StickyFun), src })
}

// RouteExpr sets the routing expression of a [Fun] exchange, in CEL
// (https://cel.dev; docs/protocol.md §5.1). It sees key, headers, size,
// tag and members, and yields null (any handler), a member id, or a map
// with "member", "tag", "redirect", "reject", "key" or "headers", e.g.
// `size > 1000 ? {"reject": "too big"} : {"tag": "eu"}`.
func RouteExpr(src string) ExchangeOption {
	return exchangeOptionFunc(func(e *ExchangeSpec) { e.Strategy, e.RouteExpr = string(Fun), src })
}

// WithKeyFunc sets the Go sticky-key function of a [StickyFun] exchange;
// embedded nodes only.
func WithKeyFunc(fn KeyFunc) ExchangeOption {
	return exchangeOptionFunc(func(e *ExchangeSpec) { e.Strategy, e.KeyFunc = string(StickyFun), fn })
}

// WithRouteFunc sets the Go routing function of a [Fun] exchange;
// embedded nodes only.
func WithRouteFunc(fn RouteFunc) ExchangeOption {
	return exchangeOptionFunc(func(e *ExchangeSpec) { e.Strategy, e.RouteFunc = string(Fun), fn })
}

// Controlled makes a pub-sub exchange inverted: its controller decides on
// every subscription and can subscribe others.
func Controlled() ExchangeOption {
	return exchangeOptionFunc(func(e *ExchangeSpec) { e.Controlled = true })
}

// Passive opens an existing exchange and fails with [ErrNotFound] rather
// than create it.
func Passive() ExchangeOption {
	return exchangeOptionFunc(func(e *ExchangeSpec) { e.Passive = true })
}

func specOf(pattern string, opts []ExchangeOption) ExchangeSpec {
	spec := ExchangeSpec{}
	spec.Pattern = pattern
	for _, o := range opts {
		o.applyExchange(&spec)
	}
	return spec
}

// ReqResp declares a request-response exchange, or opens the existing one
// (options given must match it; options left out match anything).
func (c *Conn) ReqResp(ctx context.Context, name string, opts ...ExchangeOption) (*ReqResp, error) {
	info, err := c.declare(ctx, name, specOf(wire.PatternReqResp, opts))
	if err != nil {
		return nil, err
	}
	return &ReqResp{c: c, name: name, info: info}, nil
}

// PubSub declares a publish-subscribe exchange, or opens the existing one.
func (c *Conn) PubSub(ctx context.Context, name string, opts ...ExchangeOption) (*PubSub, error) {
	info, err := c.declare(ctx, name, specOf(wire.PatternPubSub, opts))
	if err != nil {
		return nil, err
	}
	return &PubSub{c: c, name: name, info: info}, nil
}

// ReqResp is a request-response exchange as seen through one Conn.
type ReqResp struct {
	c    *Conn
	name string
	info ExchangeInfo
}

// Name returns the exchange's name.
func (e *ReqResp) Name() string { return e.name }

// Strategy returns the exchange's strategy.
func (e *ReqResp) Strategy() Strategy { return Strategy(e.info.Strategy) }

// Handle attaches fn as a handler. fn is called from one goroutine of its
// own, one request at a time; it may respond later from any goroutine.
func (e *ReqResp) Handle(ctx context.Context, fn HandlerFunc, opts ...AttachOption) (*Attachment, error) {
	return e.c.attach(ctx, e.name, wire.RoleHandler, attachConfig(opts), fn, nil, nil, nil)
}

// PubSub is a publish-subscribe exchange as seen through one Conn.
type PubSub struct {
	c    *Conn
	name string
	info ExchangeInfo
}

// Name returns the exchange's name.
func (e *PubSub) Name() string { return e.name }

// Publish sends body with a routing key to every matching subscriber. It
// returns once the message is on its way; errors that come later go to
// the function set with [Conn.OnError].
func (e *PubSub) Publish(ctx context.Context, key string, body []byte) error {
	f := wire.NewFrame(wire.TypePublish)
	f.Name, f.Key, f.Body = e.name, key, body
	return e.c.sendCtx(ctx, f)
}

// PublishMsg publishes m, with its headers, under m.Key.
func (e *PubSub) PublishMsg(ctx context.Context, m Message) error {
	f := wire.NewFrame(wire.TypePublish)
	f.Name, f.Key, f.Header, f.Body = e.name, m.Key, m.Header, m.Body
	return e.c.sendCtx(ctx, f)
}

// PublishSync publishes m and waits for the broker's confirm: the message
// was routed to every matching subscriber and is durable (written and
// fsynced, as a confirmed task is; see [Tasks.Submit]) in every durable
// subscription's queue it was routed to, so that it survives a crash of
// the broker there. Errors come back here; a [wire.Error] with code
// [wire.CodeStorage] (30) means the message may or may not have been
// stored. Subscribers that are not durable may receive it before the
// confirm. [PubSub.PublishAsync] pipelines confirms, which is much faster
// than calling PublishSync in turn.
func (e *PubSub) PublishSync(ctx context.Context, m Message) error {
	return e.c.roundTrip(ctx, e.confirmedFrame(&m), nil)
}

// PublishAsync publishes m without waiting for its confirm: done is
// called once the broker confirms it (as [PubSub.PublishSync] returns),
// or with the error that failed it, from a goroutine of the Conn's, and
// must not block. PublishAsync itself waits only for flow control; it
// returns an error, and done is not called, when m could not be sent.
func (e *PubSub) PublishAsync(ctx context.Context, m Message, done func(error)) error {
	f := e.confirmedFrame(&m)
	cl := &call{ref: newRef()}
	cl.fn = func(r *wire.Frame) {
		switch {
		case r == nil:
			done(e.c.failure(cl))
		case r.Type == wire.TypeError:
			done(&wire.Error{Code: wire.Code(r.Aux), Msg: r.Tag})
			r.Release()
		default:
			done(nil)
			r.Release()
		}
	}
	f.Ref = cl.ref
	if err := e.c.register(cl, f); err != nil {
		f.Release()
		return err
	}
	if err := e.c.sendCtx(ctx, f); err != nil {
		e.c.unregister(cl)
		return err
	}
	return nil
}

// confirmedFrame is the PUBLISH of m that asks for a confirm.
func (e *PubSub) confirmedFrame(m *Message) *wire.Frame {
	f := wire.NewFrame(wire.TypePublish)
	f.Name, f.Key, f.Header, f.Body, f.Flags = e.name, m.Key, m.Header, m.Body, wire.FlagReply
	return f
}

// Subscribe attaches fn as a subscriber to pattern and any further
// patterns given with [Patterns]. '*' matches one dot-separated word, '#'
// any number. fn is called from one goroutine, in publish order per
// publisher. On a controlled exchange the controller decides first.
func (e *PubSub) Subscribe(ctx context.Context, pattern string, fn MessageFunc, opts ...AttachOption) (*Attachment, error) {
	cfg := attachConfig(opts)
	if pattern != "" {
		cfg.spec.Patterns = append([]string{pattern}, cfg.spec.Patterns...)
	}
	return e.c.attach(ctx, e.name, wire.RoleSubscriber, cfg, nil, fn, nil, nil)
}

// Control attaches fn as a controller of a controlled exchange. The
// leader among controllers decides on each subscription.
func (e *PubSub) Control(ctx context.Context, fn ControlFunc, opts ...AttachOption) (*Attachment, error) {
	return e.c.attach(ctx, e.name, wire.RoleController, attachConfig(opts), nil, nil, fn, nil)
}

// Message is what requests and publications carry.
type Message struct {
	// Key is the routing key of a publication, or the sticky key of a
	// request.
	Key string
	// Header holds optional headers, such as "traceparent".
	Header map[string]string
	// Body is the payload. The broker does not copy it in-process:
	// do not modify it after sending.
	Body []byte
	// ServiceTag, on a request, sends it only to handlers of that tag.
	ServiceTag string
}

// Delivery is a message delivered to a subscriber.
type Delivery struct {
	Message
	// Exchange and ConnTag tell which attachment it came through.
	Exchange string
	ConnTag  string
}

// MessageFunc receives deliveries. The *Delivery is reused after fn
// returns; Body and Header may be kept.
type MessageFunc func(d *Delivery)
