package amqp

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/wire"
)

// Queues and consumers: an AMQP queue is a Courier task exchange of the
// same name (its queue); the default exchange submits to it; a consumer
// is a worker attachment whose credit is the channel's prefetch; a
// delivery tag names a task held by one of the channel's consumers.

// refDefault marks, in a publication's ref, one to the default exchange:
// a queue that does not exist drops it, as RabbitMQ does.
const refDefault = 1 << 47

// The worker credit of consumers without a prefetch: prefetch 0 (no
// limit in AMQP), and no-ack consumers, whose deliveries are acked once
// written to the socket. They bound what the broker hands a consumer
// ahead of its socket, so that a fast reader is not cut off as a slow
// consumer by a burst of the whole queue.
const (
	unlimitedPrefetch = 1000
	noAckPrefetch     = 256
)

// consumer is one basic.consume: a worker attachment of the session.
type consumer struct {
	tag    string
	queue  string
	attach uint32
	noAck  bool
	ch     *channel
	// prefetch is the credit of each of its attachments; sources are
	// its durable subscriber attachments by bound exchange (bind.go).
	prefetch int
	sources  map[string]uint32
	// getter marks the worker of one basic.get of a queue another node
	// serves (get.go): not a consumer the client knows.
	getter bool

	// Until consume-ok is sent (ready), deliveries wait in early: the
	// broker may deliver while the ATTACH is being handled.
	mu    sync.Mutex // guards ready, early, sources, unacked, cancelled
	ready bool
	early []task
	// unacked are a no-ack consumer's deliveries handed to the outbox
	// and not yet acked to the broker (noack.go); cancelled is set once
	// they are flushed for good.
	unacked   map[held]bool
	cancelled bool
}

// task is a delivery kept until its consumer is ready.
type task struct {
	attach   uint32
	key      string
	id       uint64
	attempts uint64
	header   map[string]string
	body     []byte
}

// held is a task delivered and not yet settled.
type held struct {
	attach uint32
	task   uint64
}

// deliveries are a channel's delivery tags; deliveries arrive on the
// broker's goroutines while acks come from the read loop.
type deliveries struct {
	mu      sync.Mutex // guards next, unacked
	next    uint64
	unacked map[uint64]held
}

// add records a delivery and returns its tag.
func (d *deliveries) add(h held, track bool) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.next++
	if track {
		if d.unacked == nil {
			d.unacked = make(map[uint64]held)
		}
		d.unacked[d.next] = h
	}
	return d.next
}

// take removes and returns the deliveries tag names (with multiple, all
// up to it); ok is false when tag is not held (0 with multiple: all).
func (d *deliveries) take(tag uint64, multiple bool) (hs []held, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !multiple {
		h, ok := d.unacked[tag]
		if !ok {
			return nil, false
		}
		delete(d.unacked, tag)
		return []held{h}, true
	}
	if tag != 0 {
		if _, ok := d.unacked[tag]; !ok {
			return nil, false
		}
	}
	for t, h := range d.unacked {
		if tag == 0 || t <= tag {
			hs = append(hs, h)
			delete(d.unacked, t)
		}
	}
	return hs, true
}

// drop forgets the deliveries of attach (its consumer was cancelled: the
// broker gives its tasks to other workers).
func (d *deliveries) drop(attach uint32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for t, h := range d.unacked {
		if h.attach == attach {
			delete(d.unacked, t)
		}
	}
}

