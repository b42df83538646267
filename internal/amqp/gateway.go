package amqp

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/wire"
)

// The gateway: each AMQP connection is one broker session, and AMQP
// methods become the Courier frames the session handles (DECLARE, DELETE,
// PUBLISH). An AMQP exchange is a Courier pub-sub exchange; docs/amqp.md
// has the whole mapping.

// Refs of the frames a connection hands its session. A synchronous call
// (declare, delete) has bit 63 set and a counter; a publication has its
// channel in bits 48-63 and, in confirm mode, its delivery tag below.
const (
	refCall    = 1 << 63
	refChanBit = 48
	callWait   = 30 * time.Second
)

// sink receives the session's frames for a connection.
type sink struct{ c *conn }

// Deliver implements broker.Sink; it may be called from any goroutine.
func (k sink) Deliver(f *wire.Frame) { k.c.deliver(f) }

// gateway is a connection's broker side.
type gateway struct {
	sess *broker.Session

	mu      sync.Mutex // guards calls, nextRef, chanErrs, consumers
	calls   map[uint64]chan *wire.Frame
	nextRef uint64
	// consumers are the connection's consumers by attachment id.
	consumers map[uint32]*consumer
	// rpcs are the REQUESTs waiting for responses, by Ref (rpc.go).
	rpcs map[uint64]pendingRPC
	// chanErrs are errors of publications without confirms (or refused
	// outright), by channel, for the read loop to close those channels.
	chanErrs map[uint16]*Error
}

// openSession opens the connection's broker session.
func (c *conn) openSession() {
	b := c.s.cfg.Broker
	if b == nil {
		return
	}
	g := &gateway{calls: make(map[uint64]chan *wire.Frame), chanErrs: make(map[uint16]*Error), consumers: make(map[uint32]*consumer)}
	name := "amqp " + c.peer
	if p, ok := c.clientProps["product"].(string); ok && p != "" {
		name = "amqp " + p
	}
	if c.s.cfg.Users != nil {
		g.sess = b.OpenAs(sink{c}, name, c.user, c.s.cfg.Users)
	} else {
		g.sess = b.Open(sink{c}, name)
	}
	c.gw = g
}

// closeSession closes the broker session, if any, once.
func (c *conn) closeSession() {
	if c.gw != nil && !c.sessionClosed {
		c.sessionClosed = true
		for _, ch := range c.channels {
			c.cancelReplyTo(ch)
			for _, cs := range ch.consumers {
				c.flushNoAck(cs)
			}
		}
		c.gw.sess.Close()
		for _, ch := range c.channels {
			for _, cs := range ch.consumers {
				c.s.consumers.remove(cs)
				c.consumerReleased(cs.queue)
			}
		}
		c.deleteOwned()
	}
}

// deliver takes a frame from the session.
func (c *conn) deliver(f *wire.Frame) {
	defer f.Release()
	g := c.gw
	switch f.Type {
	case wire.TypeOK, wire.TypeError:
	case wire.TypeTask:
		c.deliverTask(f)
		return
	case wire.TypeResponse:
		c.response(f)
		return
	case wire.TypeEvent:
		if f.Aux == wire.EventDetached {
			c.consumerGone(f.Attach, f.Tag)
		}
		return // the other events of the workers' group: nothing AMQP shows
	default:
		return
	}
	if f.Ref&refCall != 0 {
		g.mu.Lock()
		ch := g.calls[f.Ref]
		delete(g.calls, f.Ref)
		g.mu.Unlock()
		if ch != nil {
			ch <- f.Clone()
		}
		return
	}
	channel, tag := uint16(f.Ref>>refChanBit), f.Ref&(refDefault-1)
	if f.Type == wire.TypeOK {
		if tag != 0 {
			c.send(channel, &BasicAck{DeliveryTag: tag})
		}
		return
	}
	e := fromWire(wire.Code(f.Aux), f.Tag)
	switch {
	case f.Ref == 0:
		// A settle the broker refused (a task redelivered elsewhere).
		c.s.log.Debug("amqp settle refused", "peer", c.peer, "err", f.Tag)
		return
	case f.Ref&refDefault != 0 && e.Code == NotFound:
		// The default exchange to a queue that does not exist: dropped,
		// and confirmed, as RabbitMQ does without mandatory.
		if tag != 0 {
			c.send(channel, &BasicAck{DeliveryTag: tag})
		}
		return
	case !e.Hard() && e.Code != NotFound && e.Code != AccessRefused:
		// A publication the broker could not take (a full queue): a nack
		// under confirms, as RabbitMQ sends; dropped without.
		if tag != 0 {
			c.send(channel, &BasicNack{DeliveryTag: tag})
		}
		return
	}
	g.mu.Lock()
	if g.chanErrs[channel] == nil {
		e.ClassID, e.MethodID = ClassBasic, 40
		g.chanErrs[channel] = e
	}
	g.mu.Unlock()
}

