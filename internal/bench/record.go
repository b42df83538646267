package bench

import (
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Latency holds percentiles of round-trip or delivery times, in
// microseconds.
type Latency struct {
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
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
	if h.TotalCount() == 0 {
		return Latency{}
	}
	us := func(v int64) float64 { return float64(v) / 1e3 }
	return Latency{
		P50: us(h.ValueAtQuantile(50)), P90: us(h.ValueAtQuantile(90)), P99: us(h.ValueAtQuantile(99)),
		P999: us(h.ValueAtQuantile(99.9)), Max: us(h.Max()), Count: h.TotalCount(),
	}
}

// maxShards bounds a recorder's histograms (about 220 KB each).
const maxShards = 16

// recorder collects times from many goroutines, for the whole run and
// for the sampler's intervals. Each goroutine records into the shard of
// its index, so that they seldom wait for each other.
type recorder struct {
	shards []recShard
}

type recShard struct {
	mu sync.Mutex // guards h
	h  *hdrhistogram.Histogram
	_  [48]byte // keeps shards on separate cache lines
}

func newRecorder(goroutines int) *recorder {
	r := &recorder{shards: make([]recShard, min(max(goroutines, 1), maxShards))}
	for i := range r.shards {
		r.shards[i].h = newHist()
	}
	return r
}

// record adds d to the shard of goroutine i. Safe for concurrent use.
func (r *recorder) record(i int, d time.Duration) {
	s := &r.shards[i%len(r.shards)]
	s.mu.Lock()
	record(s.h, d)
	s.mu.Unlock()
}

// takeInto merges what was recorded since the last take into into, and
// forgets it.
func (r *recorder) takeInto(into *hdrhistogram.Histogram) {
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		if s.h.TotalCount() > 0 {
			into.Merge(s.h)
			s.h.Reset()
		}
		s.mu.Unlock()
	}
}

// Sample is one interval of a run: its rates, the latencies recorded in
// it and the server's CPU and memory.
type Sample struct {
	// T is the end of the interval, in seconds since the run started.
	T float64 `json:"t_s"`
	// Stage names what the scenario was doing, such as "Parallel 10".
	Stage string `json:"stage,omitempty"`
	// Users is the number of connected simulated users (users scenario).
	Users int64 `json:"users,omitempty"`
	// Depth is the queue's depth (backlog scenario).
	Depth int64 `json:"queue_depth,omitempty"`
	// Sent is the rate of requests or publishes, Received of responses
	// or deliveries, per second over the interval.
	Sent     float64 `json:"sent_per_s"`
	Received float64 `json:"received_per_s"`
	// Published is the rate of publishes where a scenario both requests
	// (Sent) and publishes (users).
	Published float64 `json:"published_per_s,omitempty"`
	// Offered is the rate the scenario meant to send at (with a rate
	// limit), per second.
	Offered float64 `json:"offered_per_s,omitempty"`
	// Errors counts failed requests or publishes in the interval.
	Errors int64 `json:"errors,omitempty"`
	// Latency covers the round trips (or deliveries) of the interval;
	// Delivery, where a scenario has both, the deliveries.
	Latency  Latency `json:"latency_us"`
	Delivery Latency `json:"delivery_latency_us,omitzero"`
	// ServerCPU and ClientCPU are the cores the server and this process
	// kept busy on average over the interval; ServerCPU is -1 when
	// unknown, and the same as ClientCPU for an embedded node.
	ServerCPU float64 `json:"server_cpu_cores"`
	ClientCPU float64 `json:"client_cpu_cores"`
	// ServerRSS is the server's resident memory at the end of the
	// interval, in bytes; 0 when unknown.
	ServerRSS int64 `json:"server_rss_bytes,omitempty"`
}

// probe is what a scenario lets the sampler read. Counters are
// cumulative and safe to read from another goroutine; nil ones are left
// out.
type probe struct {
	sent, received, published, errors, users func() int64
	// offered returns the rate the scenario offers now, per second; a
	// sample holds the mean of its values at the interval's ends.
	offered func() float64
	// lat holds round-trip (or delivery) times; del, if not nil,
	// delivery times where a scenario has both.
	lat, del *recorder
}

