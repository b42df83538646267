package bench

import (
	"context"
	"fmt"
	"os"
)

// driver speaks to one kind of broker. A driver is used from one
// goroutine except where a method says otherwise.
type driver interface {
	// serve attaches the request-response handler, on a connection of its
	// own, answering every request with pong.
	serve(ctx context.Context, pong []byte) error
	// requester returns a requester for one goroutine. Requesters share
	// one connection where the client library allows it.
	requester(ctx context.Context) (requester, error)
	// subscribe attaches n subscribers, each on its own connection, and
	// returns once all of them receive. fn is called with the
	// subscriber's index, from one goroutine per subscriber.
	subscribe(ctx context.Context, n int, fn func(sub int, body []byte)) error
	// publisher returns the pub-sub publisher, on a connection of its own.
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

// newDriver returns the driver of the target.
func newDriver(ctx context.Context, cfg *Config) (driver, error) {
	switch cfg.Target.Kind {
	case KindEmbedded, KindCourier:
		return newCourierDriver(ctx, cfg)
	case KindNATS:
		return newNATSDriver(cfg), nil
	case KindAMQP:
		return newAMQPDriver(cfg), nil
	}
	return nil, fmt.Errorf("bench: unknown target kind %q", cfg.Target.Kind)
}

// names returns the exchange, subject or queue names of one run: unique
// per process, so that runs against one server do not see each other.
func names(what string) string {
	return fmt.Sprintf("bench.%s.%d", what, os.Getpid())
}
