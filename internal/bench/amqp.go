package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// amqpDriver runs scenarios on an AMQP 0-9-1 broker, RabbitMQ or
// Courier's own AMQP port: RPC over a queue the handler
// consumes, with replies through direct reply-to
// (amq.rabbitmq.reply-to) matched by correlation id; pub-sub through a
// fanout exchange with one exclusive, auto-ack queue per subscriber;
// the durable-queue scenarios on a durable queue with confirms (below).
type amqpDriver struct {
	cfg *Config

	eventCounts // errors and disconnects seen, by text

	mu      sync.Mutex // guards conns, reqConn, pong, admin
	conns   []*amqp.Connection
	reqConn *amqp.Connection
	pong    []byte
	admin   *amqp.Channel // declares, inspects and deletes queues

	// delivered and acked count the queue consumers' messages.
	delivered, acked atomic.Int64
}

var _ driver = (*amqpDriver)(nil)

func newAMQPDriver(cfg *Config) *amqpDriver {
	return &amqpDriver{cfg: cfg}
}

func (d *amqpDriver) connect(name string) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	conn, err := amqp.DialConfig(d.cfg.Target.URL, amqp.Config{Properties: props, Heartbeat: 10 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("bench: connect to %s: %w", redact(d.cfg.Target.URL), err)
	}
	// Record flow control: a blocked publisher is part of the result.
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 16))
	go func() {
		for b := range blocked {
			if b.Active {
				d.event(name + ": blocked by the broker: " + b.Reason)
			}
		}
	}()
	d.mu.Lock()
	d.conns = append(d.conns, conn)
	d.mu.Unlock()
	return conn, nil
}

func (d *amqpDriver) serve(ctx context.Context, n int, pong []byte) error {
	// The handlers are competing consumers of one queue.
	for i := range n {
		name := fmt.Sprintf("bench-handler-%d", i)
		hc, err := d.connect(name)
		if err != nil {
			return err
		}
		ch, err := hc.Channel()
		if err != nil {
			return fmt.Errorf("bench: handler channel: %w", err)
		}
		q, err := ch.QueueDeclare(names("reqresp"), false, true, false, false, nil)
		if err != nil {
			return fmt.Errorf("bench: declare queue: %w", err)
		}
		msgs, err := ch.Consume(q.Name, name, true, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("bench: consume: %w", err)
		}
		go func() {
			for m := range msgs {
				err := ch.PublishWithContext(context.Background(), "", m.ReplyTo, false, false,
					amqp.Publishing{CorrelationId: m.CorrelationId, Body: pong})
				if err != nil {
					d.event(name + ": reply: " + err.Error())
				}
			}
		}()
	}
	rc, err := d.connect("bench-requesters")
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.reqConn, d.pong = rc, pong
	d.mu.Unlock()
	return nil
}

// amqpRequester has a channel of its own on the requesters' connection:
// direct reply-to delivers replies to the channel that published.
type amqpRequester struct {
	ch      *amqp.Channel
	replies <-chan amqp.Delivery
	queue   string
	pong    []byte
	next    uint64
}

func (d *amqpDriver) requester(ctx context.Context) (requester, error) {
	d.mu.Lock()
	rc, pong := d.reqConn, d.pong
	d.mu.Unlock()
	if rc == nil {
		return nil, errors.New("bench: requester before serve")
	}
	ch, err := rc.Channel()
	if err != nil {
		return nil, fmt.Errorf("bench: requester channel: %w", err)
	}
	// Direct reply-to needs the consumer first, with auto-ack.
	replies, err := ch.Consume("amq.rabbitmq.reply-to", "", true, false, false, false, nil)
	if err != nil {
		ch.Close()
		return nil, fmt.Errorf("bench: consume amq.rabbitmq.reply-to: %w", err)
	}
	return &amqpRequester{ch: ch, replies: replies, queue: names("reqresp"), pong: pong}, nil
}

