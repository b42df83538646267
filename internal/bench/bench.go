// Package bench is Courier's load generator: it runs the same scenario
// against Courier (an embedded node or a server), NATS and RabbitMQ, so
// that their figures compare on one machine in one run.
//
// Two scenarios exist:
//
//   - Request-response ([RunReqResp]): one handler answers "ping" with
//     "pong". Sequential runs time one requester; parallel runs share a
//     count of cycles among P goroutines. The output keeps the classic
//     lines of the Erlang messaging layer's benchmark,
//     "Sequential 100000 cycles in ~4 seconds (26957 cycles/s)", and adds
//     latency percentiles (HDR histogram) and the CPU time the broker and
//     the client spent per cycle.
//   - Publish-subscribe fan-out ([RunPubSub]): one publisher, N
//     subscribers each on its own connection; published and delivered
//     rates, and how many deliveries were lost.
//
// A target is chosen by URL ([ParseTarget]):
//
//	(none)                          Courier node embedded in this process
//	courier://127.0.0.1:7400        Courier server (client.Dial)
//	nats://127.0.0.1:4222           NATS core (nats.go)
//	amqp://guest:guest@127.0.0.1:5672/  RabbitMQ (amqp091-go)
//
// The broker's CPU time comes from /proc/<pid>/stat of the process that
// listens on the target's port; for an embedded node it is the whole
// process, broker and client together. Every run is bounded in count and
// by the context's deadline.
package bench

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Kind is the kind of broker a [Target] names.
type Kind string

// Target kinds.
const (
	KindEmbedded Kind = "courier-embedded"
	KindCourier  Kind = "courier"
	KindNATS     Kind = "nats"
	KindAMQP     Kind = "amqp"
)

// Target is the broker a scenario runs against.
type Target struct {
	Kind Kind
	// URL is the address of a network target; empty for an embedded node.
	URL string
}

// ParseTarget returns the target a URL names; an empty URL is an embedded
// Courier node. Schemes: courier, nats, amqp and amqps.
func ParseTarget(raw string) (Target, error) {
	if raw == "" {
		return Target{Kind: KindEmbedded}, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return Target{}, fmt.Errorf("bench: target %q: %w", raw, err)
	}
	switch u.Scheme {
	case "courier":
		return Target{Kind: KindCourier, URL: raw}, nil
	case "nats":
		return Target{Kind: KindNATS, URL: raw}, nil
	case "amqp", "amqps":
		return Target{Kind: KindAMQP, URL: raw}, nil
	}
	return Target{}, fmt.Errorf("bench: target %q: scheme must be courier, nats or amqp", raw)
}

// String describes the target for reports, without credentials.
func (t Target) String() string {
	switch t.Kind {
	case KindEmbedded:
		return "Courier embedded node"
	case KindCourier:
		return "Courier server at " + redact(t.URL)
	case KindNATS:
		return "NATS at " + redact(t.URL)
	case KindAMQP:
		return "RabbitMQ at " + redact(t.URL)
	}
	return string(t.Kind)
}

// port returns the TCP port of a network target, with the scheme's
// default.
func (t Target) port() (int, error) {
	u, err := url.Parse(t.URL)
	if err != nil {
		return 0, err
	}
	p := u.Port()
	if p == "" {
		switch t.Kind {
		case KindCourier:
			return 7400, nil
		case KindNATS:
			return 4222, nil
		case KindAMQP:
			if u.Scheme == "amqps" {
				return 5671, nil
			}
			return 5672, nil
		}
		return 0, fmt.Errorf("bench: %s: no port", t.URL)
	}
	return strconv.Atoi(p)
}

// local reports whether a network target's host is on this machine by
// its name (loopback or localhost).
func (t Target) local() bool {
	u, err := url.Parse(t.URL)
	if err != nil {
		return false
	}
	h := u.Hostname()
	if h == "localhost" || h == "" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	return u.Redacted()
}