// call hands f to the session and waits for its OK or ERROR.
func (g *gateway) call(f *wire.Frame) (*wire.Frame, error) {
	g.mu.Lock()
	g.nextRef++
	ref := refCall | g.nextRef
	ch := make(chan *wire.Frame, 1)
	g.calls[ref] = ch
	g.mu.Unlock()
	f.Ref = ref
	g.sess.Handle(f)
	t := time.NewTimer(callWait)
	defer t.Stop()
	select {
	case r := <-ch:
		return r, nil
	case <-t.C:
		g.mu.Lock()
		delete(g.calls, ref)
		g.mu.Unlock()
		return nil, Errorf(InternalError, "the broker did not answer within %s", callWait)
	}
}

// takeChanErrs returns and forgets the channel errors recorded.
func (g *gateway) takeChanErrs() map[uint16]*Error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.chanErrs) == 0 {
		return nil
	}
	errs := g.chanErrs
	g.chanErrs = make(map[uint16]*Error)
	return errs
}

// fromWire maps a Courier error code onto the AMQP reply code a RabbitMQ
// client expects.
func fromWire(code wire.Code, msg string) *Error {
	var c uint16
	switch code {
	case wire.CodeNotFound, wire.CodeExchangeDeleted:
		c = NotFound
	case wire.CodeUnauthorized:
		c = AccessRefused
	case wire.CodeClash, wire.CodeBadOptions, wire.CodeNotAllowed, wire.CodeQueueFull:
		c = PreconditionFailed
	case wire.CodeLimit, wire.CodeTooManyAttachments, wire.CodeTooManyInflight, wire.CodeTooManyPatterns:
		c = ResourceError
	case wire.CodeShutdown:
		c = ConnectionForced
	case wire.CodeFrameTooLarge:
		c = ContentTooLarge
	default:
		c = InternalError
	}
	return &Error{Code: c, Text: msg}
}

// exchangeTypes are the AMQP exchange types accepted.
var exchangeTypes = map[string]bool{"direct": true, "fanout": true, "topic": true, "headers": true}

// reservedExchange refuses, as RabbitMQ does, a change to the default
// exchange or to a name under amq.
func reservedExchange(m Method, name string) *Error {
	switch {
	case name == "":
		return methodError(AccessRefused, m, "ACCESS_REFUSED - operation not permitted on the default exchange")
	case len(name) >= 4 && name[:4] == "amq.":
		return methodError(AccessRefused, m, fmt.Sprintf("ACCESS_REFUSED - exchange name '%s' contains reserved prefix 'amq.*'", name))
	}
	return nil
}

