package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// PubSubResult is what the pub-sub scenario measured.
type PubSubResult struct {
	Report
	// Mode is "fan-out" (one publisher), "fan-in" (one subscriber) or
	// "many-to-many".
	Mode        string `json:"mode"`
	Publishers  int    `json:"publishers"`
	Subscribers int    `json:"subscribers"`
	// Messages is the count asked for; 0 for a run bounded by time.
	Messages int     `json:"messages"`
	Duration float64 `json:"duration_s,omitempty"`
	Warmup   int     `json:"warmup"`
	// Published messages, and the time from the first publish until the
	// publishers' flushes returned.
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
	// previous one from the same publisher.
	OutOfOrder int64 `json:"out_of_order"`
	// Latency is from publish (or, with a rate, from when the message was
	// due) to delivery; none for messages under stampSize bytes.
	Latency Latency `json:"latency_us"`
	// CPU is per delivered message.
	CPU CPU `json:"cpu_per_delivery"`
	// Servers is how many servers the subscribers were spread over
	// (Config.SubscriberURLs); 0 when they were on the publisher's.
	Servers int `json:"subscriber_servers,omitempty"`
	// Links is what a Courier cluster's link counters did over one
	// publication (Config.NodesHTTP).
	Links *LinkReport `json:"links,omitempty"`
}

// A message of at least stampSize bytes carries its sequence number
// (8 bytes), the time it was due in nanoseconds since the run's epoch
// (8 bytes) and its publisher's index (4 bytes), so that subscribers
// count losses, reordering and latency.
const stampSize = 20

// subCounter is one subscriber's tally, written by its goroutine only;
// padded so that subscribers do not share cache lines.
type subCounter struct {
	n    atomic.Int64 // every delivery: probes and warm-up too
	m    atomic.Int64 // deliveries of the measured run's messages
	ooo  atomic.Int64
	last []uint64 // by publisher
	_    [32]byte
}

// RunPubSub runs the pub-sub scenario: cfg.Subscribers subscribers and
// cfg.Publishers publishers, each on its own connection (fan-out: one
// publisher; fan-in: one subscriber). The publishers share cfg.Count
// messages of cfg.Size bytes (or publish for cfg.Duration), as fast as
// the broker takes them or at cfg.Rate in total. ctx bounds the whole
// scenario.
func RunPubSub(ctx context.Context, cfg Config) (*PubSubResult, error) {
	cfg = cfg.withDefaults("pubsub")
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	res := &PubSubResult{
		Report: newReport("pubsub", &cfg), Mode: pubSubMode(cfg.Publishers, cfg.Subscribers),
		Publishers: cfg.Publishers, Subscribers: cfg.Subscribers, Messages: cfg.Count,
		Duration: cfg.Duration.Seconds(), Warmup: max(cfg.Warmup, 0), Servers: len(cfg.SubscriberURLs),
	}
	err := runPubSub(ctx, &cfg, res)
	if err != nil {
		res.Error = err.Error()
	}
	return res, err
}

func pubSubMode(pubs, subs int) string {
	switch {
	case pubs == 1:
		return "fan-out"
	case subs == 1:
		return "fan-in"
	}
	return "many-to-many"
}