// sampler takes a [Sample] every interval from a probe until stopped,
// keeps the run's total latencies, and tracks the server's peak resident
// memory over the run.
type sampler struct {
	p        probe
	meter    *cpuMeter
	interval time.Duration

	start    time.Time
	from     cpuSample
	quit     chan struct{}
	finished chan struct{}

	mu       sync.Mutex // guards everything below
	stage    string
	samples  []Sample
	lat, del *hdrhistogram.Histogram // the whole run's
	last     struct {
		at                              time.Time
		sent, received, published, errs int64
		offered                         float64
		cpu                             cpuSample
	}
	peakRSS int64
	to      cpuSample // at stop
	end     time.Time
}

// startSampler discards what the probe's recorders hold (warm-up) and
// samples every interval until stop.
func startSampler(p probe, meter *cpuMeter, interval time.Duration) *sampler {
	s := &sampler{
		p: p, meter: meter, interval: interval,
		quit: make(chan struct{}), finished: make(chan struct{}),
		lat: newHist(), del: newHist(),
	}
	for _, r := range []*recorder{p.lat, p.del} {
		if r != nil {
			r.takeInto(newHist())
		}
	}
	s.start = time.Now()
	s.from = meter.sample()
	s.last.at, s.last.cpu = s.start, s.from
	s.last.sent, s.last.received, s.last.errs = get(p.sent), get(p.received), get(p.errors)
	s.last.published = get(p.published)
	if p.offered != nil {
		s.last.offered = p.offered()
	}
	s.peakRSS = meter.rss()
	go s.loop()
	return s
}

func get(f func() int64) int64 {
	if f == nil {
		return 0
	}
	return f()
}

func (s *sampler) loop() {
	defer close(s.finished)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.take(false)
		case <-s.quit:
			s.take(true)
			return
		}
	}
}

// setStage names the samples taken from now on.
func (s *sampler) setStage(stage string) {
	s.mu.Lock()
	s.stage = stage
	s.mu.Unlock()
}

// take appends the sample of the interval that ends now. A last
// interval shorter than a tenth of the others is folded into the totals
// only.
func (s *sampler) take(last bool) {
	now := time.Now()
	cpu := s.meter.sample()
	rss := s.meter.rss()
	lat, del := newHist(), newHist()
	if s.p.lat != nil {
		s.p.lat.takeInto(lat)
	}
	if s.p.del != nil {
		s.p.del.takeInto(del)
	}
	sent, received, errs := get(s.p.sent), get(s.p.received), get(s.p.errors)
	published := get(s.p.published)
	var offered float64
	if s.p.offered != nil {
		offered = s.p.offered()
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.lat.Merge(lat)
	s.del.Merge(del)
	s.peakRSS = max(s.peakRSS, rss)
	if last {
		s.to, s.end = cpu, now
	}
	secs := now.Sub(s.last.at).Seconds()
	if secs <= 0 || (last && secs < s.interval.Seconds()/10) {
		return
	}
	smp := Sample{
		T:         now.Sub(s.start).Seconds(),
		Stage:     s.stage,
		Users:     get(s.p.users),
		Sent:      float64(sent-s.last.sent) / secs,
		Received:  float64(received-s.last.received) / secs,
		Published: float64(published-s.last.published) / secs,
		Offered:   (offered + s.last.offered) / 2,
		Errors:    errs - s.last.errs,
		Latency:   latencyOf(lat),
		Delivery:  latencyOf(del),
		ServerCPU: -1,
		ClientCPU: (cpu.client - s.last.cpu.client).Seconds() / secs,
		ServerRSS: rss,
	}
	if cpu.broker >= 0 && s.last.cpu.broker >= 0 {
		smp.ServerCPU = (cpu.broker - s.last.cpu.broker).Seconds() / secs
	}
	s.samples = append(s.samples, smp)
	s.last.at, s.last.cpu = now, cpu
	s.last.sent, s.last.received, s.last.errs = sent, received, errs
	s.last.published, s.last.offered = published, offered
}

// stop takes the last sample and returns the run's usage.
func (s *sampler) stop() Usage {
	close(s.quit)
	<-s.finished
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.meter.usage(s.from, s.to, s.end.Sub(s.start), s.peakRSS)
}

// series returns the samples taken.
func (s *sampler) series() []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Sample(nil), s.samples...)
}

// latency returns the percentiles of every time recorded in the run;
// delivery, those of the probe's del recorder.
func (s *sampler) latency() (lat, delivery Latency) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return latencyOf(s.lat), latencyOf(s.del)
}