func (r *amqpRequester) request(ctx context.Context, body []byte) error {
	r.next++
	id := strconv.FormatUint(r.next, 10)
	err := r.ch.PublishWithContext(ctx, "", r.queue, false, false, amqp.Publishing{
		CorrelationId: id, ReplyTo: "amq.rabbitmq.reply-to", Body: body,
	})
	if err != nil {
		return fmt.Errorf("bench: publish request: %w", err)
	}
	for {
		select {
		case m, ok := <-r.replies:
			if !ok {
				return errors.New("bench: reply channel closed")
			}
			if m.CorrelationId != id {
				continue // a late reply to a request given up on
			}
			if !bytes.Equal(m.Body, r.pong) {
				return fmt.Errorf("bench: unexpected response %.20q", m.Body)
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (r *amqpRequester) close() error { return r.ch.Close() }

func (d *amqpDriver) subscribe(ctx context.Context, n int, fn func(int, []byte)) error {
	exchange := names("fanout")
	for i := range n {
		conn, err := d.connect(fmt.Sprintf("bench-sub-%d", i))
		if err != nil {
			return err
		}
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("bench: subscriber channel: %w", err)
		}
		if err := ch.ExchangeDeclare(exchange, "fanout", false, true, false, false, nil); err != nil {
			return fmt.Errorf("bench: declare exchange: %w", err)
		}
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		if err != nil {
			return fmt.Errorf("bench: declare queue: %w", err)
		}
		if err := ch.QueueBind(q.Name, "", exchange, false, nil); err != nil {
			return fmt.Errorf("bench: bind queue: %w", err)
		}
		// Not an exclusive consumer: the queue is exclusive already, so
		// no one else may consume it.
		msgs, err := ch.Consume(q.Name, "", true, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("bench: consume: %w", err)
		}
		go func() {
			for m := range msgs {
				fn(i, m.Body)
			}
		}()
	}
	return nil
}

type amqpPublisher struct {
	ch       *amqp.Channel
	exchange string
}

func (d *amqpDriver) publisher(ctx context.Context) (publisher, error) {
	conn, err := d.connect("bench-publisher")
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("bench: publisher channel: %w", err)
	}
	exchange := names("fanout")
	if err := ch.ExchangeDeclare(exchange, "fanout", false, true, false, false, nil); err != nil {
		return nil, fmt.Errorf("bench: declare exchange: %w", err)
	}
	return &amqpPublisher{ch: ch, exchange: exchange}, nil
}

func (p *amqpPublisher) publish(ctx context.Context, body []byte) error {
	return p.ch.PublishWithContext(ctx, p.exchange, "", false, false, amqp.Publishing{Body: body})
}

// flush: amqp091 writes each publish to the socket before it returns.
func (p *amqpPublisher) flush(ctx context.Context) error { return nil }

func (d *amqpDriver) close() error {
	d.mu.Lock()
	conns := d.conns
	d.conns = nil
	d.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return nil
}

// The tasks and backlog scenarios map onto a durable RabbitMQ queue:
// producers publish persistent messages (delivery mode 2) on a channel
// in confirm mode, and count a message confirmed on its basic.ack;
// consumers set basic.qos to their prefetch and ack each delivery
// manually.

var _ queueDriver = (*amqpDriver)(nil)

// adminChannel returns the channel that declares, inspects and deletes
// the queues, on a connection of its own.
func (d *amqpDriver) adminChannel() (*amqp.Channel, error) {
	d.mu.Lock()
	ch := d.admin
	d.mu.Unlock()
	if ch != nil && !ch.IsClosed() {
		return ch, nil
	}
	conn, err := d.connect("bench-admin")
	if err != nil {
		return nil, err
	}
	if ch, err = conn.Channel(); err != nil {
		return nil, fmt.Errorf("bench: admin channel: %w", err)
	}
	d.mu.Lock()
	d.admin = ch
	d.mu.Unlock()
	return ch, nil
}

func (d *amqpDriver) declareQueue(ctx context.Context, name string) error {
	ch, err := d.adminChannel()
	if err != nil {
		return err
	}
	if _, err := ch.QueueDelete(name, false, false, false); err != nil {
		return fmt.Errorf("bench: delete queue: %w", err)
	}
	_, err = ch.QueueDeclare(name, true, false, false, false, nil)
	return err
}

// amqpProducer publishes on a channel in confirm mode; a goroutine hands
// each confirm to its submit's done func, found by delivery tag.
type amqpProducer struct {
	conn  *amqp.Connection
	ch    *amqp.Channel
	queue string

	mu      sync.Mutex // guards pending
	pending map[uint64]func(error)
}

func (d *amqpDriver) producer(ctx context.Context, name string) (producer, error) {
	conn, err := d.connect("bench-producer")
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("bench: producer channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("bench: confirm mode: %w", err)
	}
	p := &amqpProducer{conn: conn, ch: ch, queue: name, pending: map[uint64]func(error){}}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1024))
	go func() {
		for c := range confirms {
			var err error
			if !c.Ack {
				err = errors.New("bench: basic.nack from the broker")
			}
			p.settle(c.DeliveryTag, err)
		}
		// The channel closed: what was not confirmed never will be.
		p.mu.Lock()
		pending := p.pending
		p.pending = map[uint64]func(error){}
		p.mu.Unlock()
		for _, done := range pending {
			done(amqp.ErrClosed)
		}
	}()
	return p, nil
}

