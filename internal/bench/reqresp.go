package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
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
	Scenario string `json:"scenario"` // "reqresp"
	Target   string `json:"target"`
	Kind     Kind   `json:"kind"`
	Size     int    `json:"size"`
	Warmup   int    `json:"warmup"`
	Runs     []Run  `json:"runs"`
	// Latency is over all sequential runs together.
	Latency Latency `json:"latency_us"`
	// CPU is per cycle over all runs together.
	CPU     CPU      `json:"cpu_per_cycle"`
	Process Process  `json:"broker_process"`
	Notes   []string `json:"notes,omitempty"`
	Error   string   `json:"error,omitempty"`
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

// Latency holds percentiles of round-trip times, in microseconds.
type Latency struct {
	P50   float64 `json:"p50"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p99_9"`
	Max   float64 `json:"max"`
	Count int64   `json:"count"`
}

// Histograms record nanoseconds, 3 significant digits, up to 60s.
const histMax = int64(60 * time.Second)

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, histMax, 3) }

func record(h *hdrhistogram.Histogram, d time.Duration) {
	h.RecordValue(min(max(int64(d), 1), histMax))
}

func latencyOf(h *hdrhistogram.Histogram) Latency {
	us := func(v int64) float64 { return float64(v) / 1e3 }
	return Latency{
		P50: us(h.ValueAtQuantile(50)), P99: us(h.ValueAtQuantile(99)), P999: us(h.ValueAtQuantile(99.9)),
		Max: us(h.Max()), Count: h.TotalCount(),
	}
}

// RunReqResp runs the request-response scenario: one handler answers
// "ping" with "pong"; sequential runs of cfg.Counts cycles, then parallel
// runs of cfg.ParallelCount cycles shared by P goroutines for each P in
// cfg.Parallel. The handler and the requesters live in this process, on
// separate connections (separate Conns for an embedded node). ctx bounds
// the whole scenario.
func RunReqResp(ctx context.Context, cfg Config) (*ReqRespResult, error) {
	cfg = cfg.withDefaults(false)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	res := &ReqRespResult{Scenario: "reqresp", Target: cfg.Target.String(), Kind: cfg.Target.Kind, Size: cfg.Size, Warmup: max(cfg.Warmup, 0)}
	err := runReqResp(ctx, &cfg, res)
	if err != nil {
		res.Error = err.Error()
	}
	return res, err
}

func runReqResp(ctx context.Context, cfg *Config, res *ReqRespResult) (err error) {
	d, err := newDriver(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		res.Notes = append(res.Notes, d.notes()...)
		d.close()
	}()
	ping, pong := body("ping", cfg.Size), body("pong", cfg.Size)
	if err := d.serve(ctx, pong); err != nil {
		return err
	}
	meter := newCPUMeter(cfg)
	defer func() { res.Process = meter.process() }()

	r, err := d.requester(ctx)
	if err != nil {
		return err
	}
	defer r.close()
	for i := range cfg.Warmup {
		if err := r.request(ctx, ping); err != nil {
			return fmt.Errorf("bench: warm-up cycle %d: %w", i, err)
		}
	}

	seqHist := newHist()
	first := meter.sample()
	var cycles int64
	defer func() {
		res.Latency = latencyOf(seqHist)
		res.CPU = meter.per(first, meter.sample(), cycles)
	}()
	for _, n := range cfg.Counts {
		run := Run{Cycles: n}
		h := newHist()
		var done atomic.Int64
		stop := progress(cfg, run.Name(), done.Load, int64(n))
		from := meter.sample()
		elapsed, err := sequential(ctx, r, ping, n, h, &done)
		to := meter.sample()
		stop()
		if err != nil {
			return fmt.Errorf("bench: %s: %w", run.Name(), err)
		}
		seqHist.Merge(h)
		cycles += int64(n)
		res.Runs = append(res.Runs, finish(run, elapsed, h, meter.per(from, to, int64(n))))
	}
	for _, p := range cfg.Parallel {
		run := Run{Parallel: p, Cycles: cfg.ParallelCount}
		rs := make([]requester, 0, p)
		for range p {
			r, err := d.requester(ctx)
			if err != nil {
				closeAll(rs)
				return err
			}
			rs = append(rs, r)
		}
		var next atomic.Int64
		stop := progress(cfg, run.Name(), func() int64 { return min(next.Load(), int64(run.Cycles)) }, int64(run.Cycles))
		from := meter.sample()
		elapsed, h, err := parallel(ctx, rs, ping, run.Cycles, &next)
		to := meter.sample()
		stop()
		closeAll(rs)
		if err != nil {
			return fmt.Errorf("bench: %s: %w", run.Name(), err)
		}
		cycles += int64(run.Cycles)
		res.Runs = append(res.Runs, finish(run, elapsed, h, meter.per(from, to, int64(run.Cycles))))
	}
	return nil
}

func finish(run Run, elapsed time.Duration, h *hdrhistogram.Histogram, cpu CPU) Run {
	run.Seconds = elapsed.Seconds()
	run.Rate = float64(run.Cycles) / elapsed.Seconds()
	run.Latency = latencyOf(h)
	run.CPU = cpu
	return run
}

func closeAll(rs []requester) {
	for _, r := range rs {
		r.close()
	}
}

// sequential runs n cycles one after the other and records each one's
// round trip.
func sequential(ctx context.Context, r requester, ping []byte, n int, h *hdrhistogram.Histogram, done *atomic.Int64) (time.Duration, error) {
	start := time.Now()
	prev := start
	for i := range n {
		if err := r.request(ctx, ping); err != nil {
			return 0, fmt.Errorf("cycle %d: %w", i, err)
		}
		now := time.Now()
		record(h, now.Sub(prev))
		prev = now
		done.Add(1)
	}
	return prev.Sub(start), nil
}

// parallel runs n cycles shared by one goroutine per requester: each
// takes the next cycle until none is left. The first error stops them.
func parallel(parent context.Context, rs []requester, ping []byte, n int, next *atomic.Int64) (time.Duration, *hdrhistogram.Histogram, error) {
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
		wg.Go(func() {
			h := hists[i]
			for next.Add(1) <= int64(n) {
				t := time.Now()
				if err := r.request(ctx, ping); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
				record(h, time.Since(t))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	all := newHist()
	for _, h := range hists {
		all.Merge(h)
	}
	if firstErr != nil && parent.Err() != nil {
		firstErr = parent.Err()
	}
	return elapsed, all, firstErr
}

// WriteText prints the result: the classic lines, then latency, CPU and
// memory, then a table by run.
func (res *ReqRespResult) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Request-response: %s, %d-byte ping and pong, %d warm-up cycles\n", res.Target, res.Size, res.Warmup)
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
		b.WriteString("\n")
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "run\tcycles/s\tp50 us\tp99 us\tp99.9 us\tbroker CPU us/cycle\tclient CPU us/cycle\t\n")
		for _, r := range res.Runs {
			broker := "?"
			if res.Process.Embedded {
				broker = "(same)"
			} else if r.CPU.Broker >= 0 {
				broker = strconv.FormatFloat(r.CPU.Broker, 'f', 1, 64)
			}
			fmt.Fprintf(tw, "%s\t%.0f\t%.1f\t%.1f\t%.1f\t%s\t%.1f\t\n", r.Name(), r.Rate,
				r.Latency.P50, r.Latency.P99, r.Latency.P999, broker, r.CPU.Client)
		}
		tw.Flush()
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
func (res *ReqRespResult) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}
