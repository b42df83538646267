package bench

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
)

// driver speaks to one kind of broker. A driver is used from one
// goroutine except where a method says otherwise.
type driver interface {
	// serve attaches n request-response handlers, each on a connection
	// of its own, sharing the requests and answering each with pong.
	serve(ctx context.Context, n int, pong []byte) error
	// requester returns a requester for one goroutine. Requesters share
	// one connection where the client library allows it.
	requester(ctx context.Context) (requester, error)
	// subscribe attaches n subscribers, each on its own connection, and
	// returns once all of them receive. fn is called with the
	// subscriber's index, from one goroutine per subscriber.
	subscribe(ctx context.Context, n int, fn func(sub int, body []byte)) error
	// publisher returns a pub-sub publisher, on a connection of its own.
	// Safe for concurrent use.
	publisher(ctx context.Context) (publisher, error)
	// notes returns what the report should say about the run, such as
	// slow-consumer errors the client saw. Safe for concurrent use.
	notes() []string
	// close ends every connection (and the embedded node).
	close() error
}

// requester sends requests and waits for their responses.
type requester interface {
	// request sends body and checks that the response is pong.
	request(ctx context.Context, body []byte) error
	close() error
}

// publisher publishes pub-sub messages.
type publisher interface {
	// publish sends body to every subscriber; it may keep body.
	publish(ctx context.Context, body []byte) error
	// flush returns once everything published has left the client.
	flush(ctx context.Context) error
}

// userDriver is a driver's optional capability for the users scenario:
// one connection per simulated user.
type userDriver interface {
	// user connects simulated user i on a connection of its own, able
	// to request from serve's handlers, and subscribes it to the
	// messages published under keys (its own key, or its rooms'); fn is
	// called with each, from one goroutine per user. Safe for
	// concurrent use.
	user(ctx context.Context, i int, keys []string, fn func(body []byte)) (userConn, error)
}

// userConn is one simulated user's connection, used from one goroutine.
type userConn interface {
	// request sends body to the handlers and waits for the response.
	request(ctx context.Context, body []byte) error
	// publish sends body under key (a user's or a room's).
	publish(ctx context.Context, key string, body []byte) error
	close() error
}

// newDriver returns the driver of the target.
func newDriver(ctx context.Context, cfg *Config) (driver, error) {
	switch cfg.Target.Kind {
	case KindEmbedded, KindCourier:
		return newCourierDriver(ctx, cfg)
	case KindNATS:
		return newNATSDriver(cfg), nil
	case KindAMQP:
		return newAMQPDriver(cfg), nil
	case KindEcho:
		return newEchoDriver(cfg), nil
	}
	return nil, fmt.Errorf("bench: unknown target kind %q", cfg.Target.Kind)
}

// openDriver returns the target's driver and a func that closes it and
// keeps its notes in the report.
func openDriver(ctx context.Context, cfg *Config, rep *Report) (driver, func(), error) {
	d, err := newDriver(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	return d, func() {
		rep.Notes = append(rep.Notes, d.notes()...)
		d.close()
	}, nil
}

// names returns the exchange, subject or queue names of one run: unique
// per process, so that runs against one server do not see each other.
func names(what string) string {
	return fmt.Sprintf("bench.%s.%d", what, os.Getpid())
}

// setupWorkers bounds the connections forEach opens at a time.
const setupWorkers = 8

// forEach calls fn for 0 first, then for 1 to n-1 from setupWorkers
// goroutines, so that ten thousand subscribers connect in seconds rather
// than one round trip after another. It returns the first error and
// stops handing out indexes after it.
func forEach(ctx context.Context, n int, fn func(i int) error) error {
	if n <= 0 {
		return nil
	}
	if err := fn(0); err != nil {
		return err
	}
	var (
		next  atomic.Int64
		once  sync.Once
		first error
		wg    sync.WaitGroup
	)
	next.Store(1)
	for range min(setupWorkers, n-1) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
					next.Store(int64(n))
					return
				}
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}
