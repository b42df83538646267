package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// TasksResult is what the tasks scenario measured.
type TasksResult struct {
	Report
	Workers  int `json:"workers"`
	Prefetch int `json:"prefetch"`
	Window   int `json:"window"`
	// Tasks is the count asked for; 0 for a run bounded by time.
	Tasks    int     `json:"tasks"`
	Duration float64 `json:"duration_s,omitempty"`
	Warmup   int     `json:"warmup"`
	// Produced counts the tasks the broker confirmed, over the time from
	// the first submit to the last confirm.
	Produced       int64   `json:"produced"`
	ProduceSeconds float64 `json:"produce_seconds"`
	ProduceRate    float64 `json:"produced_per_s"`
	// Failed counts the submits the broker refused or failed.
	Failed int64 `json:"failed"`
	// Consumed counts the tasks the workers handled (and acked) once,
	// over the time from the first submit to the last of them.
	Consumed       int64   `json:"consumed"`
	ConsumeSeconds float64 `json:"consume_seconds"`
	ConsumeRate    float64 `json:"consumed_per_s"`
	// Missing is Produced - Consumed: confirmed tasks not handled when
	// they stopped coming (for Config.Drain) or the time ran out.
	Missing int64 `json:"missing"`
	// Duplicates counts deliveries of tasks already handled.
	Duplicates int64 `json:"duplicates"`
	// ConfirmLatency is from submit (or, with a rate, from when the
	// task was due) to the broker's confirm; Latency from then to the
	// worker's handling, end to end.
	ConfirmLatency Latency `json:"confirm_latency_us"`
	Latency        Latency `json:"latency_us"`
	// CPU is per consumed task.
	CPU CPU `json:"cpu_per_task"`
}

// seenSet records which task sequence numbers were handled, to count
// duplicates.
type seenSet struct {
	mu   sync.Mutex // guards bits
	bits []uint64
}

// add marks seq seen and reports whether it was new.
func (s *seenSet) add(seq uint64) bool {
	i, bit := seq/64, uint64(1)<<(seq%64)
	s.mu.Lock()
	defer s.mu.Unlock()
	if i >= uint64(len(s.bits)) {
		s.bits = append(s.bits, make([]uint64, int(i)+1-len(s.bits)+len(s.bits)/2)...)
	}
	if s.bits[i]&bit != 0 {
		return false
	}
	s.bits[i] |= bit
	return true
}

// RunTasks runs the tasks scenario: one producer submits cfg.Count
// persistent tasks of cfg.Size bytes (or for cfg.Duration) to a durable
// queue, with publisher confirms pipelined up to cfg.Queue.Window
// outstanding, as fast as the broker confirms them or at cfg.Rate;
// cfg.Workers workers, each on its own connection with a prefetch of
// cfg.Queue.Prefetch, handle and ack each. It reports the produce and
// consume rates, the confirm latency and the end-to-end latency from
// submit to handling. ctx bounds the whole scenario.
func RunTasks(ctx context.Context, cfg Config) (*TasksResult, error) {
	cfg = cfg.withDefaults("tasks")
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	res := &TasksResult{
		Report: newReport("tasks", &cfg), Workers: cfg.Workers, Prefetch: cfg.Queue.Prefetch,
		Window: cfg.Queue.Window, Tasks: cfg.Count, Duration: cfg.Duration.Seconds(), Warmup: max(cfg.Warmup, 0),
	}
	err := runTasks(ctx, &cfg, res)
	if err != nil {
		res.Error = err.Error()
	}
	return res, err
}

