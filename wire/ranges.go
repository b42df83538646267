package wire

import (
	"errors"
	"fmt"
)

// Ranges of the numbers a client sends. Every duration a client gives
// in milliseconds is at most MaxDurationMS, so that the server's
// conversion to nanoseconds, and the sum with the current time, never
// overflow; docs/protocol.md gives each field's range where it describes
// the field.
const (
	// MaxDurationMS is the longest duration a client may give, in
	// milliseconds: 10 years of 365 days (315,360,000,000 ms). It bounds
	// ttl_ms, backoff_ms and backoff_max_ms of a task exchange, a task's
	// ttl and how far ahead its due time lies, a request's deadline and
	// the heartbeat_ms of HELLO.
	MaxDurationMS = 10 * 365 * 24 * 60 * 60 * 1000
	// MaxMaxAttempts is the largest max_attempts of a task exchange: a
	// task's attempts are counted in 32 bits.
	MaxMaxAttempts = 1<<31 - 1
	// MaxCount is the largest max_length and max_bytes of a task
	// exchange: 2⁵³−1, the largest integer a JSON number carries exactly
	// in every language.
	MaxCount = 1<<53 - 1
	// MaxPrefetch is the largest prefetch of an ATTACH, as AMQP's
	// prefetch-count.
	MaxPrefetch = 65535
	// MaxFrameHint bounds the max_frame of HELLO.
	MaxFrameHint = 1<<31 - 1
)

// errRange is wrapped by every range error of this file.
var errRange = errors.New("out of range")

// checkMS reports an error naming field unless 0 <= ms <= MaxDurationMS.
func checkMS(field string, ms int64) error {
	if ms < 0 || ms > MaxDurationMS {
		return fmt.Errorf("%s %d %w: 0 to %d ms (10 years)", field, ms, errRange, int64(MaxDurationMS))
	}
	return nil
}

// checkCount reports an error naming field unless lo <= n <= hi.
func checkCount(field string, n, lo, hi int64) error {
	if n < lo || n > hi {
		return fmt.Errorf("%s %d %w: %d to %d", field, n, errRange, lo, hi)
	}
	return nil
}

// Check validates the numbers of a task exchange's configuration
// against their ranges: max_attempts -1 to MaxMaxAttempts; ttl_ms,
// backoff_ms and backoff_max_ms 0 to MaxDurationMS; max_length and
// max_bytes 0 to MaxCount; replicas 0 to MaxReplicas. Zero values, which take the defaults, pass.
func (c *ExchangeConfig) Check() error {
	if err := checkCount("max_attempts", int64(c.MaxAttempts), -1, MaxMaxAttempts); err != nil {
		return err
	}
	for _, d := range []struct {
		field string
		ms    int64
	}{{"ttl_ms", c.TTLMS}, {"backoff_ms", c.BackoffMS}, {"backoff_max_ms", c.BackoffMaxMS}} {
		if err := checkMS(d.field, d.ms); err != nil {
			return err
		}
	}
	if err := checkCount("max_length", c.MaxLength, 0, MaxCount); err != nil {
		return err
	}
	if err := checkCount("dedup_window_ms", c.DedupWindowMS, -1, MaxDurationMS); err != nil {
		return err
	}
	if err := checkCount("replicas", int64(c.Replicas), 0, MaxReplicas); err != nil {
		return err
	}
	switch c.AMQPType {
	case "", "direct", "fanout", "topic", "headers":
	default:
		return fmt.Errorf("amqp_type %.40q: one of direct, fanout, topic, headers", c.AMQPType)
	}
	if c.AMQPType != "" && c.Pattern != PatternPubSub {
		return fmt.Errorf("amqp_type %q on a %s exchange: pub-sub exchanges only", c.AMQPType, c.Pattern)
	}
	return checkCount("max_bytes", c.MaxBytes, 0, MaxCount)
}

// Check validates the numbers of a HELLO: heartbeat_ms 0 to
// MaxDurationMS, max_frame 0 to MaxFrameHint.
func (h *Hello) Check() error {
	if err := checkMS("heartbeat_ms", int64(h.HeartbeatMS)); err != nil {
		return err
	}
	return checkCount("max_frame", int64(h.MaxFrame), 0, MaxFrameHint)
}
