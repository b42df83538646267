package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Setting names a [Config] field that a scenario uses. The command line
// offers each scenario the flags of the settings it uses, under the same
// names everywhere.
type Setting uint

// Settings shared by scenarios.
const (
	// UsesSize: Config.Size, --size.
	UsesSize Setting = 1 << iota
	// UsesCount: Config.Count (Config.Counts for reqresp), --count.
	UsesCount
	// UsesDuration: Config.Duration, --duration.
	UsesDuration
	// UsesPublishers: Config.Publishers, --publishers.
	UsesPublishers
	// UsesSubscribers: Config.Subscribers, --subscribers.
	UsesSubscribers
	// UsesWorkers: Config.Workers, --workers (handlers, consumers).
	UsesWorkers
	// UsesRate: Config.Rate, --rate.
	UsesRate
	// UsesWarmup: Config.Warmup, --warmup.
	UsesWarmup
)

// Scenario is one kind of load. New scenarios are added to [Scenarios]
// with the settings they use; what they need from a broker beyond [driver]
// becomes an optional interface that the drivers able to map it
// implement, found by type assertion, and a target without it is
// refused with [ErrNoMapping].
type Scenario struct {
	// Name is the subcommand: "reqresp".
	Name string
	// Short is a one-line description.
	Short string
	// Uses lists the shared settings that apply.
	Uses Setting
	// Targets lists the kinds of broker the scenario maps onto.
	Targets []Kind
	// Run runs the scenario. It returns a result even on error, with
	// what was measured before it, unless the configuration is invalid.
	Run func(ctx context.Context, cfg Config) (Result, error)
}

// Has reports whether the scenario uses s.
func (sc Scenario) Has(s Setting) bool { return sc.Uses&s != 0 }

// Supports reports whether the scenario maps onto targets of kind k.
func (sc Scenario) Supports(k Kind) bool { return slices.Contains(sc.Targets, k) }

// ErrNoMapping is returned for a scenario that has no mapping onto the
// target's broker.
var ErrNoMapping = fmt.Errorf("bench: no mapping of this scenario onto the target")

var allKinds = []Kind{KindEmbedded, KindCourier, KindNATS, KindAMQP, KindEcho}

// Scenarios returns every scenario, in the order of the help text.
func Scenarios() []Scenario {
	return []Scenario{
		{
			Name:    "reqresp",
			Short:   "Request-response: sequential and parallel ping-pong cycles",
			Uses:    UsesSize | UsesCount | UsesDuration | UsesWorkers | UsesRate | UsesWarmup,
			Targets: allKinds,
			Run: func(ctx context.Context, cfg Config) (Result, error) {
				return nilIfNil(RunReqResp(ctx, cfg))
			},
		},
		{
			Name:    "pubsub",
			Short:   "Pub-sub: fan-out to N subscribers, or fan-in from N publishers, each on its own connection",
			Uses:    UsesSize | UsesCount | UsesDuration | UsesPublishers | UsesSubscribers | UsesRate | UsesWarmup,
			Targets: allKinds,
			Run: func(ctx context.Context, cfg Config) (Result, error) {
				return nilIfNil(RunPubSub(ctx, cfg))
			},
		},
		{
			Name:    "users",
			Short:   "Many users: N connections ramped up, each requesting and publishing at a rate",
			Uses:    UsesSize | UsesDuration | UsesWorkers,
			Targets: []Kind{KindEmbedded, KindCourier, KindNATS, KindEcho},
			Run: func(ctx context.Context, cfg Config) (Result, error) {
				return nilIfNil(RunUsers(ctx, cfg))
			},
		},
		{
			Name:    "mgmt",
			Short:   "Management API under load: N queues, hot ones loaded, GET /api/queues?columns=name,messages_ready polled and checked",
			Uses:    UsesSize | UsesDuration | UsesPublishers | UsesWorkers | UsesRate,
			Targets: []Kind{KindEmbedded, KindCourier},
			Run: func(ctx context.Context, cfg Config) (Result, error) {
				return nilIfNil(RunMgmt(ctx, cfg))
			},
		},
		{
			Name:    "tasks",
			Short:   "Durable tasks: one producer with pipelined confirms, workers with a prefetch acking each",
			Uses:    UsesSize | UsesCount | UsesDuration | UsesWorkers | UsesRate | UsesWarmup,
			Targets: allKinds,
			Run: func(ctx context.Context, cfg Config) (Result, error) {
				return nilIfNil(RunTasks(ctx, cfg))
			},
		},
		{
			Name:    "backlog",
			Short:   "Persister stress test: publish two, receive and ack one, until the queue is --depth deep; memory every --sample-every",
			Uses:    UsesSize | UsesDuration,
			Targets: allKinds,
			Run: func(ctx context.Context, cfg Config) (Result, error) {
				return nilIfNil(RunBacklog(ctx, cfg))
			},
		},
	}
}

// nilIfNil keeps a nil *T from becoming a non-nil Result.
func nilIfNil[T Result](res T, err error) (Result, error) {
	var zero T
	if any(res) == any(zero) {
		return nil, err
	}
	return res, err
}

// LookupScenario returns the scenario of a name.
func LookupScenario(name string) (Scenario, bool) {
	for _, sc := range Scenarios() {
		if sc.Name == name {
			return sc, true
		}
	}
	return Scenario{}, false
}