func runTasks(ctx context.Context, cfg *Config, res *TasksResult) error {
	if cfg.Size < stampSize {
		return fmt.Errorf("bench: tasks need a size of at least %d bytes (sequence number and time stamp)", stampSize)
	}
	d, closeDriver, err := openDriver(ctx, cfg, &res.Report)
	if err != nil {
		return err
	}
	defer closeDriver()
	qd, name, deleteQueue, err := openQueue(ctx, d, cfg, "tasks")
	if err != nil {
		return err
	}
	defer deleteQueue()

	epoch := time.Now()
	e2e, confirmLat := newRecorder(cfg.Workers), newRecorder(1)
	var seen seenSet
	var consumed, dups atomic.Int64
	for i := range cfg.Workers {
		err := qd.consume(ctx, name, cfg.Queue.Prefetch, func(m delivery) {
			b := m.body()
			if len(b) >= stampSize {
				if seen.add(binary.BigEndian.Uint64(b)) {
					e2e.record(i, time.Since(epoch)-time.Duration(binary.BigEndian.Uint64(b[8:])))
					consumed.Add(1)
				} else {
					dups.Add(1)
				}
			}
			m.ack()
		})
		if err != nil {
			return err
		}
	}
	p, err := qd.producer(ctx, name)
	if err != nil {
		return err
	}
	var seq uint64
	stamped := func(due time.Time) []byte {
		b := body("task", cfg.Size)
		seq++
		binary.BigEndian.PutUint64(b, seq)
		binary.BigEndian.PutUint64(b[8:], uint64(due.Sub(epoch)))
		return b
	}

	defer unblockAtEnd(ctx, p)()

	if cfg.Warmup > 0 {
		wc := newConfirmer(p, cfg.Queue.Window, epoch, nil)
		for range cfg.Warmup {
			now := time.Now()
			if err := wc.submit(ctx, stamped(now), now); err != nil {
				return fmt.Errorf("bench: warm-up: %w", err)
			}
		}
		if err := wc.wait(ctx); err != nil {
			return fmt.Errorf("bench: warm-up: %w", err)
		}
		awaitDeliveries(ctx, consumed.Load, wc.confirmed.Load(), epoch, cfg.Drain)
	}
	base := consumed.Load()
	measured := func() int64 { return consumed.Load() - base }

	meter := newCPUMeter(cfg)
	c := newConfirmer(p, cfg.Queue.Window, epoch, confirmLat)
	pr := probe{sent: c.confirmed.Load, received: measured, errors: c.failed.Load, lat: confirmLat, del: e2e}
	if cfg.Rate > 0 {
		pr.offered = func() float64 { return cfg.Rate }
	}
	smp := startSampler(pr, meter, cfg.Interval)
	defer func() { res.ConfirmLatency, res.Latency = smp.latency() }()
	defer res.finish(smp, meter)

	b := newBudget(cfg.Count, cfg.Duration)
	pace := newPacer(cfg.Rate, 0)
	smp.setStage("producing")
	stop := progress(cfg, "Produced", c.confirmed.Load, total(cfg.Count))
	from := meter.sample()
	start := time.Now()
	var prodErr error
	for n := 0; ; n++ {
		if _, ok := b.take(); !ok {
			break
		}
		due, ok := pace.wait(ctx)
		if !ok {
			prodErr = fmt.Errorf("bench: submitted %d tasks before the time ran out: %w", n, ctx.Err())
			break
		}
		if err := c.submit(ctx, stamped(due), due); err != nil {
			prodErr = fmt.Errorf("bench: submit %d: %w", n+1, err)
			if ctx.Err() != nil {
				prodErr = fmt.Errorf("bench: submitted %d tasks before the time ran out: %w", n, ctx.Err())
			}
			break
		}
	}
	if prodErr == nil {
		prodErr = c.wait(ctx)
	}
	stop()
	res.Produced, res.Failed = c.confirmed.Load(), c.failed.Load()
	res.ProduceSeconds = c.lastConfirm().Sub(start).Seconds()
	if res.ProduceSeconds > 0 {
		res.ProduceRate = float64(res.Produced) / res.ProduceSeconds
	}

	// Wait for the workers until they handled every confirmed task,
	// none came for cfg.Drain, or the time is up.
	smp.setStage("consuming")
	stop = progress(cfg, "Consumed", measured, res.Produced)
	last, lastAt := measured(), time.Now()
	if prodErr == nil {
		last, lastAt = awaitDeliveries(ctx, measured, res.Produced, start, cfg.Drain)
	}
	stop()
	res.CPU = meter.per(from, meter.sample(), last)
	res.Consumed = last
	res.ConsumeSeconds = lastAt.Sub(start).Seconds()
	if res.ConsumeSeconds > 0 {
		res.ConsumeRate = float64(last) / res.ConsumeSeconds
	}
	res.Missing = max(res.Produced-last, 0)
	res.Duplicates = dups.Load()
	if res.Missing > 0 && ctx.Err() != nil {
		res.Notes = append(res.Notes, "the time ran out before the workers handled every task; the rest are counted as missing")
	}
	return prodErr
}