func runPubSub(ctx context.Context, cfg *Config, res *PubSubResult) error {
	d, closeDriver, err := openDriver(ctx, cfg, &res.Report)
	if err != nil {
		return err
	}
	defer closeDriver()
	stamped := cfg.Size >= stampSize
	if !stamped {
		res.Notes = append(res.Notes, fmt.Sprintf("messages under %d bytes carry no sequence number or time stamp: no latency, no order check", stampSize))
	}
	epoch := time.Now()
	rec := newRecorder(cfg.Subscribers)
	counters := make([]subCounter, cfg.Subscribers)
	for i := range counters {
		counters[i].last = make([]uint64, cfg.Publishers)
	}
	// Stamped messages of the measured run have a sequence number above
	// their publisher's first; the probes and the warm-up's stragglers,
	// which may still come in a cluster, are not counted with them.
	firstSeq := make([]atomic.Uint64, cfg.Publishers)
	for j := range firstSeq {
		firstSeq[j].Store(math.MaxUint64)
	}
	err = d.subscribe(ctx, cfg.Subscribers, func(i int, b []byte) {
		c := &counters[i]
		if stamped && len(b) >= stampSize {
			seq := binary.BigEndian.Uint64(b)
			due := time.Duration(binary.BigEndian.Uint64(b[8:]))
			if p := binary.BigEndian.Uint32(b[16:]); int(p) < len(c.last) {
				if seq <= c.last[p] {
					c.ooo.Add(1)
				}
				c.last[p] = seq
				if seq > firstSeq[p].Load() {
					c.m.Add(1)
					rec.record(i, time.Since(epoch)-due)
				}
			}
		}
		c.n.Add(1)
	})
	if err != nil {
		return err
	}
	pubs := make([]*pubState, cfg.Publishers)
	for j := range pubs {
		pub, err := d.publisher(ctx)
		if err != nil {
			return err
		}
		pubs[j] = &pubState{pub: pub, index: uint32(j), stamped: stamped, size: cfg.Size, epoch: epoch}
	}
	delivered := func() int64 {
		var n int64
		for i := range counters {
			n += counters[i].n.Load()
		}
		return n
	}

	// Publishers stuck in flow control are unblocked by closing their
	// connections when the time is up.
	publishing := make(chan struct{})
	defer close(publishing)
	go func() {
		select {
		case <-ctx.Done():
			d.close()
		case <-publishing:
		}
	}()

	if cfg.spread() {
		if err := awaitSubscribers(ctx, pubs[0], counters, readyWait); err != nil {
			return err
		}
	}
	if cfg.Warmup > 0 {
		var published atomic.Int64
		from := delivered()
		err := pubs[0].run(ctx, newBudget(cfg.Warmup, 0), newPacer(0, 0), &published)
		if err != nil {
			return fmt.Errorf("bench: warm-up: %w", err)
		}
		want := from + published.Load()*int64(cfg.Subscribers)
		awaitDeliveries(ctx, delivered, want, epoch, cfg.Drain)
	}
	if len(cfg.NodesHTTP) > 0 {
		// Stragglers of the probes and the warm-up would cross the links
		// in the windows.
		awaitQuiet(ctx, delivered, time.Second, readyWait)
		res.Links, err = measureLinks(ctx, cfg.NodesHTTP, linkWindow, linkPublications, func() error {
			from := delivered()
			var n atomic.Int64
			if err := pubs[0].run(ctx, newBudget(linkPublications, 0), newPacer(0, 0), &n); err != nil {
				return fmt.Errorf("bench: the publications for the link counters: %w", err)
			}
			awaitDeliveries(ctx, delivered, from+linkPublications*int64(cfg.Subscribers), time.Now(), cfg.Drain)
			return nil
		})
		if err != nil {
			return err
		}
	}
	base := delivered()
	for j, ps := range pubs {
		firstSeq[j].Store(ps.seq)
	}
	// measured counts the deliveries of the measured run's messages.
	measured := func() int64 {
		if !stamped {
			return delivered() - base
		}
		var n int64
		for i := range counters {
			n += counters[i].m.Load()
		}
		return n
	}

	meter := newCPUMeter(cfg)
	var published atomic.Int64
	pr := probe{sent: published.Load, received: measured, lat: rec}
	if cfg.Rate > 0 {
		pr.offered = func() float64 { return cfg.Rate }
	}
	smp := startSampler(pr, meter, cfg.Interval)
	// The sampler's totals hold every delivery, the late ones too, once
	// it stopped (deferred calls run last first).
	defer func() { res.Latency, _ = smp.latency() }()
	defer res.finish(smp, meter)

	b := newBudget(cfg.Count, cfg.Duration)
	smp.setStage("publishing")
	stop := progress(cfg, "Published", b.done, total(cfg.Count))
	from := meter.sample()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(pubs))
	for j, ps := range pubs {
		p := newPacer(cfg.Rate/float64(len(pubs)), float64(j)/float64(len(pubs)))
		wg.Go(func() { errs[j] = ps.run(ctx, b, p, &published) })
	}
	wg.Wait()
	pubElapsed := time.Since(start)
	stop()
	pubErr := errors.Join(errs...)
	res.Published = published.Load()
	res.PublishSeconds = pubElapsed.Seconds()
	res.PublishRate = float64(res.Published) / pubElapsed.Seconds()
	res.Expected = res.Published * int64(cfg.Subscribers)

	// Wait for the deliveries until all came, none came for cfg.Drain,
	// or the time is up. A publisher that failed ends the wait at once.
	smp.setStage("draining")
	stop = progress(cfg, "Delivered", measured, res.Expected)
	last, lastAt := measured(), time.Now()
	if pubErr == nil {
		last, lastAt = awaitDeliveries(ctx, measured, res.Expected, start, cfg.Drain)
	}
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

// linkWindow is how long, at least, the link counters are watched with
// and without publications; linkPublications is how many are published
// in the window, so that a heartbeat more or less in one window than in
// the other moves the copies per publication by 1/linkPublications.
const (
	linkWindow       = 500 * time.Millisecond
	linkPublications = 20
)

// awaitSubscribers publishes one message every 100ms until every
// subscriber has received one, or wait is over: subscribers on other
// nodes of a cluster receive once their interest has crossed the links
// (NATS does not wait for that before it acknowledges a subscription).
func awaitSubscribers(ctx context.Context, ps *pubState, counters []subCounter, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	var probes atomic.Int64
	for {
		if err := ps.run(ctx, newBudget(1, 0), newPacer(0, 0), &probes); err != nil {
			return fmt.Errorf("bench: probing the subscribers: %w", err)
		}
		for range 10 {
			waiting := 0
			for i := range counters {
				if counters[i].n.Load() == 0 {
					waiting++
				}
			}
			if waiting == 0 {
				return nil
			}
			if ctx.Err() != nil || time.Now().After(deadline) {
				return fmt.Errorf("bench: %d of %d subscribers received nothing within %s of probes", waiting, len(counters), wait)
			}
			sleepCtx(ctx, 10*time.Millisecond)
		}
	}
}