// exchangeDeclare maps exchange.declare onto a DECLARE of a pub-sub
// exchange; durable is Courier's default, a non-durable exchange is
// transient.
func (c *conn) exchangeDeclare(ch *channel, m *ExchangeDeclare) error {
	if !m.Passive {
		if e := reservedExchange(m, m.Exchange); e != nil {
			return c.closeChannel(ch, e)
		}
		if !exchangeTypes[m.Type] {
			return methodError(CommandInvalid, m, fmt.Sprintf("COMMAND_INVALID - unknown exchange type '%s'", m.Type))
		}
		switch {
		case m.Internal:
			return methodError(NotImplemented, m, "internal exchanges are not supported by Courier's AMQP gateway")
		case len(m.Arguments) > 0:
			return methodError(NotImplemented, m, fmt.Sprintf("exchange arguments are not supported by Courier's AMQP gateway (got %d)", len(m.Arguments)))
		}
	}
	f := wire.NewFrame(wire.TypeDeclare)
	f.Name = m.Exchange
	if m.Passive {
		f.Aux = 1
	} else {
		f.Body, _ = json.Marshal(wire.ExchangeConfig{Pattern: wire.PatternPubSub, Transient: !m.Durable, AMQPType: m.Type})
	}
	r, err := c.gw.call(f)
	if err != nil {
		return err
	}
	defer r.Release()
	if r.Type == wire.TypeError {
		e := fromWire(wire.Code(r.Aux), r.Tag)
		switch {
		case e.Code == NotFound:
			e.Text = fmt.Sprintf("NOT_FOUND - no exchange '%s' in vhost '/'", m.Exchange)
		case strings.Contains(r.Tag, "amqp_type"):
			e.Text = fmt.Sprintf("PRECONDITION_FAILED - inequivalent arg 'type' for exchange '%s' in vhost '/': received '%s' but current is '%s'", m.Exchange, m.Type, c.exchangeKind(m.Exchange, ""))
		}
		e.ClassID, e.MethodID = m.ClassMethod()
		return c.channelError(ch, e)
	}
	if !m.Passive {
		c.s.kinds.set(m.Exchange, m.Type)
		c.s.autoDelX.set(m.Exchange, m.AutoDelete)
	}
	if m.NoWait {
		return nil
	}
	return c.send(ch.id, &ExchangeDeclareOK{})
}

// exchangeDelete maps exchange.delete onto a DELETE; deleting an
// exchange that does not exist succeeds, as in RabbitMQ.
func (c *conn) exchangeDelete(ch *channel, m *ExchangeDelete) error {
	if e := reservedExchange(m, m.Exchange); e != nil {
		return c.closeChannel(ch, e)
	}
	if m.IfUnused {
		return methodError(NotImplemented, m, "exchange.delete if-unused is not supported by Courier's AMQP gateway")
	}
	if done, err := c.deleteInBroker(ch, m, m.Exchange, 0); !done {
		return err
	}
	c.s.autoDelX.set(m.Exchange, false)
	if m.NoWait {
		return nil
	}
	return c.send(ch.id, &ExchangeDeleteOK{})
}

// deleteInBroker deletes the Courier exchange name for m (aux 1: with
// its queue); one that does not exist is no error, as in RabbitMQ.
// done is false when the broker refused: err is then the channel's or
// the connection's error, already sent.
func (c *conn) deleteInBroker(ch *channel, m Method, name string, aux uint64) (done bool, err error) {
	f := wire.NewFrame(wire.TypeDelete)
	f.Name, f.Aux = name, aux
	r, err := c.gw.call(f)
	if err != nil {
		return false, err
	}
	defer r.Release()
	if r.Type == wire.TypeError && wire.Code(r.Aux) != wire.CodeNotFound {
		e := fromWire(wire.Code(r.Aux), r.Tag)
		e.ClassID, e.MethodID = m.ClassMethod()
		return false, c.channelError(ch, e)
	}
	return true, nil
}

// channelError closes ch for a soft error, or the connection for a hard
// one.
func (c *conn) channelError(ch *channel, e *Error) error {
	if e.Hard() {
		return e
	}
	return c.closeChannel(ch, e)
}

