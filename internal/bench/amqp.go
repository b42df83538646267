package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// amqpDriver runs scenarios on RabbitMQ: RPC over a queue the handler
// consumes, with replies through direct reply-to
// (amq.rabbitmq.reply-to) matched by correlation id; pub-sub through a
// fanout exchange with one exclusive, auto-ack queue per subscriber.
type amqpDriver struct {
	cfg *Config

	eventCounts // errors and disconnects seen, by text

	mu      sync.Mutex // guards conns, reqConn, pong
	conns   []*amqp.Connection
	reqConn *amqp.Connection
	pong    []byte
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
		msgs, err := ch.Consume(q.Name, "", true, true, false, false, nil)
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
