package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsDriver runs scenarios on NATS core: request-reply with
// Subscribe + Msg.Respond and Conn.Request, pub-sub on a plain subject.
// Core NATS is at-most-once: a subscriber that falls behind loses
// messages (client pending limits, or the server cutting a slow consumer).
// The durable-queue scenarios run on JetStream (jetstream.go).
type natsDriver struct {
	cfg *Config

	eventCounts // errors and disconnects seen, by text

	mu         sync.Mutex // guards conns, reqConn, pong, js, ackPending
	conns      []*nats.Conn
	reqConn    *nats.Conn
	pong       []byte
	js         jetstream.JetStream // declares, inspects and deletes streams
	ackPending int                 // the durable consumer's MaxAckPending
}

var _ driver = (*natsDriver)(nil)

func newNATSDriver(cfg *Config) *natsDriver {
	return &natsDriver{cfg: cfg}
}

func (d *natsDriver) connect(name string) (*nats.Conn, error) {
	return d.connectTo(d.cfg.Target.URL, name)
}

// connectTo connects to the server at url, such as another server of
// the target's cluster: a spread run stays spread, as the client
// connects to the first URL of its pool (kept first by DontRandomize).
func (d *natsDriver) connectTo(url, name string) (*nats.Conn, error) {
	nc, err := nats.Connect(url,
		nats.DontRandomize(),
		nats.Name(name),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			d.event(name + ": " + err.Error())
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				d.event(name + ": disconnected: " + err.Error())
			}
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("bench: connect to %s: %w", redact(url), err)
	}
	d.mu.Lock()
	d.conns = append(d.conns, nc)
	d.mu.Unlock()
	return nc, nil
}

func (d *natsDriver) serve(ctx context.Context, n int, pong []byte) error {
	// A queue group shares the requests among the handlers.
	for i := range n {
		hc, err := d.connectTo(d.cfg.handlerURL(), fmt.Sprintf("bench-handler-%d", i))
		if err != nil {
			return err
		}
		if _, err := hc.QueueSubscribe(names("reqresp"), "handlers", func(m *nats.Msg) { m.Respond(pong) }); err != nil {
			return fmt.Errorf("bench: subscribe handler: %w", err)
		}
		// The subscription is in place once the server answered a PING.
		if err := hc.FlushWithContext(ctx); err != nil {
			return fmt.Errorf("bench: flush: %w", err)
		}
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

type natsRequester struct {
	nc      *nats.Conn
	subject string
	pong    []byte
}

func (d *natsDriver) requester(ctx context.Context) (requester, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.reqConn == nil {
		return nil, errors.New("bench: requester before serve")
	}
	return &natsRequester{nc: d.reqConn, subject: names("reqresp"), pong: d.pong}, nil
}

func (r *natsRequester) request(ctx context.Context, body []byte) error {
	m, err := r.nc.RequestWithContext(ctx, r.subject, body)
	if err != nil {
		return err
	}
	if !bytes.Equal(m.Data, r.pong) {
		return fmt.Errorf("bench: unexpected response %.20q", m.Data)
	}
	return nil
}

func (r *natsRequester) close() error { return nil }

func (d *natsDriver) subscribe(ctx context.Context, n int, fn func(int, []byte)) error {
	subject := names("pubsub")
	return forEach(ctx, n, func(i int) error {
		nc, err := d.connectTo(d.cfg.subscriberURL(i), fmt.Sprintf("bench-sub-%d", i))
		if err != nil {
			return err
		}
		sub, err := nc.Subscribe(subject, func(m *nats.Msg) { fn(i, m.Data) })
		if err != nil {
			return fmt.Errorf("bench: subscribe: %w", err)
		}
		// Generous client-side limits (the defaults are 512Ki messages and
		// 64 MiB): a subscriber that falls behind then loses messages only
		// where the server cuts it off.
		if err := sub.SetPendingLimits(10_000_000, 2<<30); err != nil {
			return fmt.Errorf("bench: pending limits: %w", err)
		}
		if err := nc.FlushWithContext(ctx); err != nil {
			return fmt.Errorf("bench: flush: %w", err)
		}
		return nil
	})
}

type natsPublisher struct {
	nc      *nats.Conn
	subject string
}

func (d *natsDriver) publisher(ctx context.Context) (publisher, error) {
	nc, err := d.connect("bench-publisher")
	if err != nil {
		return nil, err
	}
	return &natsPublisher{nc: nc, subject: names("pubsub")}, nil
}

func (p *natsPublisher) publish(ctx context.Context, body []byte) error {
	return p.nc.Publish(p.subject, body)
}

func (p *natsPublisher) flush(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return p.nc.FlushWithContext(ctx)
}

// natsUser is a simulated user: a connection of its own, subscribed to
// the subject "bench.users.<pid>.user.<i>".
type natsUser struct {
	nc  *nats.Conn
	req natsRequester
}

var _ userDriver = (*natsDriver)(nil)

func (d *natsDriver) user(ctx context.Context, i int, keys []string, fn func([]byte)) (userConn, error) {
	d.mu.Lock()
	pong := d.pong
	d.mu.Unlock()
	nc, err := d.connect(fmt.Sprintf("bench-user-%d", i))
	if err != nil {
		return nil, err
	}
	for _, k := range keys {
		if _, err := nc.Subscribe(names("users")+"."+k, func(m *nats.Msg) { fn(m.Data) }); err != nil {
			return nil, fmt.Errorf("bench: user %d: subscribe: %w", i, err)
		}
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		return nil, fmt.Errorf("bench: user %d: flush: %w", i, err)
	}
	return &natsUser{nc: nc, req: natsRequester{nc: nc, subject: names("reqresp"), pong: pong}}, nil
}

func (u *natsUser) request(ctx context.Context, body []byte) error { return u.req.request(ctx, body) }

func (u *natsUser) publish(ctx context.Context, key string, body []byte) error {
	return u.nc.Publish(names("users")+"."+key, body)
}

func (u *natsUser) close() error { u.nc.Close(); return nil }

func (d *natsDriver) close() error {
	d.mu.Lock()
	conns := d.conns
	d.conns = nil
	d.mu.Unlock()
	for _, nc := range conns {
		nc.Close()
	}
	return nil
}