// awaitQuiet waits until delivered has not changed for quiet, at most
// for wait.
func awaitQuiet(ctx context.Context, delivered func() int64, quiet, wait time.Duration) {
	deadline := time.Now().Add(wait)
	last, lastAt := delivered(), time.Now()
	for time.Since(lastAt) < quiet && time.Now().Before(deadline) && ctx.Err() == nil {
		sleepCtx(ctx, 10*time.Millisecond)
		if n := delivered(); n != last {
			last, lastAt = n, time.Now()
		}
	}
}

// awaitDeliveries waits until delivered reaches want, stays unchanged
// for drain, or ctx ends; it returns the last count and when it changed
// (start if nothing came).
func awaitDeliveries(ctx context.Context, delivered func() int64, want int64, start time.Time, drain time.Duration) (int64, time.Time) {
	last, lastAt := delivered(), time.Now()
	if last == 0 {
		lastAt = start
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for last < want && time.Since(lastAt) < drain && ctx.Err() == nil {
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
		if n := delivered(); n != last {
			last, lastAt = n, time.Now()
		}
	}
	return last, lastAt
}

// pubState is one publisher, used by one goroutine at a time.
type pubState struct {
	pub     publisher
	index   uint32
	stamped bool
	size    int
	epoch   time.Time
	seq     uint64 // the last sequence number published
	buf     []byte // the rest of the slab bodies are cut from
}

// run publishes the budget's messages at the pacer's rate, then
// flushes; published counts them.
func (ps *pubState) run(ctx context.Context, b *budget, p *pacer, published *atomic.Int64) error {
	n := 0
	for {
		if _, ok := b.take(); !ok {
			break
		}
		due, ok := p.wait(ctx)
		if !ok || (n&1023 == 0 && ctx.Err() != nil) {
			return fmt.Errorf("bench: published %d messages before the time ran out: %w", n, ctx.Err())
		}
		// A body of its own for every message: an embedded node passes
		// it to subscribers without copying. Cut from 64 KiB slabs.
		if len(ps.buf) < ps.size {
			ps.buf = make([]byte, max(64<<10, ps.size))
		}
		body := ps.buf[:ps.size:ps.size]
		ps.buf = ps.buf[ps.size:]
		ps.seq++
		if ps.stamped {
			binary.BigEndian.PutUint64(body, ps.seq)
			binary.BigEndian.PutUint64(body[8:], uint64(due.Sub(ps.epoch)))
			binary.BigEndian.PutUint32(body[16:], ps.index)
		}
		if err := ps.pub.publish(ctx, body); err != nil {
			if ctx.Err() != nil {
				// The connection was closed under the publisher because
				// the time ran out.
				return fmt.Errorf("bench: published %d messages before the time ran out: %w", n, ctx.Err())
			}
			return fmt.Errorf("bench: publish %d: %w", n+1, err)
		}
		n++
		published.Add(1)
	}
	if err := ps.pub.flush(ctx); err != nil {
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
	amount := fmt.Sprintf("%d messages", res.Messages)
	if res.Messages == 0 {
		amount = fmt.Sprintf("%gs of messages", res.Duration)
	}
	fmt.Fprintf(&b, "Pub-sub %s: %s, %d publisher(s), %d subscriber(s)", res.Mode, res.Target, res.Publishers, res.Subscribers)
	if res.Servers > 0 {
		fmt.Fprintf(&b, " spread over %d server(s)", res.Servers)
	}
	fmt.Fprintf(&b, ", %s of %d bytes", amount, res.Size)
	if res.Rate > 0 {
		fmt.Fprintf(&b, ", offered %.0f msgs/s", res.Rate)
	}
	b.WriteString("\n")
	writeLines(&b, res.Lines(), namedLatency{"Delivery", res.Latency, "deliveries"})
	if res.Links != nil {
		for _, l := range res.Links.Lines() {
			b.WriteString(l + "\n")
		}
	}
	return res.writeTail(w, &b, res.CPU, res.Delivered, "delivery")
}

// WriteJSON prints the result as one JSON object.
func (res *PubSubResult) WriteJSON(w io.Writer) error { return writeJSON(w, res) }

// Metrics returns the publish and delivery rates, losses, delivery
// latency and the server's CPU per delivery and memory.
func (res *PubSubResult) Metrics() []Metric {
	m := []Metric{
		{Name: "published", Value: res.PublishRate, Unit: "msgs/s"},
		{Name: "delivered", Value: res.DeliverRate, Unit: "msgs/s"},
		{Name: "lost", Value: float64(res.Lost), Unit: "msgs", Lower: true},
	}
	m = append(m, latencyMetrics("delivery latency", res.Latency)...)
	return append(m, res.usageMetrics(res.Delivered, "delivery")...)
}

// Timeline returns the run's samples.
func (res *PubSubResult) Timeline() Timeline {
	return Timeline{Title: "pubsub " + res.Mode + ": " + res.Target, Samples: res.Samples}
}
