// Package bench is Courier's load generator: it runs the same scenario
// against Courier (an embedded node or a server), NATS and RabbitMQ, so
// that their figures compare on one machine in one run.
//
// The scenarios ([Scenarios]) share their settings ([Config]: size,
// count or duration, publishers, subscribers, workers, rate, warm-up):
//
//   - Request-response ([RunReqResp]): handlers answer "ping" with
//     "pong". Sequential runs time one requester; parallel runs share a
//     count of cycles among P goroutines. The output keeps the classic
//     lines of the Erlang messaging layer's benchmark,
//     "Sequential 100000 cycles in ~4 seconds (26957 cycles/s)".
//   - Publish-subscribe ([RunPubSub]): fan-out (one publisher, N
//     subscribers) or fan-in (N publishers, one subscriber), each on its
//     own connection; published and delivered rates, losses, reordering
//     and delivery latency.
//   - Many users ([RunUsers]), in the manner of Amoc: users ramped up,
//     each on its own connection, requesting and publishing at a rate;
//     one line per interval, and where the server fell behind.
//   - The management API under load ([RunMgmt], Courier only): N durable
//     queues, hot ones loaded, the rest trickled to, while
//     GET /api/queues?columns=name,messages_ready is polled, timed and
//     checked for exact depths.
//   - Durable tasks ([RunTasks]): one producer of persistent messages
//     with pipelined publisher confirms, workers with a prefetch that ack
//     each; produce and consume rates, confirm and end-to-end latency.
//   - Backlog ([RunBacklog]), the classic persister stress test: publish
//     two, receive and ack one, so that the queue grows by one message
//     per iteration; the server's memory every so many iterations.
//
// Every scenario samples its run every interval ([Sample]): rates,
// latency percentiles (HDR histogram), the server's CPU and resident
// memory, and this process's CPU; [WritePlot] draws them. [Compare] runs
// scenarios against several targets and tabulates the ratios.
//
// A target is chosen by URL ([ParseTarget]):
//
//	(none)                          Courier node embedded in this process
//	courier://127.0.0.1:7400        Courier server (client.Dial)
//	nats://127.0.0.1:4222           NATS core (nats.go); JetStream for
//	                                tasks and backlog
//	amqp://guest:guest@127.0.0.1:5672/  RabbitMQ (amqp091-go)
//	echo://                         no broker: an in-process echo that
//	                                shows what the harness sustains
//
// The broker's CPU time comes from /proc/<pid>/stat of the process that
// listens on the target's port; for an embedded node it is the whole
// process, broker and client together. Every run is bounded in count or
// time, and by the context's deadline.
package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
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
	// KindEcho is no broker: an in-process echo that answers requests
	// and hands messages to subscribers directly, to show what the load
	// generator itself sustains.
	KindEcho Kind = "echo"
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
	case "echo":
		return Target{Kind: KindEcho}, nil
	}
	return Target{}, fmt.Errorf("bench: target %q: scheme must be courier, nats, amqp or echo", raw)
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
		return "AMQP at " + redact(t.URL)
	case KindEcho:
		return "in-process echo (no broker)"
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
// default. The shared settings (Size, Count, Duration, Publishers,
// Subscribers, Workers, Rate, Warmup) mean the same in every scenario
// that uses them; see [Scenario.Uses].
type Config struct {
	// Target is the broker to measure. Default: an embedded node.
	Target Target

	// Size is the body size in bytes: the request's (and the response's)
	// in request-response, the message's in pub-sub, users, tasks and
	// backlog. Default: 4 ("ping") for request-response, 128 for pub-sub,
	// 64 for users, 1024 for tasks and backlog.
	Size int
	// Count is the number of messages published in pub-sub (shared by
	// the publishers), of tasks submitted in tasks. Default: 1000000, or
	// no limit with a Duration.
	Count int
	// Duration, if set, bounds each run by time: a run ends when its
	// count is done or its time is over, whichever comes first. In
	// request-response it replaces the default counts: one sequential
	// run and each parallel run last Duration. Users: the whole run.
	Duration time.Duration
	// Publishers is the number of pub-sub publishers, each on its own
	// connection. Default: 1.
	Publishers int
	// Subscribers is the number of pub-sub subscribers, each on its own
	// connection. Default: 10 with one publisher, else 1 (fan-in).
	Subscribers int
	// Workers is the number of request handlers, each on its own
	// connection, sharing the requests round-robin; in tasks, of workers
	// sharing the tasks. Default: 1 for request-response and tasks, 2
	// for users.
	Workers int
	// Rate, if above 0, is the offered rate in requests or messages per
	// second, shared by the requesters or publishers; each keeps to its
	// schedule open loop and latency counts from when a message was due.
	// Default: as fast as the broker takes them.
	Rate float64
	// Warmup is the number of cycles (or messages) run, and not counted,
	// before measuring. Default: 1000; negative for none.
	Warmup int
	// Interval is how often the run is sampled for its time series
	// (rates, latencies, CPU and memory over time). Default: 1s.
	Interval time.Duration

	// Counts are the cycle counts of the sequential request-response
	// runs. Default: 10000, 20000, 100000.
	Counts []int
	// Parallel lists the numbers of requesting goroutines of the parallel
	// runs. Default: 2, 4, 10, 100.
	Parallel []int
	// ParallelCount is the cycle count each parallel run shares among its
	// goroutines. Default: the largest of Counts.
	ParallelCount int
	// Drain is how long the pub-sub and tasks scenarios wait, once
	// everything is published, for deliveries that have stopped coming
	// before they count the rest as lost. Default: 3s.
	Drain time.Duration

	// Users configures the users scenario.
	Users UsersConfig
	// Mgmt configures the mgmt scenario.
	Mgmt MgmtConfig
	// Queue configures the tasks and backlog scenarios.
	Queue QueueConfig

	// HandlerURL, if set, is where the request-response handlers
	// connect: a URL of the same broker kind as Target, such as another
	// node of a cluster. The requesters stay on Target, so that each
	// request crosses from the requester's node to the handler's. For
	// NATS, the responders subscribe on this server and the requests
	// are sent to Target's.
	HandlerURL string
	// EmbeddedCross, with an embedded target, runs two embedded nodes
	// joined as a cluster in this process (node.ClusterConfig on
	// 127.0.0.1:0): the requesters connect to the first, the
	// request-response handlers to the second, so that each request
	// crosses a node link there and back without a client socket.
	EmbeddedCross bool
	// SubscriberURLs, if set, are where the pub-sub subscribers
	// connect, spread round-robin: subscriber i on
	// SubscriberURLs[i%len(SubscriberURLs)]. The publishers stay on
	// Target. URLs of the same broker kind as Target.
	SubscriberURLs []string
	// NodesHTTP, for a Courier target, are the management API base URLs
	// of a cluster's nodes (such as http://127.0.0.1:7481): the pub-sub
	// scenario reads the link counters of each node's GET /api/nodes
	// before and after 20 publications and an idle window ([LinkReport]).
	NodesHTTP []string

	// ServerPID, if not 0, is the broker's process for CPU and memory
	// figures, instead of the ones found listening on the ports of
	// Target, HandlerURL and SubscriberURLs (whose figures are summed).
	ServerPID int
	// Progress, if set, is called every 200ms or so from one goroutine
	// with what the scenario is doing and how far it is; total is -1
	// for a run bounded by time. It must not block.
	Progress func(stage string, done, total int64)
	// DataDir is the embedded node's data directory. Default: a new
	// temporary directory, removed afterwards.
	DataDir string
	// Log receives the brokers' and clients' logs. Default: discarded.
	Log *slog.Logger

	// embeddedHTTP, if set, is the embedded node's management listener
	// (the mgmt scenario polls it).
	embeddedHTTP string
}

