package queue

import (
	"fmt"
	"io"
	"log/slog"
	"math"
	"time"
)

// MaxPriority is the highest message priority; priorities go from 0 (the
// default, lowest) to MaxPriority, as in RabbitMQ's priority queues.
const MaxPriority = 9

// numPriorities is the number of priority levels.
const numPriorities = MaxPriority + 1

// Config is a queue's definition and its collaborators. Start from
// [DefaultConfig]; [New] calls [Config.Validate]. The first group of
// fields is the queue's definition, which the broker persists with it;
// the second group plugs the queue into the node and is not persisted.
type Config struct {
	// MaxAttempts is how many times a message may fail (be nacked with
	// requeue, or be in flight with a consumer that went away) before it
	// is dead-lettered with [ReasonMaxAttempts] instead of requeued: a
	// message is delivered at most MaxAttempts times. 0 means no limit.
	// Default: 20 (RabbitMQ's quorum queue delivery limit).
	MaxAttempts int

	// TTL bounds how long a message may wait in the queue, counted from
	// when it becomes due (at once, or at its due time for a delayed
	// message). A message still waiting then is dead-lettered with
	// [ReasonExpired]. A message in flight does not expire; if it is
	// requeued past its expiry it is dead-lettered at once. A message's
	// own [Message.TTL] applies if it is shorter. 0 means no TTL.
	// Default: 0.
	TTL time.Duration

	// BackoffBase is the delay before a failed message is redelivered
	// the first time; it doubles with each further attempt up to
	// BackoffMax. 0 requeues at once. Default: 100ms.
	BackoffBase time.Duration

	// BackoffMax caps the backoff. It must not be below BackoffBase.
	// Default: 30s.
	BackoffMax time.Duration

	// BackoffJitter, between 0 and 1, shortens each backoff by a random
	// fraction up to BackoffJitter of it, so that the messages of a
	// consumer that died do not all come back at the same instant.
	// Default: 0.
	BackoffJitter float64

	// SingleActive makes only one consumer receive messages at a time:
	// the oldest attached; when it goes away the next oldest takes over
	// (see [Queue.Active] and OnActive). Default: false (consumers
	// compete, round-robin).
	SingleActive bool

	// Scheduler drives the queue's timers (delayed messages, backoff,
	// expiry). Share one among all the queues of a node. Default: nil,
	// meaning the package's shared scheduler on the real clock.
	Scheduler *Scheduler

	// Journal receives the records that make the queue durable. nil
	// makes a transient queue: nothing survives a restart, and publisher
	// confirms are immediate. Default: nil.
	Journal Journal

	// Memory is the node's memory budget, shared by its queues: the
	// queue reports what it keeps in RAM to it, and pages out (if it is
	// durable) as it fills; see [Memory]. nil: the queue still counts
	// its resident bytes ([Stats.Resident]) but never pages. Default:
	// nil.
	Memory *Memory

	// DeadLetter receives the messages that leave the queue without
	// being acked, with the reason; [ToQueue] makes one that moves them
	// to another queue. It is called without the queue's lock, in order,
	// and must not block for long. nil drops them (they are counted in
	// [Stats.DeadLettered]). Default: nil.
	DeadLetter func(DeadLetter)

	// OnActive is called, in single-active mode, whenever the active
	// consumer changes, with its id ("" when none is left), so that the
	// broker can announce it with its leader events. It is called without
	// the queue's lock and in order. Default: nil.
	OnActive func(consumer string)

	// DedupWindow is how long the queue remembers the (producer, seq)
	// of a message ([Message.Producer]) after its enqueue: a message
	// with the same pair within it is not stored again, and
	// [Queue.Enqueue] returns the first one's id. 0 means the default,
	// 2 minutes (JetStream's duplicate window); negative turns
	// deduplication off. See the package doc, "Deduplication".
	DedupWindow time.Duration

	// DedupMax bounds how many (producer, seq) pairs the window holds:
	// past it the oldest are forgotten before their time. 0 means the
	// default, 100,000.
	DedupMax int

	// Logger receives rare events: a journal that failed, a body that
	// could not be read back. Default: a logger that discards.
	Logger *slog.Logger
}

// DefaultConfig returns the defaults documented on each field.
func DefaultConfig() Config {
	return Config{
		MaxAttempts: 20,
		BackoffBase: 100 * time.Millisecond,
		BackoffMax:  30 * time.Second,
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.MaxAttempts < 0:
		return fmt.Errorf("%w: negative MaxAttempts %d", ErrBadConfig, c.MaxAttempts)
	case c.TTL < 0:
		return fmt.Errorf("%w: negative TTL %v", ErrBadConfig, c.TTL)
	case c.BackoffBase < 0:
		return fmt.Errorf("%w: negative BackoffBase %v", ErrBadConfig, c.BackoffBase)
	case c.BackoffMax < c.BackoffBase:
		return fmt.Errorf("%w: BackoffMax %v below BackoffBase %v", ErrBadConfig, c.BackoffMax, c.BackoffBase)
	case c.DedupMax < 0:
		return fmt.Errorf("%w: negative DedupMax %d", ErrBadConfig, c.DedupMax)
	case !(c.BackoffJitter >= 0 && c.BackoffJitter <= 1): // also refuses NaN
		return fmt.Errorf("%w: BackoffJitter %v not in [0, 1]", ErrBadConfig, c.BackoffJitter)
	}
	return nil
}

// backoff is the delay before the attempts-th retry (attempts >= 1); r
// is a random number in [0, 1) for the jitter.
func (c *Config) backoff(attempts uint32, r float64) time.Duration {
	if c.BackoffBase <= 0 {
		return 0
	}
	d := c.BackoffBase
	for i := uint32(1); i < attempts && d < c.BackoffMax; i++ {
		if d > math.MaxInt64/2 {
			d = c.BackoffMax
			break
		}
		d *= 2
	}
	d = min(d, c.BackoffMax)
	if c.BackoffJitter > 0 {
		d -= time.Duration(float64(d) * c.BackoffJitter * r)
	}
	return d
}

var discardLogger = slog.New(slog.NewTextHandler(io.Discard, nil))
