package amqp

import (
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/courier-mq/courier/wire"
)

// RPC. A publication on the default exchange whose routing key names a
// Courier request-response exchange, with reply_to, is a Courier
// REQUEST; each RESPONSE comes back as a message to reply_to with the
// request's correlation_id: to a queue of that name (a SUBMIT), or, for
// direct reply-to, straight to the consumer of amq.rabbitmq.reply-to.
//
// Direct reply-to is RabbitMQ's: a channel consumes the pseudo-queue
// amq.rabbitmq.reply-to with no-ack; its publications with that reply_to
// carry amq.rabbitmq.reply-to.<token> instead, and a publication on the
// default exchange with that routing key, from any connection, is
// delivered to the consumer at once, never queued.

// replyTo is the pseudo-queue of direct reply-to.
const replyTo = "amq.rabbitmq.reply-to"

// defaultRequestMS is the timeout of a request without an expiration.
const defaultRequestMS = 30000

// refRPC marks the Ref of a REQUEST (RESPONSE frames are told apart by
// type, so it only keeps counters readable).
const refRPC = 1 << 62

// replyConsumer is a channel's consumer of amq.rabbitmq.reply-to.
type replyConsumer struct {
	c     *conn
	ch    *channel
	tag   string
	token string
}

// replies maps direct reply-to tokens to their consumers.
type replies struct {
	mu sync.Mutex // guards m
	m  map[string]*replyConsumer
}

func (r *replies) add(rc *replyConsumer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[string]*replyConsumer)
	}
	r.m[rc.token] = rc
}

func (r *replies) get(token string) *replyConsumer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[token]
}

func (r *replies) remove(token string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, token)
}

// pendingRPC is a REQUEST waiting for its responses.
type pendingRPC struct {
	replyTo, correlationID string
}

// consumeReplyTo makes ch's consumer of amq.rabbitmq.reply-to.
func (c *conn) consumeReplyTo(ch *channel, m *BasicConsume) error {
	if !m.NoAck {
		return c.closeChannel(ch, methodError(PreconditionFailed, m, "PRECONDITION_FAILED - reply consumer cannot acknowledge"))
	}
	if ch.reply != nil {
		return c.closeChannel(ch, methodError(PreconditionFailed, m, "PRECONDITION_FAILED - reply consumer already set"))
	}
	tag := m.ConsumerTag
	if tag == "" {
		tag = randomName("amq.ctag-")
	}
	rc := &replyConsumer{c: c, ch: ch, tag: tag, token: randomName("")}
	ch.reply = rc
	c.s.replies.add(rc)
	if m.NoWait {
		return nil
	}
	return c.send(ch.id, &BasicConsumeOK{ConsumerTag: tag})
}

// cancelReplyTo ends ch's consumer of amq.rabbitmq.reply-to.
func (c *conn) cancelReplyTo(ch *channel) {
	if ch.reply != nil {
		c.s.replies.remove(ch.reply.token)
		ch.reply = nil
	}
}

// rewriteReplyTo gives a publication with reply_to amq.rabbitmq.reply-to
// the channel's token; false when the channel does not consume it.
func (c *conn) rewriteReplyTo(ch *channel, p *pending) bool {
	if p.props.ReplyTo != replyTo {
		return true
	}
	if ch.reply == nil {
		return false
	}
	p.props.ReplyTo = replyTo + "." + ch.reply.token
	return true
}

// directReply delivers a publication on the default exchange to
// amq.rabbitmq.reply-to.<token>; one for a consumer gone is dropped, as
// RabbitMQ drops it.
func (s *Server) directReply(key string, props *Properties, body []byte) bool {
	rc := s.replies.get(strings.TrimPrefix(key, replyTo+"."))
	if rc == nil {
		return false
	}
	tag := rc.ch.tags.add(held{}, false)
	d := &BasicDeliver{ConsumerTag: rc.tag, DeliveryTag: tag, RoutingKey: key}
	rc.c.sendContent(rc.ch.id, d, props, body, nil)
	return true
}

// isRequestExchange reports whether name is a Courier request-response
// exchange.
func (c *conn) isRequestExchange(name string) bool {
	ex := c.s.cfg.Broker.Exchange(name)
	return ex != nil && ex.Config().Pattern == wire.PatternReqResp
}

// request sends a publication as a Courier REQUEST to the exchange its
// key names; the expiration property, if any, is its timeout.
func (c *conn) request(ch *channel, p *pending) {
	ms := uint64(defaultRequestMS)
	if n, err := strconv.ParseUint(p.props.Expiration, 10, 63); err == nil && n > 0 {
		ms = n
	}
	g := c.gw
	g.mu.Lock()
	g.nextRef++
	ref := refRPC | g.nextRef
	if g.rpcs == nil {
		g.rpcs = make(map[uint64]pendingRPC)
	}
	g.rpcs[ref] = pendingRPC{replyTo: p.props.ReplyTo, correlationID: p.props.CorrelationID}
	g.mu.Unlock()
	f := wire.NewFrame(wire.TypeRequest)
	f.Ref, f.Aux, f.Name, f.Body = ref, ms, p.key, p.body
	f.Header = propsToHeaders(&p.props)
	g.sess.Handle(f)
	c.confirmNow(ch)
}

// response sends a RESPONSE to its request's reply_to; the broker ends
// every request with a RESPONSE marked last (a refusal and a timeout
// too), which forgets it. A chunk of a
// stream is one reply each; an error is a reply with the headers
// x-courier-error (its text) and x-courier-error-code.
func (c *conn) response(f *wire.Frame) {
	g := c.gw
	g.mu.Lock()
	r, ok := g.rpcs[f.Ref]
	if f.Flags&wire.FlagLast != 0 {
		delete(g.rpcs, f.Ref)
	}
	g.mu.Unlock()
	if !ok || (f.Flags&wire.FlagEnd != 0 && len(f.Body) == 0) {
		return
	}
	props := headersToProps(f.Header)
	props.CorrelationID = r.correlationID
	body := f.Body
	if f.Flags&wire.FlagError != 0 {
		if props.Headers == nil {
			props.Headers = Table{}
		}
		props.Headers["x-courier-error"] = f.Tag
		props.Headers["x-courier-error-code"] = int32(f.Aux)
		body = []byte(f.Tag)
	}
	if strings.HasPrefix(r.replyTo, replyTo+".") {
		c.s.directReply(r.replyTo, props, body)
		return
	}
	s := wire.NewFrame(wire.TypeSubmit)
	s.Name, s.Body, s.Header = r.replyTo, body, propsToHeaders(props)
	s.Ref = refDefault // to a queue that does not exist: dropped
	g.sess.Handle(s)
}

// requestError is the error of a request the channel cannot send.
func requestError(text string) *Error {
	return &Error{Code: PreconditionFailed, ClassID: ClassBasic, MethodID: 40, Text: fmt.Sprintf("PRECONDITION_FAILED - %s", text)}
}