// Result is what a scenario measured.
type Result interface {
	// WriteText prints the result for people.
	WriteText(io.Writer) error
	// WriteJSON prints the result as one JSON object.
	WriteJSON(io.Writer) error
	// Metrics returns the headline figures, for courier-bench compare.
	Metrics() []Metric
	// Timeline returns the samples taken during the run, for charts.
	Timeline() Timeline
}

// Metric is one headline figure of a result.
type Metric struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	// Lower is true where lower is better (latency, CPU, memory).
	Lower bool `json:"lower_is_better,omitempty"`
}

// Timeline is a run's samples with what they belong to.
type Timeline struct {
	Title   string
	Samples []Sample
	// ByDepth plots the samples over their queue depth (Sample.Depth)
	// instead of their time.
	ByDepth bool
	// SentName, ReceivedName, LatencyName and DeliveryName, if set,
	// name the series of Sample.Sent, Received, Latency and Delivery in
	// the charts' legends.
	SentName, ReceivedName, LatencyName, DeliveryName string
}

// Report holds what every scenario reports besides its own figures.
type Report struct {
	Scenario string `json:"scenario"`
	Target   string `json:"target"`
	Kind     Kind   `json:"kind"`
	Size     int    `json:"size"`
	// Rate is the offered rate per second, 0 for as fast as possible.
	Rate float64 `json:"offered_rate,omitempty"`
	// Usage is what the server and this process used over the measured
	// part of the run.
	Usage   Usage   `json:"usage"`
	Process Process `json:"broker_process"`
	// Samples are taken every Config.Interval.
	Samples []Sample `json:"samples"`
	Notes   []string `json:"notes,omitempty"`
	Error   string   `json:"error,omitempty"`
}

func newReport(scenario string, cfg *Config) Report {
	return Report{Scenario: scenario, Target: cfg.Target.String(), Kind: cfg.Target.Kind, Size: cfg.Size, Rate: cfg.Rate}
}

// finish records what the sampler measured.
func (r *Report) finish(s *sampler, meter *cpuMeter) {
	r.Usage = s.stop()
	r.Samples = s.series()
	r.Process = meter.process()
}

// writeTail ends a result's text: the CPU per unit of work (with n of
// them), the usage lines, the notes and the error; then it writes the
// whole text to w.
func (r *Report) writeTail(w io.Writer, b *strings.Builder, cpu CPU, n int64, unit string) error {
	if n > 0 {
		for _, l := range r.Process.describe(cpu, unit) {
			b.WriteString(l + "\n")
		}
	}
	r.footer(b)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeLines writes lines, then a latency line for each latency that
// counted something.
func writeLines(b *strings.Builder, lines []string, lats ...namedLatency) {
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	for _, l := range lats {
		if l.l.Count > 0 {
			b.WriteString(latencyLine(l.what, l.l, l.unit) + "\n")
		}
	}
}

// namedLatency is a latency line's content: "<what> latency ... (N <unit>)".
type namedLatency struct {
	what string
	l    Latency
	unit string
}

// footer writes the usage lines, the notes and the error.
func (r *Report) footer(b *strings.Builder) {
	if r.Usage.Seconds > 0 {
		for _, l := range r.Usage.lines(r.Process) {
			b.WriteString(l + "\n")
		}
	}
	for _, n := range r.Notes {
		b.WriteString("Note: " + n + "\n")
	}
	if r.Error != "" {
		b.WriteString("Error: " + r.Error + "\n")
	}
}

// usageMetrics are the server's figures every scenario offers compare:
// its CPU per unit of work (n of them), or with no unit its average
// cores over the run, and its peak memory.
func (r *Report) usageMetrics(n int64, unit string) []Metric {
	var m []Metric
	switch u := r.Usage; {
	case u.ServerCPUSeconds < 0 || r.Process.Embedded:
	case unit == "" && u.Seconds > 0:
		m = append(m, Metric{Name: "server CPU", Value: u.ServerCPUSeconds / u.Seconds, Unit: "cores", Lower: true})
	case n > 0:
		m = append(m, Metric{Name: "server CPU per " + unit, Value: u.ServerCPUSeconds * 1e6 / float64(n), Unit: "us", Lower: true})
	}
	if r.Usage.ServerPeakRSS > 0 {
		m = append(m, Metric{Name: "server peak RSS", Value: float64(r.Usage.ServerPeakRSS) / 1e6, Unit: "MB", Lower: true})
	}
	return m
}

func latencyMetrics(prefix string, l Latency) []Metric {
	if l.Count == 0 {
		return nil
	}
	return []Metric{
		{Name: prefix + " p50", Value: l.P50, Unit: "us", Lower: true},
		{Name: prefix + " p99", Value: l.P99, Unit: "us", Lower: true},
	}
}

// latencyLine is "<what> latency p50 1.2 us, p90 ..., max 9.9 us (N <unit>)".
func latencyLine(what string, l Latency, unit string) string {
	return fmt.Sprintf("%s latency p50 %.1f us, p90 %.1f us, p99 %.1f us, p99.9 %.1f us, max %.1f us (%d %s)",
		what, l.P50, l.P90, l.P99, l.P999, l.Max, l.Count, unit)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
