package bench

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"sync/atomic"
	"time"
)

// PubSubResult is what the pub-sub fan-out scenario measured.
type PubSubResult struct {
	Scenario    string `json:"scenario"` // "pubsub"
	Target      string `json:"target"`
	Kind        Kind   `json:"kind"`
	Size        int    `json:"size"`
	Subscribers int    `json:"subscribers"`
	Messages    int    `json:"messages"`
	// Published messages, and the time from the first publish until the
	// publisher's flush returned.
	Published      int64   `json:"published"`
	PublishSeconds float64 `json:"publish_seconds"`
	PublishRate    float64 `json:"publish_per_s"`
	// Delivered counts deliveries across all subscribers, over the time
	// from the first publish to the last delivery (seen within 5ms).
	Expected       int64   `json:"expected"`
	Delivered      int64   `json:"delivered"`
	DeliverSeconds float64 `json:"deliver_seconds"`
	DeliverRate    float64 `json:"deliver_per_s"`
	// Lost is Expected - Delivered: deliveries that had not come when
	// they stopped coming (for Config.Drain) or the time ran out.
	Lost int64 `json:"lost"`
	// OutOfOrder counts deliveries with a sequence number not above the
	// subscriber's previous one.
	OutOfOrder int64 `json:"out_of_order"`
	// CPU is per delivered message.
	CPU     CPU      `json:"cpu_per_delivery"`
	Process Process  `json:"broker_process"`
	Notes   []string `json:"notes,omitempty"`
	Error   string   `json:"error,omitempty"`
}

// subCounter is one subscriber's tally, written by its goroutine only;
// padded so that subscribers do not share cache lines.
type subCounter struct {
	n    atomic.Int64
	ooo  atomic.Int64
	last uint64
	_    [40]byte
}

// RunPubSub runs the pub-sub fan-out scenario: cfg.Subscribers
// subscribers, each on its own connection, and one publisher that
// publishes cfg.Messages messages of cfg.Size bytes as fast as the
// broker takes them. Each message carries its sequence number, so that
// losses and reordering are counted. ctx bounds the whole scenario.
func RunPubSub(ctx context.Context, cfg Config) (*PubSubResult, error) {
	cfg = cfg.withDefaults(true)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	res := &PubSubResult{
		Scenario: "pubsub", Target: cfg.Target.String(), Kind: cfg.Target.Kind,
		Size: cfg.Size, Subscribers: cfg.Subscribers, Messages: cfg.Messages,
	}
	err := runPubSub(ctx, &cfg, res)
	if err != nil {
		res.Error = err.Error()
	}
	return res, err
}

func runPubSub(ctx context.Context, cfg *Config, res *PubSubResult) error {
	d, err := newDriver(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		res.Notes = append(res.Notes, d.notes()...)
		d.close()
	}()
	counters := make([]subCounter, cfg.Subscribers)
	seqd := cfg.Size >= 8
	err = d.subscribe(ctx, cfg.Subscribers, func(i int, b []byte) {
		c := &counters[i]
		if seqd && len(b) >= 8 {
			seq := binary.BigEndian.Uint64(b)
			if seq <= c.last {
				c.ooo.Add(1)
			}
			c.last = seq
		}
		c.n.Add(1)
	})
	if err != nil {
		return err
	}
	pub, err := d.publisher(ctx)
	if err != nil {
		return err
	}
	meter := newCPUMeter(cfg)
	defer func() { res.Process = meter.process() }()
	delivered := func() int64 {
		var n int64
		for i := range counters {
			n += counters[i].n.Load()
		}
		return n
	}

	// A publisher stuck in flow control is unblocked by closing its
	// connection when the time is up.
	publishing := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			d.close()
		case <-publishing:
		}
	}()
	var published atomic.Int64
	stop := progress(cfg, "Published", published.Load, int64(cfg.Messages))
	from := meter.sample()
	start := time.Now()
	pubErr := publishAll(ctx, cfg, pub, &published)
	pubElapsed := time.Since(start)
	close(publishing)
	stop()
	res.Published = published.Load()
	res.PublishSeconds = pubElapsed.Seconds()
	res.PublishRate = float64(res.Published) / pubElapsed.Seconds()
	res.Expected = res.Published * int64(cfg.Subscribers)

	// Wait for the deliveries until all came, none came for cfg.Drain,
	// or the time is up. A publisher that failed ends the wait at once.
	stop = progress(cfg, "Delivered", delivered, res.Expected)
	last, lastAt := delivered(), time.Now()
	if last == 0 {
		lastAt = start
	}
	tick := time.NewTicker(5 * time.Millisecond)
	for pubErr == nil && last < res.Expected && time.Since(lastAt) < cfg.Drain && ctx.Err() == nil {
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
		if n := delivered(); n != last {
			last, lastAt = n, time.Now()
		}
	}
	tick.Stop()
	stop()
	res.CPU = meter.per(from, meter.sample(), last)
	res.Delivered = last
	res.DeliverSeconds = lastAt.Sub(start).Seconds()
	if res.DeliverSeconds > 0 {
		res.DeliverRate = float64(last) / res.DeliverSeconds
	}
	res.Lost = res.Expected - last
	for i := range counters {
		res.OutOfOrder += counters[i].ooo.Load()
	}
	if res.Lost > 0 && ctx.Err() != nil {
		res.Notes = append(res.Notes, "the time ran out before every delivery came; the rest are counted as lost")
	}
	return pubErr
}