// Config configures a scenario. The zero value of a field means its
// default.
type Config struct {
	// Target is the broker to measure. Default: an embedded node.
	Target Target
	// Counts are the cycle counts of the sequential request-response
	// runs. Default: 10000, 20000, 100000.
	Counts []int
	// Parallel lists the numbers of requesting goroutines of the parallel
	// runs. Default: 2, 4, 10, 100.
	Parallel []int
	// ParallelCount is the cycle count each parallel run shares among its
	// goroutines. Default: the largest of Counts.
	ParallelCount int
	// Warmup is the number of request-response cycles run, and not
	// counted, before the first run. Default: 1000; negative for none.
	Warmup int
	// Size is the body size in bytes: the request's (and the response's)
	// in request-response, the message's in pub-sub. Default: 4 ("ping")
	// for request-response, 128 for pub-sub.
	Size int
	// Subscribers is the number of pub-sub subscribers, each on its own
	// connection. Default: 10.
	Subscribers int
	// Messages is the number of messages published. Default: 1000000.
	Messages int
	// Drain is how long the pub-sub scenario waits, once everything is
	// published, for deliveries that have stopped coming before it counts
	// the rest as lost. Default: 3s.
	Drain time.Duration
	// ServerPID, if not 0, is the broker's process for CPU and memory
	// figures, instead of the one found listening on the target's port.
	ServerPID int
	// Progress, if set, is called every 200ms or so from one goroutine
	// with what the scenario is doing and how far it is. It must not
	// block.
	Progress func(stage string, done, total int64)
	// DataDir is the embedded node's data directory. Default: a new
	// temporary directory, removed afterwards.
	DataDir string
	// Log receives the brokers' and clients' logs. Default: discarded.
	Log *slog.Logger
}

func (c Config) withDefaults(pubsub bool) Config {
	if len(c.Counts) == 0 {
		c.Counts = []int{10000, 20000, 100000}
	}
	if c.Parallel == nil {
		c.Parallel = []int{2, 4, 10, 100}
	}
	if c.ParallelCount == 0 {
		for _, n := range c.Counts {
			c.ParallelCount = max(c.ParallelCount, n)
		}
	}
	if c.Warmup == 0 {
		c.Warmup = 1000
	}
	if c.Size == 0 {
		c.Size = 4
		if pubsub {
			c.Size = 128
		}
	}
	if c.Subscribers == 0 {
		c.Subscribers = 10
	}
	if c.Messages == 0 {
		c.Messages = 1000000
	}
	if c.Drain == 0 {
		c.Drain = 3 * time.Second
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks the configuration.
func (c Config) Validate() error {
	for _, n := range c.Counts {
		if n <= 0 {
			return fmt.Errorf("bench: counts must be positive, got %d", n)
		}
	}
	for _, p := range c.Parallel {
		if p <= 0 {
			return fmt.Errorf("bench: parallel must be positive, got %d", p)
		}
	}
	switch {
	case c.ParallelCount < 0:
		return fmt.Errorf("bench: parallel count must be positive, got %d", c.ParallelCount)
	case c.Size < 0:
		return fmt.Errorf("bench: size must be positive, got %d", c.Size)
	case c.Subscribers < 0:
		return fmt.Errorf("bench: subscribers must be positive, got %d", c.Subscribers)
	case c.Messages < 0:
		return fmt.Errorf("bench: messages must be positive, got %d", c.Messages)
	}
	return nil
}

// progress reports a counter to cfg.Progress every 200ms until stop is
// called.
func progress(cfg *Config, stage string, done func() int64, total int64) (stop func()) {
	if cfg.Progress == nil {
		return func() {}
	}
	quit := make(chan struct{})
	finished := make(chan struct{})
	cfg.Progress(stage, done(), total)
	go func() {
		defer close(finished)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				cfg.Progress(stage, done(), total)
			case <-quit:
				cfg.Progress(stage, done(), total)
				return
			}
		}
	}()
	return func() { close(quit); <-finished }
}

// body returns size bytes that start with word (as much of it as fits)
// and are padded with '.'.
func body(word string, size int) []byte {
	b := []byte(strings.Repeat(".", size))
	copy(b, word)
	return b
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