// queueArgs maps queue.declare's arguments onto a task exchange's
// config. RabbitMQ's requeue is immediate and unbounded: the queue
// retries without limit, after 1 ms.
func queueArgs(m *QueueDeclare) (wire.ExchangeConfig, *Error) {
	cfg := wire.ExchangeConfig{Pattern: wire.PatternTasks, Transient: !m.Durable, MaxAttempts: -1, BackoffMS: 1, BackoffMaxMS: 1}
	bad := func(format string, args ...any) *Error {
		return methodError(PreconditionFailed, m, "PRECONDITION_FAILED - "+fmt.Sprintf(format, args...))
	}
	for k, v := range m.Arguments {
		n, isInt := intArg(v)
		switch k {
		case "x-message-ttl":
			if !isInt || n < 0 {
				return cfg, bad("invalid arg 'x-message-ttl' for queue '%s': %v", m.Queue, v)
			}
			cfg.TTLMS = max(n, 1)
		case "x-max-length":
			if !isInt || n < 0 {
				return cfg, bad("invalid arg 'x-max-length' for queue '%s': %v", m.Queue, v)
			}
			cfg.MaxLength = n
		case "x-max-length-bytes":
			if !isInt || n < 0 {
				return cfg, bad("invalid arg 'x-max-length-bytes' for queue '%s': %v", m.Queue, v)
			}
			cfg.MaxBytes = n
		case "x-overflow":
			switch v {
			case wire.OverflowReject, wire.OverflowDropHead:
				cfg.Overflow = v.(string)
			default:
				return cfg, methodError(NotImplemented, m, fmt.Sprintf("x-overflow %v is not supported: Courier has drop-head and reject-publish", v))
			}
		case "x-dead-letter-exchange", "x-dead-letter-routing-key":
			// Both at once, after the loop.
		case "x-single-active-consumer":
			if b, _ := v.(bool); b {
				cfg.Strategy = wire.StrategySingleActive
			}
		case "x-max-priority":
			// Courier's queues always order by priority 0 to 9; publications
			// above 9 count as 9.
			if !isInt || n < 0 || n > 255 {
				return cfg, bad("invalid arg 'x-max-priority' for queue '%s': %v", m.Queue, v)
			}
		case "x-quorum-initial-group-size":
			if !isInt || n < 1 || n > wire.MaxReplicas {
				return cfg, bad("invalid arg 'x-quorum-initial-group-size' for queue '%s': %v (1 to %d)", m.Queue, v, wire.MaxReplicas)
			}
			cfg.Replicas = int(n)
		case "x-queue-type":
			switch v {
			case "classic", "quorum":
			default:
				return cfg, methodError(NotImplemented, m, fmt.Sprintf("x-queue-type %v is not supported: Courier has classic and quorum (both a Courier durable queue)", v))
			}
		default:
			return cfg, methodError(NotImplemented, m, fmt.Sprintf("queue argument %s is not supported by Courier's AMQP gateway", k))
		}
	}
	dl, e := deadLetterArgs(m)
	cfg.DeadLetter = dl
	return cfg, e
}

// deadLetterArgs maps x-dead-letter-exchange and
// x-dead-letter-routing-key onto the Courier exchange that takes the
// queue's dead letters: the exchange; or, with the default exchange ""
// and a routing key, the queue the key names, as RabbitMQ routes it.
func deadLetterArgs(m *QueueDeclare) (string, *Error) {
	xv, hasX := m.Arguments["x-dead-letter-exchange"]
	kv, hasK := m.Arguments["x-dead-letter-routing-key"]
	x, xok := xv.(string)
	k, kok := kv.(string)
	switch {
	case hasX && !xok:
		return "", methodError(PreconditionFailed, m, fmt.Sprintf("PRECONDITION_FAILED - invalid arg 'x-dead-letter-exchange' for queue '%s': %v", m.Queue, xv))
	case hasK && !kok:
		return "", methodError(PreconditionFailed, m, fmt.Sprintf("PRECONDITION_FAILED - invalid arg 'x-dead-letter-routing-key' for queue '%s': %v", m.Queue, kv))
	case hasK && !hasX:
		return "", methodError(PreconditionFailed, m, fmt.Sprintf("PRECONDITION_FAILED - invalid arg 'x-dead-letter-routing-key' for queue '%s': Key x-dead-letter-exchange should be specified", m.Queue))
	case hasK && x != "":
		return "", methodError(NotImplemented, m, "NOT_IMPLEMENTED - x-dead-letter-routing-key with an x-dead-letter-exchange other than the default exchange \"\": a dead letter keeps its own key")
	case hasK:
		return k, nil
	}
	return x, nil
}

