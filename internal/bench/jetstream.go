package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The tasks and backlog scenarios map onto NATS JetStream: the queue is
// a file-backed stream with work-queue retention (a message leaves it
// when acked) on the subject of the queue's name; producers publish
// asynchronously and count a message confirmed when its PubAck comes;
// consumers share one durable pull consumer with explicit acks, whose
// MaxAckPending is the sum of their prefetches: the server delivers no
// more unacked messages than that. Each consumer pulls with the client's
// default buffer (PullMaxMessages 500): with a buffer as small as the
// prefetch, the client's pulls stalled for 30-37 s (a pull request's
// expiry) once or twice a million messages in the backlog scenario.

var _ queueDriver = (*natsDriver)(nil)

// jsConsumer is the name of the queue's durable consumer.
const jsConsumer = "bench"

// streamName is the stream of a queue: stream names hold no dots.
func streamName(queue string) string { return strings.ReplaceAll(queue, ".", "_") }

// jetStream returns the JetStream context of the driver's first
// connection, which declares, inspects and deletes the streams.
func (d *natsDriver) jetStream() (jetstream.JetStream, error) {
	d.mu.Lock()
	js := d.js
	d.mu.Unlock()
	if js != nil {
		return js, nil
	}
	nc, err := d.connect("bench-admin")
	if err != nil {
		return nil, err
	}
	if js, err = jetstream.New(nc); err != nil {
		return nil, fmt.Errorf("bench: jetstream: %w", err)
	}
	d.mu.Lock()
	d.js = js
	d.mu.Unlock()
	return js, nil
}

func (d *natsDriver) declareQueue(ctx context.Context, name string) error {
	js, err := d.jetStream()
	if err != nil {
		return err
	}
	if err := js.DeleteStream(ctx, streamName(name)); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return jsErr(err)
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name: streamName(name), Subjects: []string{name},
		Storage: jetstream.FileStorage, Retention: jetstream.WorkQueuePolicy, Replicas: 1,
	})
	return jsErr(err)
}

// jsErr explains the error of a server without JetStream.
func jsErr(err error) error {
	if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
		return fmt.Errorf("%w (start nats-server with -js, as scripts/peers.sh does)", err)
	}
	return err
}

// jsProducer publishes with PublishMsgAsync; the ack and error handlers
// find the submit's done func by its message.
type jsProducer struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	subject string

	mu      sync.Mutex // guards pending
	pending map[*nats.Msg]func(error)
}

func (d *natsDriver) producer(ctx context.Context, name string) (producer, error) {
	nc, err := d.connect("bench-producer")
	if err != nil {
		return nil, err
	}
	p := &jsProducer{nc: nc, subject: name, pending: map[*nats.Msg]func(error){}}
	p.js, err = jetstream.New(nc,
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) { p.settle(m, nil) }),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) { p.settle(m, err) }),
		// The scenario's window bounds the publishes in flight.
		jetstream.WithPublishAsyncMaxPending(1<<20),
	)
	if err != nil {
		return nil, fmt.Errorf("bench: jetstream: %w", err)
	}
	return p, nil
}

func (p *jsProducer) settle(m *nats.Msg, err error) {
	p.mu.Lock()
	done := p.pending[m]
	delete(p.pending, m)
	p.mu.Unlock()
	if done != nil {
		done(err)
	}
}

func (p *jsProducer) submit(ctx context.Context, body []byte, done func(error)) error {
	m := &nats.Msg{Subject: p.subject, Data: body}
	p.mu.Lock()
	p.pending[m] = done
	p.mu.Unlock()
	if _, err := p.js.PublishMsgAsync(m); err != nil {
		p.mu.Lock()
		delete(p.pending, m)
		p.mu.Unlock()
		return err
	}
	return nil
}

func (p *jsProducer) close() error { p.nc.Close(); return nil }

type jsDelivery struct{ m jetstream.Msg }

func (m jsDelivery) body() []byte { return m.m.Data() }
func (m jsDelivery) ack() error   { return m.m.Ack() }

func (d *natsDriver) consume(ctx context.Context, name string, prefetch int, fn func(delivery)) error {
	js, err := d.jetStream()
	if err != nil {
		return err
	}
	// Every consumer adds its prefetch to the durable consumer's credit.
	d.mu.Lock()
	d.ackPending += prefetch
	pending := d.ackPending
	d.mu.Unlock()
	_, err = js.CreateOrUpdateConsumer(ctx, streamName(name), jetstream.ConsumerConfig{
		Durable: jsConsumer, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: pending,
	})
	if err != nil {
		return fmt.Errorf("bench: jetstream consumer: %w", jsErr(err))
	}
	nc, err := d.connect("bench-worker")
	if err != nil {
		return err
	}
	wjs, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("bench: jetstream: %w", err)
	}
	cons, err := wjs.Consumer(ctx, streamName(name), jsConsumer)
	if err != nil {
		return fmt.Errorf("bench: jetstream consumer: %w", err)
	}
	_, err = cons.Consume(func(m jetstream.Msg) { fn(jsDelivery{m}) })
	if err != nil {
		return fmt.Errorf("bench: jetstream consume: %w", err)
	}
	return nil
}

// depth is the stream's message count: with work-queue retention, acked
// messages leave it and unacked ones stay.
func (d *natsDriver) depth(ctx context.Context, name string) (int64, error) {
	js, err := d.jetStream()
	if err != nil {
		return 0, err
	}
	s, err := js.Stream(ctx, streamName(name))
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int64(info.State.Msgs), nil
}

func (d *natsDriver) deleteQueue(ctx context.Context, name string) error {
	js, err := d.jetStream()
	if err != nil {
		return err
	}
	return js.DeleteStream(ctx, streamName(name))
}