// publish hands a whole publication to the session as a PUBLISH of the
// exchange with the routing key as its key.
func (c *conn) publish(ch *channel, p *pending) error {
	if uid := p.props.UserID; uid != "" && uid != c.user {
		return c.closeChannel(ch, &Error{Code: PreconditionFailed, ClassID: ClassBasic, MethodID: 40,
			Text: fmt.Sprintf("PRECONDITION_FAILED - user_id property set to '%s' but authenticated user was '%s'", uid, c.user)})
	}
	if !c.rewriteReplyTo(ch, p) {
		return c.closeChannel(ch, requestError("fast reply consumer does not exist"))
	}
	if p.exchange == "" {
		switch {
		case strings.HasPrefix(p.key, replyTo+"."):
			if !c.s.directReply(p.key, &p.props, p.body) && p.mandatory {
				if err := c.returnUnroutable(ch, p); err != nil {
					return err
				}
			}
			return c.confirmNow(ch)
		case p.props.ReplyTo != "" && c.isRequestExchange(p.key):
			c.request(ch, p)
			return nil
		}
	}
	if p.mandatory && !c.routed(p) {
		// Returned first, then confirmed: RabbitMQ's order.
		if err := c.returnUnroutable(ch, p); err != nil {
			return err
		}
	}
	f := wire.NewFrame(wire.TypePublish)
	f.Name, f.Key, f.Body = p.exchange, p.key, p.body
	f.Header = propsToHeaders(&p.props)
	f.Ref = uint64(ch.id) << refChanBit
	if p.exchange == "" {
		// The default exchange: a SUBMIT to the queue named by the key.
		f.Type, f.Name, f.Key = wire.TypeSubmit, p.key, ""
		f.Aux = uint64(min(p.props.Priority, 9))
		f.Tag = ttlTag(p.props.Expiration)
		f.Ref |= refDefault
	}
	if ch.confirm {
		ch.nextTag++
		f.Ref |= ch.nextTag
		f.Flags |= wire.FlagReply
	}
	c.gw.sess.Handle(f)
	if err := c.checkChanErrs(); err != nil {
		return err
	}
	c.flow()
	return nil
}

// ttlTag is the SUBMIT tag of a publication's expiration property (ms):
// "ttl=N", or "" without a valid one. Most publications have none, and
// they cost no parse (a failed one allocates its error).
func ttlTag(expiration string) string {
	if expiration == "" {
		return ""
	}
	ms, err := strconv.ParseUint(expiration, 10, 63)
	if err != nil {
		return ""
	}
	return "ttl=" + strconv.FormatUint(ms, 10)
}

// routed reports whether a publication would reach a queue or a
// subscriber now; one to an exchange that does not exist counts as
// routed, its publish failing with 404 instead, as in RabbitMQ.
func (c *conn) routed(p *pending) bool {
	b := c.s.cfg.Broker
	if p.exchange == "" {
		ex := b.Exchange(p.key)
		return ex != nil && ex.Config().Pattern == wire.PatternTasks
	}
	if b.Exchange(p.exchange) == nil {
		return true
	}
	return b.Routed(p.exchange, p.key, propsToHeaders(&p.props))
}

// returnUnroutable sends a mandatory publication back with basic.return
// 312 NO_ROUTE.
func (c *conn) returnUnroutable(ch *channel, p *pending) error {
	r := &BasicReturn{ReplyCode: NoRoute, ReplyText: "NO_ROUTE", Exchange: p.exchange, RoutingKey: p.key}
	return c.sendContent(ch.id, r, &p.props, p.body, nil)
}

// confirmNow confirms a publication the gateway delivered itself.
func (c *conn) confirmNow(ch *channel) error {
	if !ch.confirm {
		return nil
	}
	ch.nextTag++
	return c.send(ch.id, &BasicAck{DeliveryTag: ch.nextTag})
}

// checkChanErrs closes the channels whose publications failed.
func (c *conn) checkChanErrs() error {
	if c.gw == nil {
		return nil
	}
	for id, e := range c.gw.takeChanErrs() {
		ch := c.channels[id]
		if ch == nil || ch.closing {
			continue
		}
		if e.Code == NotFound {
			e.Text = "NOT_FOUND - " + e.Text
		}
		if err := c.channelError(ch, e); err != nil {
			return err
		}
	}
	return nil
}