// intArg reads an integer argument of any integer field type.
func intArg(v any) (int64, bool) {
	switch v := v.(type) {
	case int8:
		return int64(v), true
	case uint8:
		return int64(v), true
	case int16:
		return int64(v), true
	case uint16:
		return int64(v), true
	case int32:
		return int64(v), true
	case uint32:
		return int64(v), true
	case int64:
		return v, true
	}
	return 0, false
}

// randomName returns prefix and 22 random hex digits, as RabbitMQ names
// server-named queues and consumer tags.
func randomName(prefix string) string {
	var b [11]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// queueDeclare maps queue.declare onto a DECLARE of a task exchange.
func (c *conn) queueDeclare(ch *channel, m *QueueDeclare) error {
	name := m.Queue
	if name == "" && !m.Passive {
		name = randomName("amq.gen-")
	} else if !m.Passive && len(name) >= 4 && name[:4] == "amq." {
		return c.closeChannel(ch, methodError(AccessRefused, m, fmt.Sprintf("ACCESS_REFUSED - queue name '%s' contains reserved prefix 'amq.*'", name)))
	}
	if c.lockedBy(name) {
		return c.closeChannel(ch, locked(m, name))
	}
	exclusive := m.Exclusive && !m.Passive
	if exclusive && c.s.owners.owner(name) != c {
		// An existing queue that is not ours is locked to us.
		if r, err := c.queueExists(name); err != nil {
			return err
		} else if r {
			return c.closeChannel(ch, locked(m, name))
		}
	}
	f := wire.NewFrame(wire.TypeDeclare)
	f.Name = name
	if m.Passive {
		f.Aux = 1
	} else {
		cfg, e := queueArgs(m)
		if e != nil {
			return c.channelError(ch, e)
		}
		cfg.Transient = cfg.Transient || exclusive
		if !c.s.cfg.Broker.Clustered() {
			cfg.Replicas = 0 // a node alone keeps one copy whatever is asked
		} else if cfg.Transient {
			// A cluster's queues are on disk: a queue RabbitMQ keeps on
			// one node in memory is a queue of one replica.
			cfg.Transient, cfg.Replicas = false, 1
		}
		f.Body, _ = json.Marshal(cfg)
	}
	fresh := false
	if exclusive {
		var ok bool
		if ok, fresh = c.s.owners.claim(name, c); !ok {
			return c.closeChannel(ch, locked(m, name))
		}
	}
	r, err := c.gw.call(f)
	if err != nil {
		if fresh {
			c.s.owners.release(name, c)
		}
		return err
	}
	defer r.Release()
	if fresh {
		if r.Type == wire.TypeError {
			c.s.owners.release(name, c)
		} else {
			if c.owned == nil {
				c.owned = make(map[string]bool)
			}
			c.owned[name] = true
		}
	}
	if r.Type == wire.TypeError {
		e := fromWire(wire.Code(r.Aux), r.Tag)
		if e.Code == NotFound {
			e.Text = fmt.Sprintf("NOT_FOUND - no queue '%s' in vhost '/'", name)
		}
		e.ClassID, e.MethodID = m.ClassMethod()
		return c.channelError(ch, e)
	}
	var info wire.ExchangeInfo
	json.Unmarshal(r.Body, &info)
	if info.Pattern != "" && info.Pattern != wire.PatternTasks {
		return c.closeChannel(ch, methodError(PreconditionFailed, m, fmt.Sprintf("PRECONDITION_FAILED - '%s' is a Courier %s exchange, not a queue", name, info.Pattern)))
	}
	if m.AutoDelete && !m.Passive {
		c.s.autoDel.declared(name)
	}
	if m.NoWait {
		return nil
	}
	ok := &QueueDeclareOK{Queue: name}
	if q := info.Queue; q != nil {
		ok.MessageCount, ok.ConsumerCount = uint32(max(q.Ready, 0)), uint32(max(q.Consumers, 0))
	}
	return c.send(ch.id, ok)
}

// queueExists reports whether queue exists, with a passive DECLARE.
func (c *conn) queueExists(queue string) (bool, error) {
	f := wire.NewFrame(wire.TypeDeclare)
	f.Name, f.Aux = queue, 1
	r, err := c.gw.call(f)
	if err != nil {
		return false, err
	}
	defer r.Release()
	return r.Type != wire.TypeError, nil
}

// queueDelete maps queue.delete onto a DELETE of the queue.
func (c *conn) queueDelete(ch *channel, m *QueueDelete) error {
	if c.lockedBy(m.Queue) {
		return c.closeChannel(ch, locked(m, m.Queue))
	}
	messages, consumers := c.queueUse(m.Queue)
	switch {
	case m.IfUnused && consumers > 0:
		return c.closeChannel(ch, methodError(PreconditionFailed, m, fmt.Sprintf("PRECONDITION_FAILED - queue '%s' in vhost '/' in use", m.Queue)))
	case m.IfEmpty && messages > 0:
		return c.closeChannel(ch, methodError(PreconditionFailed, m, fmt.Sprintf("PRECONDITION_FAILED - queue '%s' in vhost '/' is not empty", m.Queue)))
	}
	if c.owned[m.Queue] {
		delete(c.owned, m.Queue)
		defer c.s.owners.release(m.Queue, c)
	}
	c.s.autoDel.forget(m.Queue)
	if done, err := c.deleteInBroker(ch, m, m.Queue, 1); !done {
		return err
	}
	// Before delete-ok: a client that has it sees the bindings gone, and
	// an auto-delete exchange with them.
	c.dropBindings(m.Queue)
	if m.NoWait {
		return nil
	}
	return c.send(ch.id, &QueueDeleteOK{MessageCount: uint32(min(messages, 1<<32-1))})
}

// queueUse returns the messages queue holds (ready, unacknowledged and
// delayed, its bindings' included) and its consumers (Courier workers
// too), as queue.delete's if-empty and if-unused see them.
func (c *conn) queueUse(queue string) (messages, consumers int64) {
	b := c.s.cfg.Broker
	names := []string{queue}
	for _, x := range boundExchanges(b, queue) {
		names = append(names, x+"/"+bindSub(queue))
	}
	for i, name := range names {
		if q := b.Queue(name); q != nil {
			st := q.Stats()
			messages += max(st.Messages(), 0)
			if i == 0 {
				consumers = st.Consumers
			}
		}
	}
	return messages, consumers
}

// queuePurge drops the queue's ready messages, with the read permission
// on it, as RabbitMQ asks.
func (c *conn) queuePurge(ch *channel, m *QueuePurge) error {
	if c.lockedBy(m.Queue) {
		return c.closeChannel(ch, locked(m, m.Queue))
	}
	if u := c.s.cfg.Users; u != nil && u.Perms(c.user, m.Queue)&auth.Read == 0 {
		return c.closeChannel(ch, methodError(AccessRefused, m, fmt.Sprintf("ACCESS_REFUSED - access to queue '%s' in vhost '/' refused for user '%s'", m.Queue, c.user)))
	}
	n, err := c.s.cfg.Broker.PurgeQueue(m.Queue)
	if err != nil {
		var we *wire.Error
		code := wire.CodeInternal
		if errors.As(err, &we) {
			code = we.Code
		}
		e := fromWire(code, err.Error())
		if e.Code == NotFound {
			e.Text = fmt.Sprintf("NOT_FOUND - no queue '%s' in vhost '/'", m.Queue)
		}
		e.ClassID, e.MethodID = m.ClassMethod()
		return c.channelError(ch, e)
	}
	if m.NoWait {
		return nil
	}
	return c.send(ch.id, &QueuePurgeOK{MessageCount: uint32(min(n, 1<<32-1))})
}

// basicQos sets the prefetch of the channel's next consumers.
func (c *conn) basicQos(ch *channel, m *BasicQos) error {
	switch {
	case m.PrefetchSize != 0:
		return methodError(NotImplemented, m, "NOT_IMPLEMENTED - prefetch_size!=0")
	case m.Global:
		return methodError(NotImplemented, m, "basic.qos global=true is not built yet in Courier's AMQP gateway: the prefetch is per consumer")
	}
	ch.prefetch = int(m.PrefetchCount)
	return c.send(ch.id, &BasicQosOK{})
}

// basicConsume attaches a worker to the queue.
func (c *conn) basicConsume(ch *channel, m *BasicConsume) error {
	if len(m.Arguments) > 0 {
		return methodError(NotImplemented, m, "consumer arguments are not supported by Courier's AMQP gateway")
	}
	if m.Queue == replyTo {
		return c.consumeReplyTo(ch, m)
	}
	if c.lockedBy(m.Queue) {
		return c.closeChannel(ch, locked(m, m.Queue))
	}
	tag := m.ConsumerTag
	if tag == "" {
		tag = randomName("amq.ctag-")
	}
	if ch.consumers[tag] != nil {
		return methodError(NotAllowed, m, fmt.Sprintf("NOT_ALLOWED - attempt to reuse consumer tag '%s'", tag))
	}
	prefetch := ch.prefetch
	switch {
	case m.NoAck:
		prefetch = noAckPrefetch
	case prefetch == 0:
		prefetch = unlimitedPrefetch
	}
	c.nextAttach++
	cs := &consumer{tag: tag, queue: m.Queue, attach: c.nextAttach, noAck: m.NoAck, ch: ch, prefetch: prefetch}
	var others int64
	if m.Exclusive {
		others = c.brokerConsumers(m.Queue)
	}
	if !c.s.consumers.add(cs, m.Exclusive, others) {
		return c.closeChannel(ch, inExclusiveUse(m, m.Queue))
	}
	c.gw.addConsumer(cs)
	f := wire.NewFrame(wire.TypeAttach)
	f.Name, f.Aux, f.Attach = m.Queue, wire.RoleWorker, cs.attach
	f.Body, _ = json.Marshal(wire.AttachSpec{Prefetch: prefetch, ConnTag: tag})
	r, err := c.gw.call(f)
	if err != nil {
		c.s.consumers.remove(cs)
		return err
	}
	defer r.Release()
	if r.Type == wire.TypeError {
		c.gw.removeConsumer(cs.attach)
		c.s.consumers.remove(cs)
		e := fromWire(wire.Code(r.Aux), r.Tag)
		switch wire.Code(r.Aux) {
		case wire.CodeNotFound:
			e.Text = fmt.Sprintf("NOT_FOUND - no queue '%s' in vhost '/'", m.Queue)
		case wire.CodeNotAllowed:
			e.Text = fmt.Sprintf("PRECONDITION_FAILED - '%s' is not a queue: %s", m.Queue, r.Tag)
		}
		e.ClassID, e.MethodID = m.ClassMethod()
		return c.channelError(ch, e)
	}
	ch.consumers[tag] = cs
	c.s.autoDel.consumed(m.Queue)
	for _, x := range c.bindingSources(m.Queue) {
		if err := c.attachSource(cs, x); err != nil {
			return err
		}
	}
	if !m.NoWait {
		if err := c.send(ch.id, &BasicConsumeOK{ConsumerTag: tag}); err != nil {
			return err
		}
	}
	cs.mu.Lock()
	early := cs.early
	cs.ready, cs.early = true, nil
	cs.mu.Unlock()
	for _, t := range early {
		c.sendTask(cs, t)
	}
	return nil
}

// basicCancel detaches a consumer; the tasks it held go to other
// consumers (Courier redelivers them), so its delivery tags are void.
func (c *conn) basicCancel(ch *channel, m *BasicCancel) error {
	if ch.reply != nil && ch.reply.tag == m.ConsumerTag {
		c.cancelReplyTo(ch)
	}
	if cs := ch.consumers[m.ConsumerTag]; cs != nil {
		c.cancelConsumer(cs)
	}
	if m.NoWait {
		return nil
	}
	return c.send(ch.id, &BasicCancelOK{ConsumerTag: m.ConsumerTag})
}

func (c *conn) cancelConsumer(cs *consumer) {
	delete(cs.ch.consumers, cs.tag)
	c.s.consumers.remove(cs)
	c.flushNoAck(cs)
	c.detach(cs.attach)
	cs.mu.Lock()
	ids := make([]uint32, 0, len(cs.sources))
	for _, id := range cs.sources {
		ids = append(ids, id)
	}
	cs.mu.Unlock()
	for _, id := range ids {
		c.detach(id)
	}
	c.consumerReleased(cs.queue)
}

// detach ends one attachment of a consumer.
func (c *conn) detach(attach uint32) {
	c.gw.removeConsumer(attach)
	f := wire.NewFrame(wire.TypeDetach)
	f.Attach = attach
	if r, err := c.gw.call(f); err == nil {
		r.Release()
	}
	// The consumer's channel forgets the deliveries of attach.
	for _, ch := range c.channels {
		ch.tags.drop(attach)
	}
}

// consumerGone tells the client that the broker ended a consumer (its
// queue was deleted) with basic.cancel, as RabbitMQ does for clients
// with the consumer_cancel_notify capability; its delivery tags are void.
func (c *conn) consumerGone(attach uint32, why string) {
	cs := c.gw.consumer(attach)
	if cs == nil {
		return
	}
	c.gw.removeConsumer(attach)
	if cs.getter {
		cs.ch.tags.drop(attach)
		return
	}
	if attach != cs.attach {
		// A bound exchange was deleted: the consumer goes on with the
		// queue's other sources.
		cs.ch.tags.drop(attach)
		return
	}
	cs.ch.tags.drop(attach)
	c.s.consumers.remove(cs)
	c.s.log.Info("amqp consumer cancelled by the broker", "peer", c.peer, "consumer", cs.tag, "queue", cs.queue, "why", why)
	caps, _ := c.clientProps["capabilities"].(Table)
	if notify, _ := caps["consumer_cancel_notify"].(bool); notify {
		c.send(cs.ch.id, &BasicCancel{ConsumerTag: cs.tag, NoWait: true})
	}
}

// settle maps basic.ack, basic.nack and basic.reject onto ACK and NACK.
func (c *conn) settle(ch *channel, m Method, tag uint64, multiple, nack, requeue bool) error {
	hs, ok := ch.tags.take(tag, multiple)
	if !ok {
		return c.closeChannel(ch, methodError(PreconditionFailed, m, fmt.Sprintf("PRECONDITION_FAILED - unknown delivery tag %d", tag)))
	}
	for _, h := range hs {
		f := wire.NewFrame(wire.TypeAck)
		if nack {
			f.Type = wire.TypeNack
			if requeue {
				f.Aux = 1
			}
		}
		f.Attach, f.Ref = h.attach, h.task
		c.gw.sess.Handle(f)
		c.settledGetter(ch, h.attach)
	}
	return nil
}

// basicRecover requeues every unacknowledged delivery of the channel.
func (c *conn) basicRecover(ch *channel, m *BasicRecover) error {
	if err := c.settle(ch, m, 0, true, true, true); err != nil {
		return err
	}
	return c.send(ch.id, &BasicRecoverOK{})
}

// deliverTask sends a task to its consumer as basic.deliver with its
// content, in one write.
func (c *conn) deliverTask(f *wire.Frame) {
	cs := c.gw.consumer(f.Attach)
	if cs == nil {
		return // cancelled: the broker redelivers what it still sends
	}
	t := task{attach: f.Attach, key: f.Key, id: f.Ref, attempts: f.Aux, header: f.Header, body: f.Body}
	cs.mu.Lock()
	if !cs.ready {
		t.body = append([]byte(nil), f.Body...)
		cs.early = append(cs.early, t)
		cs.mu.Unlock()
		return
	}
	cs.mu.Unlock()
	c.sendTask(cs, t)
}

// sendTask writes one delivery, and acks it at once for a no-ack
// consumer.
func (c *conn) sendTask(cs *consumer, t task) {
	tag := cs.ch.tags.add(held{attach: t.attach, task: t.id}, !cs.noAck)
	d := &BasicDeliver{ConsumerTag: cs.tag, DeliveryTag: tag, Redelivered: t.attempts > 0, RoutingKey: cs.queue}
	if x, key, ok := origin(t.header); ok && t.attach == cs.attach {
		d.Exchange, d.RoutingKey = shortstr(x), shortstr(key) // moved from a binding, in a cluster
	}
	if t.attach != cs.attach {
		// From a bound exchange: its name and the publication's key.
		d.RoutingKey = shortstr(t.key)
		cs.mu.Lock()
		for x, id := range cs.sources {
			if id == t.attach {
				d.Exchange = x
			}
		}
		cs.mu.Unlock()
	}
	var after func()
	if cs.noAck {
		var ok bool
		if after, ok = c.settleNoAck(cs, held{attach: t.attach, task: t.id}); !ok {
			return // cancelled: never written, the broker redelivers it
		}
	}
	if err := c.sendContent(cs.ch.id, d, headersToProps(t.header), t.body, after); err != nil {
		// Cut off (a slow consumer) or closed: the broker gives the
		// consumer's tasks to others when its session closes.
		c.s.log.Debug("amqp delivery failed", "peer", c.peer, "err", err)
	}
}

// sendContent queues a method with content (deliver, get-ok, return) as
// data: it never waits, and a client with more than the outbox limit
// waiting for it is cut off.
func (c *conn) sendContent(channel uint16, m Method, props *Properties, body []byte, after func()) error {
	return c.put(func(b []byte) ([]byte, error) {
		b, err := AppendMethod(b, channel, m)
		if err == nil {
			b, err = AppendContent(b, channel, props, body, c.frameMax)
		}
		return b, err
	}, true, after)
}

// shortProps are the properties carried as headers whose AMQP type is a
// short string, at most 255 octets.
var shortProps = map[string]bool{"content-type": true, "content-encoding": true, "correlation-id": true, "reply-to": true,
	"expiration": true, "message-id": true, "type": true, "user-id": true, "app-id": true, "cluster-id": true}

// headersToProps is propsToHeaders backwards: the headers named for
// properties become them again, the others the headers table. A header
// no AMQP table takes (a name over 255 octets, from a Courier-native
// publisher) is left out; one named for a short-string property with a
// value over 255 octets is the table's x-courier-<name>.
func headersToProps(h map[string]string) *Properties {
	p := &Properties{}
	var types map[string]string
	if t := h[broker.TypesHeader]; t != "" && len(t) <= broker.MaxTypesHeader {
		json.Unmarshal([]byte(t), &types)
	}
	for k, v := range h {
		if len(k) > 255 {
			continue // no AMQP table takes the name (a Courier header)
		}
		if len(v) > 255 && shortProps[k] {
			// Too long for the property: a header of the table.
			k = "x-courier-" + k
		}
		switch k {
		case "content-type":
			p.ContentType = v
		case "content-encoding":
			p.ContentEncoding = v
		case "delivery-mode":
			n, _ := strconv.ParseUint(v, 10, 8)
			p.DeliveryMode = uint8(n)
		case "priority":
			n, _ := strconv.ParseUint(v, 10, 8)
			p.Priority = uint8(n)
		case "correlation-id":
			p.CorrelationID = v
		case "reply-to":
			p.ReplyTo = v
		case "expiration":
			p.Expiration = v
		case "message-id":
			p.MessageID = v
		case "type":
			p.Type = v
		case "timestamp":
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				p.Timestamp = time.Unix(n, 0).UTC()
			}
		case "user-id":
			p.UserID = v
		case "app-id":
			p.AppID = v
		case "cluster-id":
			p.ClusterID = v
		case broker.TypesHeader, headerExchange, headerRoutingKey:
			// Read above, or basic.deliver's exchange and routing key.
		default:
			if p.Headers == nil {
				p.Headers = Table{}
			}
			p.Headers[k] = typedValue(v, types[k])
		}
	}
	return p
}