// publishAll publishes cfg.Messages messages, each with its sequence
// number in its first 8 bytes, and flushes; published counts them.
func publishAll(ctx context.Context, cfg *Config, pub publisher, published *atomic.Int64) error {
	seqd := cfg.Size >= 8
	var buf []byte
	for i := range cfg.Messages {
		if i&1023 == 0 && ctx.Err() != nil {
			return fmt.Errorf("bench: published %d of %d messages before the time ran out: %w", i, cfg.Messages, ctx.Err())
		}
		// A body of its own for every message: an embedded node passes
		// it to subscribers without copying. Cut from 64 KiB slabs.
		if len(buf) < cfg.Size {
			buf = make([]byte, max(64<<10, cfg.Size))
		}
		b := buf[:cfg.Size:cfg.Size]
		buf = buf[cfg.Size:]
		if seqd {
			binary.BigEndian.PutUint64(b, uint64(i+1))
		}
		if err := pub.publish(ctx, b); err != nil {
			if ctx.Err() != nil {
				// The connection was closed under the publisher because
				// the time ran out.
				return fmt.Errorf("bench: published %d of %d messages before the time ran out: %w", i, cfg.Messages, ctx.Err())
			}
			return fmt.Errorf("bench: publish %d: %w", i+1, err)
		}
		published.Store(int64(i + 1))
	}
	if err := pub.flush(ctx); err != nil {
		return fmt.Errorf("bench: flush: %w", err)
	}
	return nil
}

// Lines are the result's headline lines:
//
//	Published 1000000 messages in ~2 seconds (512345 msgs/s)
//	Delivered 10000000 messages in ~3 seconds (3012345 msgs/s)
//	Lost 0 of 10000000 deliveries (0.000%), 0 out of order
func (res *PubSubResult) Lines() []string {
	r := func(x float64) int64 { return int64(math.Round(x)) }
	lostPct := 0.0
	if res.Expected > 0 {
		lostPct = 100 * float64(res.Lost) / float64(res.Expected)
	}
	return []string{
		fmt.Sprintf("Published %d messages in ~%d seconds (%d msgs/s)", res.Published, r(res.PublishSeconds), r(res.PublishRate)),
		fmt.Sprintf("Delivered %d messages in ~%d seconds (%d msgs/s)", res.Delivered, r(res.DeliverSeconds), r(res.DeliverRate)),
		fmt.Sprintf("Lost %d of %d deliveries (%.3f%%), %d out of order", res.Lost, res.Expected, lostPct, res.OutOfOrder),
	}
}

// WriteText prints the result.
func (res *PubSubResult) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Pub-sub fan-out: %s, 1 publisher, %d subscribers, %d messages of %d bytes\n",
		res.Target, res.Subscribers, res.Messages, res.Size)
	for _, l := range res.Lines() {
		b.WriteString(l + "\n")
	}
	if res.Delivered > 0 {
		for _, l := range res.Process.describe(res.CPU, "delivery") {
			b.WriteString(l + "\n")
		}
	}
	for _, n := range res.Notes {
		b.WriteString("Note: " + n + "\n")
	}
	if res.Error != "" {
		b.WriteString("Error: " + res.Error + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON prints the result as one JSON object.
func (res *PubSubResult) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}