func (c Config) withDefaults(scenario string) Config {
	if c.Target.Kind == "" {
		c.Target.Kind = KindEmbedded
	}
	if len(c.Counts) == 0 {
		c.Counts = []int{10000, 20000, 100000}
		if c.Duration > 0 {
			c.Counts = []int{0} // one sequential run, bounded by time
		}
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
		switch scenario {
		case "pubsub":
			c.Size = 128
		case "users":
			c.Size = 64
		case "mgmt":
			c.Size = 256
		case "tasks", "backlog":
			c.Size = 1024
		default:
			c.Size = 4
		}
	}
	if c.Publishers == 0 {
		c.Publishers = 1
		if scenario == "mgmt" {
			c.Publishers = 2
		}
	}
	if c.Subscribers == 0 {
		c.Subscribers = 1
		if c.Publishers == 1 {
			c.Subscribers = 10
		}
	}
	if c.Workers == 0 {
		c.Workers = 1
		if scenario == "users" || scenario == "mgmt" {
			c.Workers = 2
		}
	}
	if c.Count == 0 && c.Duration == 0 {
		c.Count = 1000000
	}
	if c.Interval == 0 {
		c.Interval = time.Second
	}
	if c.Drain == 0 {
		c.Drain = 3 * time.Second
	}
	c.Users = c.Users.withDefaults()
	if scenario == "mgmt" {
		c.Mgmt = c.Mgmt.withDefaults(c.Target.Kind)
	}
	c.Queue = c.Queue.withDefaults(scenario)
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks the configuration.
func (c Config) Validate() error {
	for _, n := range c.Counts {
		if n < 0 {
			return fmt.Errorf("bench: counts must be positive, got %d", n)
		}
		if n == 0 && c.Duration == 0 && len(c.Counts) > 0 {
			return errors.New("bench: a count of 0 needs a duration")
		}
	}
	for _, p := range c.Parallel {
		if p <= 0 {
			return fmt.Errorf("bench: parallel must be positive, got %d", p)
		}
	}
	for _, f := range []struct {
		name     string
		negative bool
		value    any
	}{
		{"parallel count", c.ParallelCount < 0, c.ParallelCount},
		{"size", c.Size < 0, c.Size},
		{"count", c.Count < 0, c.Count},
		{"duration", c.Duration < 0, c.Duration},
		{"publishers", c.Publishers < 0, c.Publishers},
		{"subscribers", c.Subscribers < 0, c.Subscribers},
		{"workers", c.Workers < 0, c.Workers},
		{"rate", c.Rate < 0, c.Rate},
		{"interval", c.Interval < 0, c.Interval},
	} {
		if f.negative {
			return fmt.Errorf("bench: %s must be positive, got %v", f.name, f.value)
		}
	}
	switch {
	case c.Publishers > maxConns || c.Subscribers > maxConns || c.Workers > maxConns:
		return fmt.Errorf("bench: at most %d publishers, subscribers or workers", maxConns)
	}
	if err := c.validateNodes(); err != nil {
		return err
	}
	if err := c.Mgmt.validate(); err != nil {
		return err
	}
	if err := c.Queue.validate(); err != nil {
		return err
	}
	return c.Users.validate()
}

// validateNodes checks HandlerURL, SubscriberURLs and NodesHTTP: only
// with a Courier server or NATS target, and of the target's kind.
func (c Config) validateNodes() error {
	if c.EmbeddedCross && c.Target.Kind != KindEmbedded {
		return fmt.Errorf("bench: two embedded nodes (--embedded-cross) run in this process, not against %s", c.Target)
	}
	urls := c.SubscriberURLs
	if c.HandlerURL != "" {
		urls = append([]string{c.HandlerURL}, urls...)
	}
	if len(urls) == 0 && len(c.NodesHTTP) == 0 {
		return nil
	}
	if c.Target.Kind != KindCourier && c.Target.Kind != KindNATS {
		return fmt.Errorf("bench: handler and subscriber URLs and --nodes-http are for Courier servers and NATS, not %s", c.Target)
	}
	for _, raw := range urls {
		t, err := ParseTarget(raw)
		if err != nil {
			return err
		}
		if t.Kind != c.Target.Kind {
			return fmt.Errorf("bench: %s is not of the target's kind (%s)", redact(raw), c.Target.Kind)
		}
	}
	if len(c.NodesHTTP) > 0 && c.Target.Kind != KindCourier {
		return fmt.Errorf("bench: --nodes-http reads Courier's management API; %s has none", c.Target)
	}
	for _, raw := range c.NodesHTTP {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("bench: management URL %q: want one such as http://127.0.0.1:7481", raw)
		}
	}
	return nil
}

// spread reports whether the run's clients are spread over several
// servers (a cluster), which then need time to learn each other's
// handlers and subscribers.
func (c Config) spread() bool {
	return c.HandlerURL != "" || len(c.SubscriberURLs) > 0 || c.EmbeddedCross
}

// subscriberURL is where subscriber i connects.
func (c Config) subscriberURL(i int) string {
	if len(c.SubscriberURLs) == 0 {
		return c.Target.URL
	}
	return c.SubscriberURLs[i%len(c.SubscriberURLs)]
}

// handlerURL is where the request handlers connect.
func (c Config) handlerURL() string {
	if c.HandlerURL == "" {
		return c.Target.URL
	}
	return c.HandlerURL
}

// serverURLs are the URLs of every server the run connects to, Target
// first, without repeats.
func (c Config) serverURLs() []string {
	out := []string{c.Target.URL}
	for _, u := range append([]string{c.HandlerURL}, c.SubscriberURLs...) {
		if u != "" && !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	return out
}

// maxConns bounds the connections a scenario opens of one kind.
const maxConns = 10000

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
