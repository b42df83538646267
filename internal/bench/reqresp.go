package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// ReqRespResult is what the request-response scenario measured. A run
// that failed or timed out leaves the runs before it.
type ReqRespResult struct {
	Report
	Warmup  int `json:"warmup"`
	Workers int `json:"workers"`
	// HandlerURL is where the handlers were connected, when not to the
	// requesters' server (Config.HandlerURL).
	HandlerURL string `json:"handler_url,omitempty"`
	Runs       []Run  `json:"runs"`
	// Latency is over all sequential runs together.
	Latency Latency `json:"latency_us"`
	// CPU is per cycle over all runs together.
	CPU CPU `json:"cpu_per_cycle"`
}

// Run is one sequential or parallel run.
type Run struct {
	// Parallel is the number of requesting goroutines; 0 for a
	// sequential run.
	Parallel int     `json:"parallel"`
	Cycles   int     `json:"cycles"`
	Seconds  float64 `json:"seconds"`
	Rate     float64 `json:"cycles_per_s"`
	Latency  Latency `json:"latency_us"`
	CPU      CPU     `json:"cpu_per_cycle"`
}

// Name is "Sequential 10000" or "Parallel 4".
func (r Run) Name() string {
	if r.Parallel == 0 {
		return fmt.Sprintf("Sequential %d", r.Cycles)
	}
	return fmt.Sprintf("Parallel %d", r.Parallel)
}

// Line is the run's classic line, as the Erlang layer's benchmark prints
// it: "Sequential 100000 cycles in ~4 seconds (26957 cycles/s)" or
// "Parallel 4 100000 cycles in ~2 seconds (53459 cycles/s)".
func (r Run) Line() string {
	s, n := int64(math.Round(r.Seconds)), int64(math.Round(r.Rate))
	if r.Parallel == 0 {
		return fmt.Sprintf("Sequential %d cycles in ~%d seconds (%d cycles/s)", r.Cycles, s, n)
	}
	return fmt.Sprintf("Parallel %d %d cycles in ~%d seconds (%d cycles/s)", r.Parallel, r.Cycles, s, n)
}

// RunReqResp runs the request-response scenario: cfg.Workers handlers
// answer "ping" with "pong"; sequential runs of cfg.Counts cycles, then
// parallel runs of cfg.ParallelCount cycles shared by P goroutines for
// each P in cfg.Parallel (each run bounded by cfg.Duration too, if set).
// The handlers and the requesters live in this process, on separate
// connections (separate Conns for an embedded node). ctx bounds the
// whole scenario.
func RunReqResp(ctx context.Context, cfg Config) (*ReqRespResult, error) {
	cfg = cfg.withDefaults("reqresp")
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	res := &ReqRespResult{Report: newReport("reqresp", &cfg), Warmup: max(cfg.Warmup, 0), Workers: cfg.Workers,
		HandlerURL: redact(cfg.HandlerURL)}
	if cfg.EmbeddedCross {
		res.HandlerURL = "a second embedded node (bench-b, joined to the requesters' bench-a as a cluster)"
	}
	err := runReqResp(ctx, &cfg, res)
	if err != nil {
		res.Error = err.Error()
	}
	return res, err
}