func (p *amqpProducer) settle(tag uint64, err error) {
	p.mu.Lock()
	done := p.pending[tag]
	delete(p.pending, tag)
	p.mu.Unlock()
	if done != nil {
		done(err)
	}
}

func (p *amqpProducer) submit(ctx context.Context, body []byte, done func(error)) error {
	tag := p.ch.GetNextPublishSeqNo()
	p.mu.Lock()
	p.pending[tag] = done
	p.mu.Unlock()
	err := p.ch.PublishWithContext(ctx, "", p.queue, false, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body})
	if err != nil {
		p.mu.Lock()
		delete(p.pending, tag)
		p.mu.Unlock()
		return fmt.Errorf("bench: publish: %w", err)
	}
	return nil
}

func (p *amqpProducer) close() error { return p.conn.Close() }

// amqpDelivery is a delivery to a consumer; its ack is counted, so that
// depth can add the unacked messages the broker leaves out.
type amqpDelivery struct {
	d     amqp.Delivery
	acked *atomic.Int64
}

func (m *amqpDelivery) body() []byte { return m.d.Body }

func (m *amqpDelivery) ack() error {
	m.acked.Add(1)
	return m.d.Ack(false)
}

func (d *amqpDriver) consume(ctx context.Context, name string, prefetch int, fn func(delivery)) error {
	conn, err := d.connect("bench-worker")
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("bench: consumer channel: %w", err)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return fmt.Errorf("bench: basic.qos: %w", err)
	}
	msgs, err := ch.Consume(name, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("bench: consume: %w", err)
	}
	go func() {
		for m := range msgs {
			d.delivered.Add(1)
			fn(&amqpDelivery{d: m, acked: &d.acked})
		}
	}()
	return nil
}

// depth is the queue's ready messages (what queue.declare-ok counts)
// plus those delivered to this driver's consumers and not yet acked.
func (d *amqpDriver) depth(ctx context.Context, name string) (int64, error) {
	ch, err := d.adminChannel()
	if err != nil {
		return 0, err
	}
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return int64(q.Messages) + d.delivered.Load() - d.acked.Load(), nil
}

func (d *amqpDriver) deleteQueue(ctx context.Context, name string) error {
	ch, err := d.adminChannel()
	if err != nil {
		return err
	}
	_, err = ch.QueueDelete(name, false, false, false)
	return err
}

// amqpLabel heads a comparison's column of an AMQP target by the
// product its server announces in connection.start: "RabbitMQ", or
// "Courier AMQP" for Courier's AMQP port, so that the two are told
// apart; "AMQP" when the server cannot be asked.
func amqpLabel(url string) string {
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return "AMQP"
	}
	defer conn.Close()
	switch p, _ := conn.Properties["product"].(string); p {
	case "":
		return "AMQP"
	case "Courier":
		return "Courier AMQP"
	default:
		return p
	}
}
