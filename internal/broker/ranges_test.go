package broker

import (
	"testing"
	"time"

	"github.com/courier-mq/courier/wire"
)

// TestQueueConfigCapsDurations: a definition stored before durations
// were checked (issue 12, finding 9) is brought back with its durations
// capped at wire.MaxDurationMS, never wrapped: a backoff of 2^62 ms was
// 0 (twenty redeliveries at once), a TTL of 2^62 ms none at all.
func TestQueueConfigCapsDurations(t *testing.T) {
	const huge = 1 << 62
	max := time.Duration(wire.MaxDurationMS) * time.Millisecond
	for _, c := range []struct {
		cfg                  wire.ExchangeConfig
		ttl, backoff, capped time.Duration
	}{
		{wire.ExchangeConfig{TTLMS: huge}, max, 100 * time.Millisecond, 30 * time.Second},
		{wire.ExchangeConfig{BackoffMS: huge}, 0, max, max},
		{wire.ExchangeConfig{BackoffMS: huge, BackoffMaxMS: huge}, 0, max, max},
		{wire.ExchangeConfig{TTLMS: 1500, BackoffMS: 10, BackoffMaxMS: 20}, 1500 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond},
	} {
		qc, err := queueConfig(c.cfg)
		if err != nil {
			t.Fatalf("%+v: %v", c.cfg, err)
		}
		if qc.TTL != c.ttl || qc.BackoffBase != c.backoff || qc.BackoffMax != c.capped {
			t.Errorf("%+v: ttl %v backoff %v..%v, want %v, %v..%v", c.cfg, qc.TTL, qc.BackoffBase, qc.BackoffMax, c.ttl, c.backoff, c.capped)
		}
	}
}

// TestTaskMessageDue: a SUBMIT's due time may lie at most
// wire.MaxDurationMS ahead.
func TestTaskMessageDue(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		due time.Time
		bad bool
	}{
		{now.Add(time.Hour), false},
		{now.Add(-time.Hour), false},
		{now.Add(9 * 365 * 24 * time.Hour), false},
		{now.Add(11 * 365 * 24 * time.Hour), true},
	} {
		f := wire.NewFrame(wire.TypeSubmit)
		f.Tag = wire.TaskOptions{DueMS: c.due.UnixMilli()}.Tag()
		m, err := taskMessage(f)
		if (err != nil) != c.bad {
			t.Errorf("due %v: error %v, want bad %v", c.due, err, c.bad)
		}
		if err == nil && !m.DueAt.Equal(time.UnixMilli(c.due.UnixMilli())) {
			t.Errorf("due %v: DueAt %v", c.due, m.DueAt)
		}
	}
}