// Lines are the result's headline lines:
//
//	Produced 1000000 tasks in ~9 seconds (111111 tasks/s, confirmed)
//	Consumed 1000000 tasks in ~10 seconds (100000 tasks/s, acked)
//	Missing 0 of 1000000 confirmed tasks, 0 duplicates, 0 failed submits
func (res *TasksResult) Lines() []string {
	r := func(x float64) int64 { return int64(math.Round(x)) }
	return []string{
		fmt.Sprintf("Produced %d tasks in ~%d seconds (%d tasks/s, confirmed)", res.Produced, r(res.ProduceSeconds), r(res.ProduceRate)),
		fmt.Sprintf("Consumed %d tasks in ~%d seconds (%d tasks/s, acked)", res.Consumed, r(res.ConsumeSeconds), r(res.ConsumeRate)),
		fmt.Sprintf("Missing %d of %d confirmed tasks, %d duplicates, %d failed submits", res.Missing, res.Produced, res.Duplicates, res.Failed),
	}
}

// WriteText prints the result.
func (res *TasksResult) WriteText(w io.Writer) error {
	var b strings.Builder
	amount := fmt.Sprintf("%d tasks", res.Tasks)
	if res.Tasks == 0 {
		amount = fmt.Sprintf("%gs of tasks", res.Duration)
	}
	fmt.Fprintf(&b, "Tasks: %s, 1 producer (confirms, window %d), %d worker(s) (prefetch %d, ack each), %s of %d bytes, persistent",
		res.Target, res.Window, res.Workers, res.Prefetch, amount, res.Size)
	if res.Rate > 0 {
		fmt.Fprintf(&b, ", offered %.0f tasks/s", res.Rate)
	}
	b.WriteString("\n")
	writeLines(&b, res.Lines(), namedLatency{"Confirm", res.ConfirmLatency, "confirms"},
		namedLatency{"End-to-end (submit to handling)", res.Latency, "tasks"})
	return res.writeTail(w, &b, res.CPU, res.Consumed, "task")
}

// WriteJSON prints the result as one JSON object.
func (res *TasksResult) WriteJSON(w io.Writer) error { return writeJSON(w, res) }

// Metrics returns the produce and consume rates, the tasks missing, the
// latencies and the server's CPU per task and memory.
func (res *TasksResult) Metrics() []Metric {
	m := []Metric{
		{Name: "produced", Value: res.ProduceRate, Unit: "tasks/s"},
		{Name: "consumed", Value: res.ConsumeRate, Unit: "tasks/s"},
		{Name: "missing", Value: float64(res.Missing), Unit: "tasks", Lower: true},
	}
	m = append(m, latencyMetrics("end-to-end latency", res.Latency)...)
	m = append(m, latencyMetrics("confirm latency", res.ConfirmLatency)...)
	return append(m, res.usageMetrics(res.Consumed, "task")...)
}

// Timeline returns the run's samples: sent are confirms, received
// handled tasks.
func (res *TasksResult) Timeline() Timeline {
	return Timeline{Title: "tasks: " + res.Target, Samples: res.Samples, SentName: "confirmed", ReceivedName: "consumed",
		LatencyName: "confirm", DeliveryName: "end-to-end"}
}
