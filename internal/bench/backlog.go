package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// BacklogResult is what the backlog scenario measured.
type BacklogResult struct {
	Report
	Prefetch    int `json:"prefetch"`
	Window      int `json:"window"`
	Depth       int `json:"target_depth"`
	SampleEvery int `json:"sample_every"`
	// Duration bounds the loop; 0 if only the depth does.
	Duration float64 `json:"duration_s,omitempty"`
	// Iterations done, in Seconds: from the first publish until every
	// publish was confirmed.
	Iterations int64   `json:"iterations"`
	Seconds    float64 `json:"seconds"`
	Rate       float64 `json:"iterations_per_s"`
	// Published counts the publishes the broker confirmed, Failed those
	// it refused or failed, Acked the messages received and acked.
	Published int64 `json:"published"`
	Failed    int64 `json:"failed"`
	Acked     int64 `json:"acked"`
	// QueueDepth is the queue's depth at the end as the broker counts it
	// (unacked messages included), once confirms and acks settled: it
	// should equal Iterations. -1 if the broker could not say.
	QueueDepth int64 `json:"queue_depth"`
	// RSSBefore is the server's resident memory before the first
	// iteration, in bytes; 0 if unknown.
	RSSBefore int64 `json:"server_rss_before_bytes,omitempty"`
	// MaxRSS is the server memory at which the run was to stop, in
	// bytes (0: none); OverRSS says the run stopped there.
	MaxRSS  int64 `json:"max_rss_bytes,omitempty"`
	OverRSS bool  `json:"stopped_over_max_rss,omitempty"`
	// Curve holds a point every SampleEvery iterations, and one at the
	// end.
	Curve []BacklogPoint `json:"curve"`
	// ConfirmLatency is from publish to confirm, over the whole run.
	ConfirmLatency Latency `json:"confirm_latency_us"`
	// CPU is per iteration.
	CPU CPU `json:"cpu_per_iteration"`
}

// BacklogPoint is the state of a backlog run after some iterations.
type BacklogPoint struct {
	// Iterations done, and so the queue's depth.
	Iterations int64 `json:"iterations"`
	// T is the time since the first iteration, in seconds.
	T float64 `json:"t_s"`
	// Rate is the iterations per second since the previous point, and
	// Published the confirmed publishes per second.
	Rate      float64 `json:"iterations_per_s"`
	Published float64 `json:"published_per_s"`
	// ServerRSS is the server's resident memory, in bytes; 0 if unknown.
	ServerRSS int64 `json:"server_rss_bytes"`
	// ServerCPU and ClientCPU are the cores the server and this process
	// kept busy since the previous point; ServerCPU is -1 if unknown.
	ServerCPU float64 `json:"server_cpu_cores"`
	ClientCPU float64 `json:"client_cpu_cores"`
	// ConfirmLatency covers the confirms since the previous point.
	ConfirmLatency Latency `json:"confirm_latency_us"`
}

// RunBacklog runs the backlog scenario, the classic persister stress
// test: one durable queue, one consumer with a prefetch of
// cfg.Queue.Prefetch, and a loop that publishes two persistent messages
// of cfg.Size bytes with confirms (pipelined: at most cfg.Queue.Window
// await their confirm) and then receives and acks one, so that the queue
// grows by one message per iteration. Every cfg.Queue.SampleEvery
// iterations it samples the server's resident memory. It stops at
// cfg.Queue.Depth iterations, after cfg.Duration, or when ctx ends, and
// then checks the queue's depth with the broker.
func RunBacklog(ctx context.Context, cfg Config) (*BacklogResult, error) {
	cfg = cfg.withDefaults("backlog")
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	q := cfg.Queue
	res := &BacklogResult{
		Report: newReport("backlog", &cfg), Prefetch: q.Prefetch, Window: q.Window, Depth: q.Depth,
		SampleEvery: q.SampleEvery, Duration: cfg.Duration.Seconds(), QueueDepth: -1, MaxRSS: q.MaxRSS,
	}
	err := runBacklog(ctx, &cfg, res)
	if err != nil {
		res.Error = err.Error()
	}
	return res, err
}