// propsToHeaders carries the AMQP headers table and properties into
// Courier's string headers: table values as text (composite values as
// JSON), properties under their AMQP names with dashes, which win over a
// header of the same name.
func propsToHeaders(p *Properties) map[string]string {
	h := make(map[string]string, len(p.Headers)+4)
	var types map[string]string
	for k, v := range p.Headers {
		h[k] = headerText(v)
		if typ := headerType(v); typ != "" {
			if types == nil {
				types = make(map[string]string)
			}
			types[k] = typ
		}
	}
	// The gateway owns the types and origin headers: a client's own are
	// replaced, or dropped.
	for _, k := range []string{broker.TypesHeader, headerExchange, headerRoutingKey} {
		delete(h, k)
		delete(types, k)
	}
	// A property wins over a header of its name, with its own type:
	// delivery-mode and priority are integers, timestamp a timestamp.
	setTyped := func(k, v, typ string) {
		if v == "" {
			return
		}
		h[k] = v
		delete(types, k)
		if typ != "" {
			if types == nil {
				types = make(map[string]string)
			}
			types[k] = typ
		}
	}
	set := func(k, v string) { setTyped(k, v, "") }
	set("content-type", p.ContentType)
	set("content-encoding", p.ContentEncoding)
	if p.DeliveryMode != 0 {
		setTyped("delivery-mode", strconv.Itoa(int(p.DeliveryMode)), "int")
	}
	if p.Priority != 0 {
		setTyped("priority", strconv.Itoa(int(p.Priority)), "int")
	}
	set("correlation-id", p.CorrelationID)
	set("reply-to", p.ReplyTo)
	set("expiration", p.Expiration)
	set("message-id", p.MessageID)
	if !p.Timestamp.IsZero() {
		setTyped("timestamp", strconv.FormatInt(p.Timestamp.Unix(), 10), "timestamp")
	}
	set("type", p.Type)
	set("user-id", p.UserID)
	set("app-id", p.AppID)
	set("cluster-id", p.ClusterID)
	if len(types) > 0 {
		b, _ := json.Marshal(types)
		h[broker.TypesHeader] = string(b)
	}
	if len(h) == 0 {
		return nil
	}
	return h
}

// headerType is the type of a field table value as the typed comparison
// of headers exchanges sees it (RabbitMQ's type classes: every integer
// is "int", both floats "float"), "" for a string.
func headerType(v any) string {
	switch v.(type) {
	case string:
		return ""
	case int8, uint8, int16, uint16, int32, uint32, int64:
		return "int"
	case float32, float64:
		return "float"
	case bool:
		return "bool"
	case time.Time:
		return "timestamp"
	case Decimal:
		return "decimal"
	case []byte:
		return "bytes"
	case Table:
		return "table"
	case []any:
		return "array"
	case nil:
		return "void"
	}
	return "unknown"
}

// typedValue is headerType backwards: the field table value of text of
// type typ, or text itself when typ is a string or the text does not
// read as typ.
func typedValue(text, typ string) any {
	switch typ {
	case "int":
		if n, err := strconv.ParseInt(text, 10, 64); err == nil {
			return n
		}
	case "float":
		if f, err := strconv.ParseFloat(text, 64); err == nil {
			return f
		}
	case "bool":
		if b, err := strconv.ParseBool(text); err == nil {
			return b
		}
	case "timestamp":
		if n, err := strconv.ParseInt(text, 10, 64); err == nil {
			return time.Unix(n, 0).UTC()
		}
	case "bytes":
		return []byte(text)
	case "void":
		return nil
	}
	return text
}

// headerText renders a field table value as a Courier header value.
func headerText(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case nil:
		return ""
	case time.Time:
		return strconv.FormatInt(v.Unix(), 10)
	case Decimal:
		return fmt.Sprintf("%de-%d", v.Value, v.Scale)
	case Table, []any:
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Sprint(v)
		}
		return string(b)
	}
	return fmt.Sprint(v)
}

func (g *gateway) addConsumer(cs *consumer) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.consumers[cs.attach] = cs
}

// addSource maps another attachment of cs (a bound exchange's) to it.
func (g *gateway) addSource(cs *consumer, attach uint32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.consumers[attach] = cs
}

func (g *gateway) removeConsumer(attach uint32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.consumers, attach)
}

func (g *gateway) consumer(attach uint32) *consumer {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.consumers[attach]
}

// ConnInfo is what [Describe] tells of an AMQP connection.
type ConnInfo struct {
	Peer        string
	User        string
	ConnectedAt time.Time
}

// Describe returns what the gateway knows of the AMQP connection behind a
// session's sink; ok is false when sink is not one of this package's.
func Describe(s broker.Sink) (info ConnInfo, ok bool) {
	k, ok := s.(sink)
	if !ok {
		return ConnInfo{}, false
	}
	return ConnInfo{Peer: k.c.peer, User: k.c.user, ConnectedAt: k.c.opened}, true
}