func runReqResp(ctx context.Context, cfg *Config, res *ReqRespResult) (err error) {
	d, closeDriver, err := openDriver(ctx, cfg, &res.Report)
	if err != nil {
		return err
	}
	defer closeDriver()
	ping, pong := body("ping", cfg.Size), body("pong", cfg.Size)
	if err := d.serve(ctx, cfg.Workers, pong); err != nil {
		return err
	}
	meter := newCPUMeter(cfg)

	r, err := d.requester(ctx)
	if err != nil {
		return err
	}
	defer r.close()
	if cfg.spread() {
		if err := awaitHandler(ctx, r, ping, readyWait); err != nil {
			return err
		}
	}
	for i := range cfg.Warmup {
		if err := r.request(ctx, ping); err != nil {
			return fmt.Errorf("bench: warm-up cycle %d: %w", i, err)
		}
	}

	// One recorder for the sampler's time series, besides each run's
	// own histograms.
	rec := newRecorder(slices.Max(append([]int{1}, cfg.Parallel...)))
	var cycles atomic.Int64
	pr := probe{sent: cycles.Load, received: cycles.Load, lat: rec}
	if cfg.Rate > 0 {
		pr.offered = func() float64 { return cfg.Rate }
	}
	smp := startSampler(pr, meter, cfg.Interval)
	defer res.finish(smp, meter)

	seqHist := newHist()
	first := meter.sample()
	defer func() {
		res.Latency = latencyOf(seqHist)
		res.CPU = meter.per(first, meter.sample(), cycles.Load())
	}()
	for _, n := range cfg.Counts {
		run := Run{Cycles: n}
		stage := runStage(run, cfg)
		h := newHist()
		b := newBudget(n, cfg.Duration)
		smp.setStage(stage)
		stop := progress(cfg, stage, b.done, total(n))
		from := meter.sample()
		done, elapsed, err := sequential(ctx, r, ping, b, newPacer(cfg.Rate, 0), h, rec, &cycles)
		to := meter.sample()
		stop()
		if err != nil {
			return fmt.Errorf("bench: %s: %w", stage, err)
		}
		seqHist.Merge(h)
		run.Cycles = done
		res.Runs = append(res.Runs, finish(run, elapsed, h, meter.per(from, to, int64(done))))
	}
	for _, p := range cfg.Parallel {
		run := Run{Parallel: p, Cycles: cfg.ParallelCount}
		stage := runStage(run, cfg)
		rs := make([]requester, 0, p)
		for range p {
			r, err := d.requester(ctx)
			if err != nil {
				closeAll(rs)
				return err
			}
			rs = append(rs, r)
		}
		b := newBudget(run.Cycles, cfg.Duration)
		smp.setStage(stage)
		stop := progress(cfg, stage, b.done, total(run.Cycles))
		from := meter.sample()
		elapsed, h, err := parallel(ctx, rs, ping, b, cfg.Rate, rec, &cycles)
		to := meter.sample()
		stop()
		closeAll(rs)
		if err != nil {
			return fmt.Errorf("bench: %s: %w", stage, err)
		}
		run.Cycles = int(h.TotalCount())
		res.Runs = append(res.Runs, finish(run, elapsed, h, meter.per(from, to, int64(run.Cycles))))
	}
	return nil
}

// readyWait bounds how long a spread run waits for the cluster to learn
// of its handlers or subscribers before it starts.
const readyWait = 30 * time.Second

// awaitHandler sends requests until one is answered, or wait is over: a
// handler attached to another node of a cluster is known to the
// requester's node once its view or interest has crossed the link
// (NATS answers "no responders" until then; Courier "no handler").
func awaitHandler(ctx context.Context, r requester, ping []byte, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := r.request(rctx, ping)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("bench: the requester's node did not reach the handler within %s: %w", wait, err)
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
}

// runStage names a run for progress reports and samples: "Sequential
// 10000", "Parallel 4", or "Sequential (10s)" for a run bounded by time
// only.
func runStage(run Run, cfg *Config) string {
	if run.Parallel == 0 && run.Cycles == 0 {
		return fmt.Sprintf("Sequential (%s)", cfg.Duration)
	}
	return run.Name()
}

// total is a run's count for progress reports: -1 when it is bounded by
// time only.
func total(n int) int64 {
	if n == 0 {
		return -1
	}
	return int64(n)
}

func finish(run Run, elapsed time.Duration, h *hdrhistogram.Histogram, cpu CPU) Run {
	run.Seconds = elapsed.Seconds()
	if elapsed > 0 {
		run.Rate = float64(run.Cycles) / elapsed.Seconds()
	}
	run.Latency = latencyOf(h)
	run.CPU = cpu
	return run
}

func closeAll(rs []requester) {
	for _, r := range rs {
		r.close()
	}
}

// sequential runs the budget's cycles one after the other and records
// each one's time: from the previous cycle's end, or with a rate from
// when it was due. It returns the cycles done and the time from the
// start to the last one's end.
func sequential(ctx context.Context, r requester, ping []byte, b *budget, p *pacer, h *hdrhistogram.Histogram, rec *recorder, cycles *atomic.Int64) (int, time.Duration, error) {
	start := time.Now()
	prev := start
	done := 0
	for {
		if _, ok := b.take(); !ok {
			break
		}
		due, ok := p.wait(ctx)
		if !ok {
			return done, prev.Sub(start), fmt.Errorf("cycle %d: %w", done, ctx.Err())
		}
		if err := r.request(ctx, ping); err != nil {
			return done, prev.Sub(start), fmt.Errorf("cycle %d: %w", done, err)
		}
		now := time.Now()
		d := now.Sub(prev)
		if p.every > 0 {
			d = now.Sub(due)
		}
		record(h, d)
		rec.record(0, d)
		prev = now
		done++
		cycles.Add(1)
	}
	return done, prev.Sub(start), nil
}