func runBacklog(ctx context.Context, cfg *Config, res *BacklogResult) error {
	d, closeDriver, err := openDriver(ctx, cfg, &res.Report)
	if err != nil {
		return err
	}
	defer closeDriver()
	qd, name, deleteQueue, err := openQueue(ctx, d, cfg, "backlog")
	if err != nil {
		return err
	}
	defer deleteQueue()

	// The consumer hands its messages to the loop. It holds at most
	// prefetch unacked, so the channel never fills; quit frees it if the
	// loop ended first.
	received := make(chan delivery, 2*cfg.Queue.Prefetch+16)
	quit := make(chan struct{})
	defer close(quit)
	err = qd.consume(ctx, name, cfg.Queue.Prefetch, func(m delivery) {
		select {
		case received <- m:
		case <-quit:
		}
	})
	if err != nil {
		return err
	}
	p, err := qd.producer(ctx, name)
	if err != nil {
		return err
	}
	defer unblockAtEnd(ctx, p)()

	meter := newCPUMeter(cfg)
	res.RSSBefore = meter.rss()
	epoch := time.Now()
	lat := newRecorder(1)
	c := newConfirmer(p, cfg.Queue.Window, epoch, lat)
	var acked atomic.Int64
	smp := startSampler(probe{sent: c.confirmed.Load, received: acked.Load, errors: c.failed.Load}, meter, cfg.Interval)
	total := newHist()
	defer func() { res.ConfirmLatency = latencyOf(total) }()
	defer res.finish(smp, meter)

	curve := &curveTaker{meter: meter, lat: lat, total: total, confirmed: c.confirmed.Load}
	stop := progress(cfg, "Depth", acked.Load, int64(cfg.Queue.Depth))
	defer stop()
	var until time.Time
	if cfg.Duration > 0 {
		until = time.Now().Add(cfg.Duration)
	}
	var slab []byte // bodies are cut from it: each message has its own
	next := func() []byte {
		if len(slab) < cfg.Size {
			slab = make([]byte, max(64<<10, cfg.Size))
			for i := range slab {
				slab[i] = '.'
			}
		}
		b := slab[:cfg.Size:cfg.Size]
		slab = slab[cfg.Size:]
		return b
	}
	start := time.Now()
	curve.start(start)
	from := meter.sample()
	var loopErr error
	n := int64(0)
	for n < int64(cfg.Queue.Depth) {
		if !until.IsZero() && n%64 == 0 && time.Now().After(until) {
			break
		}
		for range 2 {
			if loopErr = c.submit(ctx, next(), time.Now()); loopErr != nil {
				break
			}
		}
		if loopErr != nil {
			break
		}
		select {
		case m := <-received:
			if loopErr = m.ack(); loopErr != nil {
				loopErr = fmt.Errorf("bench: ack: %w", loopErr)
			}
		case <-ctx.Done():
			loopErr = ctx.Err()
		}
		if loopErr != nil {
			break
		}
		n++
		acked.Store(n)
		if n%int64(cfg.Queue.SampleEvery) == 0 {
			res.Curve = append(res.Curve, curve.take(n))
		}
		if cfg.Queue.MaxRSS > 0 && n%rssCheckEvery == 0 && meter.rss() > cfg.Queue.MaxRSS {
			res.OverRSS = true
			break
		}
	}
	if loopErr == nil {
		loopErr = c.wait(ctx)
	} else if ctx.Err() != nil {
		loopErr = fmt.Errorf("bench: stopped at depth %d, the time ran out: %w", n, ctx.Err())
	}
	end := time.Now()
	if len(res.Curve) == 0 || res.Curve[len(res.Curve)-1].Iterations != n {
		res.Curve = append(res.Curve, curve.take(n))
	}
	lat.takeInto(total) // the confirms that came after the last point
	res.CPU = meter.per(from, meter.sample(), n)
	res.Iterations, res.Acked = n, n
	res.Published, res.Failed = c.confirmed.Load(), c.failed.Load()
	res.Seconds = end.Sub(start).Seconds()
	if res.Seconds > 0 {
		res.Rate = float64(n) / res.Seconds
	}
	if loopErr != nil && ctx.Err() != nil {
		return loopErr
	}
	// Every publish was confirmed (or failed) and every ack sent: the
	// queue should hold one message per iteration.
	depth, err := settleDepth(ctx, qd, name, res.expectedDepth())
	if err != nil {
		res.Notes = append(res.Notes, "queue depth unknown: "+err.Error())
	} else {
		res.QueueDepth = depth
	}
	return loopErr
}

// rssCheckEvery is how many backlog iterations go between two checks
// of the server's memory against Config.Queue.MaxRSS.
const rssCheckEvery = 5000

// expectedDepth is the queue's depth once every confirm and ack came:
// the confirmed publishes less the acked messages, one per iteration
// (a publish that failed may or may not be in the queue).
func (res *BacklogResult) expectedDepth() int64 { return res.Published - res.Acked }

// curveTaker takes the points of a backlog curve.
type curveTaker struct {
	meter     *cpuMeter
	lat       *recorder
	total     *hdrhistogram.Histogram
	confirmed func() int64

	t0   time.Time
	last struct {
		at         time.Time
		n, confirm int64
		cpu        cpuSample
	}
}

func (ct *curveTaker) start(t time.Time) {
	ct.t0 = t
	ct.last.at, ct.last.cpu, ct.last.confirm = t, ct.meter.sample(), ct.confirmed()
}