// parallel runs the budget's cycles with one goroutine per requester:
// each takes the next cycle until none is left, at its share of rate.
// The first error stops them.
func parallel(parent context.Context, rs []requester, ping []byte, b *budget, rate float64, rec *recorder, cycles *atomic.Int64) (time.Duration, *hdrhistogram.Histogram, error) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	hists := make([]*hdrhistogram.Histogram, len(rs))
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	start := time.Now()
	for i, r := range rs {
		hists[i] = newHist()
		p := newPacer(rate/float64(len(rs)), float64(i)/float64(len(rs)))
		wg.Go(func() {
			h := hists[i]
			for {
				if _, ok := b.take(); !ok {
					return
				}
				due, ok := p.wait(ctx)
				if !ok {
					return
				}
				if err := r.request(ctx, ping); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
				d := time.Since(due)
				record(h, d)
				rec.record(i, d)
				cycles.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	all := newHist()
	for _, h := range hists {
		all.Merge(h)
	}
	if parent.Err() != nil {
		firstErr = parent.Err()
	}
	return elapsed, all, firstErr
}

// WriteText prints the result: the classic lines, then latency, CPU and
// memory, then a table by run.
func (res *ReqRespResult) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Request-response: %s, %d-byte ping and pong, %d handler(s)", res.Target, res.Size, res.Workers)
	if res.HandlerURL != "" {
		fmt.Fprintf(&b, " connected to %s", res.HandlerURL)
	}
	fmt.Fprintf(&b, ", %d warm-up cycles", res.Warmup)
	if res.Rate > 0 {
		fmt.Fprintf(&b, ", offered %.0f cycles/s", res.Rate)
	}
	b.WriteString("\n")
	for _, r := range res.Runs {
		b.WriteString(r.Line() + "\n")
	}
	if res.Latency.Count > 0 {
		l := res.Latency
		fmt.Fprintf(&b, "Sequential latency p50 %.1f us, p99 %.1f us, p99.9 %.1f us (%d cycles, max %.1f us)\n",
			l.P50, l.P99, l.P999, l.Count, l.Max)
	}
	if len(res.Runs) > 0 {
		for _, line := range res.Process.describe(res.CPU, "cycle") {
			b.WriteString(line + "\n")
		}
	}
	res.footer(&b)
	if len(res.Runs) > 0 {
		b.WriteString("\n")
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "run\tcycles/s\tp50 us\tp90 us\tp99 us\tp99.9 us\tmax us\tbroker CPU us/cycle\tclient CPU us/cycle\t\n")
		for _, r := range res.Runs {
			broker := "?"
			if res.Process.Embedded {
				broker = "(same)"
			} else if r.CPU.Broker >= 0 {
				broker = strconv.FormatFloat(r.CPU.Broker, 'f', 1, 64)
			}
			fmt.Fprintf(tw, "%s\t%.0f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%s\t%.1f\t\n", r.Name(), r.Rate,
				r.Latency.P50, r.Latency.P90, r.Latency.P99, r.Latency.P999, r.Latency.Max, broker, r.CPU.Client)
		}
		tw.Flush()
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON prints the result as one JSON object.
func (res *ReqRespResult) WriteJSON(w io.Writer) error { return writeJSON(w, res) }

// Metrics returns each run's rate, the sequential latency and the
// server's CPU per cycle and memory.
func (res *ReqRespResult) Metrics() []Metric {
	var m []Metric
	var cycles int64
	for _, r := range res.Runs {
		m = append(m, Metric{Name: r.Name(), Value: r.Rate, Unit: "cycles/s"})
		cycles += int64(r.Cycles)
	}
	m = append(m, latencyMetrics("sequential latency", res.Latency)...)
	return append(m, res.usageMetrics(cycles, "cycle")...)
}

// Timeline returns the run's samples.
func (res *ReqRespResult) Timeline() Timeline {
	return Timeline{Title: "reqresp: " + res.Target, Samples: res.Samples}
}