// take returns the point after n iterations.
func (ct *curveTaker) take(n int64) BacklogPoint {
	now := time.Now()
	cpu := ct.meter.sample()
	confirmed := ct.confirmed()
	h := newHist()
	ct.lat.takeInto(h)
	ct.total.Merge(h)
	secs := now.Sub(ct.last.at).Seconds()
	pt := BacklogPoint{
		Iterations: n, T: now.Sub(ct.t0).Seconds(), ServerRSS: ct.meter.rss(), ServerCPU: -1,
		ConfirmLatency: latencyOf(h),
	}
	if secs > 0 {
		pt.Rate = float64(n-ct.last.n) / secs
		pt.Published = float64(confirmed-ct.last.confirm) / secs
		pt.ClientCPU = (cpu.client - ct.last.cpu.client).Seconds() / secs
		if cpu.broker >= 0 && ct.last.cpu.broker >= 0 {
			pt.ServerCPU = (cpu.broker - ct.last.cpu.broker).Seconds() / secs
		}
	}
	ct.last.at, ct.last.n, ct.last.confirm, ct.last.cpu = now, n, confirmed, cpu
	return pt
}

// WriteText prints the result: the memory curve, then the totals.
func (res *BacklogResult) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Backlog: %s, one durable queue, 1 consumer (prefetch %d); each iteration publishes 2 persistent messages of %d bytes (confirms pipelined, window %d) and receives and acks 1; to depth %d\n",
		res.Target, res.Prefetch, res.Size, res.Window, res.Depth)
	mb := func(v int64) string {
		if v <= 0 {
			return "–"
		}
		return fmt.Sprintf("%.0f MB", float64(v)/1e6)
	}
	if res.RSSBefore > 0 {
		fmt.Fprintf(&b, "Server RSS before: %s\n", mb(res.RSSBefore))
	}
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "depth\tseconds\titerations/s\tserver RSS\tserver CPU\tconfirm p50\tconfirm p99\t\n")
	for _, p := range res.Curve {
		cpu := "–"
		if p.ServerCPU >= 0 {
			cpu = fmt.Sprintf("%.2f cores", p.ServerCPU)
		}
		fmt.Fprintf(tw, "%d\t%.1f\t%.0f\t%s\t%s\t%.0f us\t%.0f us\t\n", p.Iterations, p.T, p.Rate, mb(p.ServerRSS), cpu,
			p.ConfirmLatency.P50, p.ConfirmLatency.P99)
	}
	tw.Flush()
	r := func(x float64) int64 { return int64(math.Round(x)) }
	switch {
	case res.Iterations >= int64(res.Depth):
		fmt.Fprintf(&b, "Reached depth %d in ~%d seconds (%d iterations/s)\n", res.Iterations, r(res.Seconds), r(res.Rate))
	case res.OverRSS:
		fmt.Fprintf(&b, "Stopped at depth %d of %d after ~%d seconds (%d iterations/s): the server's RSS passed %s\n",
			res.Iterations, res.Depth, r(res.Seconds), r(res.Rate), mb(res.MaxRSS))
	default:
		fmt.Fprintf(&b, "Stopped at depth %d of %d after ~%d seconds (%d iterations/s)\n", res.Iterations, res.Depth, r(res.Seconds), r(res.Rate))
	}
	if res.QueueDepth >= 0 {
		verdict := "as expected"
		if want := res.expectedDepth(); res.QueueDepth != want {
			verdict = fmt.Sprintf("expected %d", want)
		}
		fmt.Fprintf(&b, "Queue depth at the end, as the broker counts it: %d (%s)\n", res.QueueDepth, verdict)
	}
	writeLines(&b, []string{fmt.Sprintf("Published %d messages (confirmed), %d failed; received and acked %d", res.Published, res.Failed, res.Acked)},
		namedLatency{"Confirm", res.ConfirmLatency, "confirms"})
	return res.writeTail(w, &b, res.CPU, res.Iterations, "iteration")
}

// WriteJSON prints the result as one JSON object.
func (res *BacklogResult) WriteJSON(w io.Writer) error { return writeJSON(w, res) }

// Metrics returns the iteration rate, the server's memory at the end and
// its CPU per iteration.
func (res *BacklogResult) Metrics() []Metric {
	m := []Metric{
		{Name: "iterations", Value: res.Rate, Unit: "iter/s"},
		{Name: "depth reached", Value: float64(res.Iterations), Unit: "msgs"},
	}
	if n := len(res.Curve); n > 0 && res.Curve[n-1].ServerRSS > 0 {
		m = append(m, Metric{Name: "server RSS at the end", Value: float64(res.Curve[n-1].ServerRSS) / 1e6, Unit: "MB", Lower: true})
	}
	m = append(m, latencyMetrics("confirm latency", res.ConfirmLatency)...)
	return append(m, res.usageMetrics(res.Iterations, "iteration")...)
}

// Timeline returns the memory curve as samples over the queue's depth:
// iterations and confirmed publishes per second, confirm latency, CPU
// and the server's resident memory.
func (res *BacklogResult) Timeline() Timeline {
	tl := Timeline{Title: "backlog: " + res.Target, ByDepth: true, SentName: "published", ReceivedName: "iterations",
		LatencyName: "confirm"}
	for _, p := range res.Curve {
		tl.Samples = append(tl.Samples, Sample{
			T: p.T, Depth: p.Iterations, Sent: p.Published, Received: p.Rate, Latency: p.ConfirmLatency,
			ServerCPU: p.ServerCPU, ClientCPU: p.ClientCPU, ServerRSS: p.ServerRSS,
		})
	}
	return tl
}
