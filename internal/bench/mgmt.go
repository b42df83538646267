package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier"
)

// MgmtConfig configures the mgmt scenario: the management API polled
// while the broker is under load. Zero fields take their defaults.
type MgmtConfig struct {
	// Queues is the number of queues (durable task exchanges) created.
	// Default: 10000.
	Queues int
	// Hot is how many of them take the full load: the producers submit
	// to them and the workers ack from them. Default: 8.
	Hot int
	// Idle is how many are filled with a known number of messages
	// before the load and then left alone: the API must show exactly
	// that number. Default: a tenth of Queues.
	Idle int
	// Trickle is the messages per second submitted, round-robin, to the
	// queues that are neither hot nor idle (no consumer takes them).
	// Default: 1000; negative for none.
	Trickle float64
	// Poll is how often the API is asked for the queue list. Default:
	// 100ms.
	Poll time.Duration
	// HTTP is the management API's base URL, such as
	// "http://127.0.0.1:7480", for a server target; an embedded node
	// serves its own on 127.0.0.1:0. Default: "http://127.0.0.1:7480"
	// for a server.
	HTTP string
	// Window bounds each producer's submits awaiting their confirm.
	// Default: 1000.
	Window int
	// Prefetch is each worker's credit on each hot queue. Default: 100.
	Prefetch int
}

// DefaultMgmtHTTP is the management URL the mgmt scenario polls on a
// server target without [MgmtConfig.HTTP].
const DefaultMgmtHTTP = "http://127.0.0.1:7480"

// mgmtQuery is what the scenario asks of the API: every queue's name and
// depth, the query an operator's script runs.
const mgmtQuery = "/api/queues?columns=name,messages_ready"

func (m MgmtConfig) withDefaults(target Kind) MgmtConfig {
	if m.Queues == 0 {
		m.Queues = 10000
	}
	if m.Hot == 0 {
		m.Hot = min(8, m.Queues)
	}
	if m.Idle == 0 {
		m.Idle = max(m.Queues/10, 1)
	}
	m.Idle = min(m.Idle, m.Queues-m.Hot)
	if m.Trickle == 0 {
		m.Trickle = 1000
	}
	if m.Poll == 0 {
		m.Poll = 100 * time.Millisecond
	}
	if m.HTTP == "" && target == KindCourier {
		m.HTTP = DefaultMgmtHTTP
	}
	if m.Window == 0 {
		m.Window = 1000
	}
	if m.Prefetch == 0 {
		m.Prefetch = 100
	}
	return m
}

func (m MgmtConfig) validate() error {
	switch {
	case m.Queues < 0 || m.Queues > maxMgmtQueues:
		return fmt.Errorf("bench: queues must be between 1 and %d, got %d", maxMgmtQueues, m.Queues)
	case m.Hot < 0 || m.Hot > m.Queues && m.Queues > 0:
		return fmt.Errorf("bench: hot queues must be between 1 and the number of queues, got %d", m.Hot)
	case m.Idle < 0 || m.Poll < 0 || m.Window < 0 || m.Prefetch < 0:
		return errors.New("bench: idle, poll, window and prefetch must be positive")
	case m.Prefetch > 65535:
		return fmt.Errorf("bench: prefetch at most 65535, got %d", m.Prefetch)
	}
	if m.HTTP != "" {
		u, err := url.Parse(m.HTTP)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("bench: --http %q: want the management API's base URL, such as %s", m.HTTP, DefaultMgmtHTTP)
		}
	}
	return nil
}

// maxMgmtQueues bounds the queues the mgmt scenario creates.
const maxMgmtQueues = 1000000

// MgmtResult is what the mgmt scenario measured.
type MgmtResult struct {
	Report
	Queues    int     `json:"queues"`
	Hot       int     `json:"hot_queues"`
	Idle      int     `json:"idle_queues"`
	Trickle   float64 `json:"trickle_per_s"`
	Producers int     `json:"producers"`
	Workers   int     `json:"workers"`
	Duration  float64 `json:"duration_s"`
	// URL is the query polled; PollMs its period.
	URL    string  `json:"url"`
	PollMs float64 `json:"poll_ms"`
	// SetupSeconds is the time taken to declare the queues,
	// PreloadSeconds to fill the idle ones.
	SetupSeconds   float64 `json:"setup_s"`
	PreloadSeconds float64 `json:"preload_s"`
	Preloaded      int64   `json:"preloaded"`
	// Confirmed tasks submitted to the hot queues, and Delivered from
	// them (each acked at once), during the measured load; rates per
	// second over it.
	Confirmed    int64   `json:"confirmed"`
	SubmitErrors int64   `json:"submit_errors"`
	Delivered    int64   `json:"delivered"`
	PublishRate  float64 `json:"publish_per_s"`
	DeliverRate  float64 `json:"deliver_per_s"`
	// TrickleConfirmed counts the trickle's confirmed submits.
	TrickleConfirmed int64 `json:"trickle_confirmed"`
	// Polls answered, PollErrors failed, SlowPolls took longer than the
	// poll period.
	Polls       int64   `json:"polls"`
	PollErrors  int64   `json:"poll_errors"`
	SlowPolls   int64   `json:"slow_polls"`
	PollLatency Latency `json:"poll_latency_us"`
	// ResponseBytes is the mean size of an answer's body.
	ResponseBytes int64 `json:"response_bytes"`
	// Handler is the server's own view of the same answers, from its
	// courier_http_request_duration_seconds histogram: the time in the
	// handler, from the request read to the last byte written, as the
	// bucket bounds that hold p50, p90 and p99 (ms); nil if unknown.
	Handler *HandlerTimes `json:"handler_ms,omitempty"`
	// Checks counts the answers checked for exactness (about one a
	// second), Checked the figures compared, Wrong those out of their
	// bounds, Missing the queues absent from an answer.
	Checks  int64 `json:"checks"`
	Checked int64 `json:"checked"`
	Wrong   int64 `json:"wrong"`
	Missing int64 `json:"missing"`
	// LoadAvg is the machine's load average (1, 5 and 15 minutes) at
	// the start and at the end of the measured load.
	LoadAvgStart [3]float64 `json:"loadavg_start"`
	LoadAvgEnd   [3]float64 `json:"loadavg_end"`
}

// mgmtRun is the state the scenario's goroutines share.
type mgmtRun struct {
	cfg    *Config
	m      MgmtConfig
	d      *courierDriver
	prefix string
	body   []byte
	base   string // the management API's base URL

	tasks []*courier.Tasks // by queue, on the setup connections
	// submitted and confirmed count, by queue, the idle and trickle
	// queues' submits: a queue's depth is at least what was confirmed
	// before a request and at most what was submitted after its answer.
	submitted, confirmed []atomic.Int64

	hotConfirmed, hotErrors, delivered atomic.Int64
	trickleConfirmed, trickleErrors    atomic.Int64

	polls, pollErrs, slow, bytes atomic.Int64
	lat                          *recorder
	checks, checked              atomic.Int64
	wrong, missing               atomic.Int64

	errMu     sync.Mutex // guards firstErrs
	firstErrs []string
}

// RunMgmt runs the mgmt scenario: it declares cfg.Mgmt.Queues durable
// task exchanges, fills the idle ones with a known number of tasks,
// then for cfg.Duration drives the hot ones with cfg.Publishers
// producers (pipelined SubmitAsync, as fast as confirmed or at cfg.Rate
// in all) and cfg.Workers workers that ack,
// trickles tasks into the others, and polls GET
// /api/queues?columns=name,messages_ready every cfg.Mgmt.Poll, timing
// each answer to its last byte. About once a second it checks an answer
// against what the scenario knows: every queue listed once, each idle
// queue at exactly its depth, each trickle queue between what was
// confirmed before the request and what was submitted after the answer.
// It runs on Courier only: an embedded node (serving its management API
// on 127.0.0.1:0) or a server with cfg.Mgmt.HTTP.
func RunMgmt(ctx context.Context, cfg Config) (*MgmtResult, error) {
	cfg = cfg.withDefaults("mgmt")
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Target.Kind != KindEmbedded && cfg.Target.Kind != KindCourier {
		return nil, fmt.Errorf("%w: mgmt polls Courier's management API; %s has none of its own", ErrNoMapping, cfg.Target)
	}
	if cfg.Duration == 0 {
		cfg.Duration = 30 * time.Second
	}
	m := cfg.Mgmt
	res := &MgmtResult{
		Report: newReport("mgmt", &cfg), Queues: m.Queues, Hot: m.Hot, Idle: m.Idle, Trickle: max(m.Trickle, 0),
		Producers: cfg.Publishers, Workers: cfg.Workers, Duration: cfg.Duration.Seconds(),
		PollMs: float64(m.Poll) / 1e6,
	}
	err := runMgmt(ctx, &cfg, res)
	if err != nil {
		res.Error = err.Error()
	}
	return res, err
}

func runMgmt(ctx context.Context, cfg *Config, res *MgmtResult) error {
	if cfg.Target.Kind == KindEmbedded {
		cfg.embeddedHTTP = "127.0.0.1:0"
	}
	d, err := newCourierDriver(ctx, cfg)
	if err != nil {
		return err
	}
	m := cfg.Mgmt
	st := &mgmtRun{
		cfg: cfg, m: m, d: d, prefix: names("mgmt"), body: body("task", cfg.Size), base: m.HTTP,
		tasks:     make([]*courier.Tasks, m.Queues),
		submitted: make([]atomic.Int64, m.Queues), confirmed: make([]atomic.Int64, m.Queues),
		lat: newRecorder(1),
	}
	if d.node != nil {
		st.base = d.node.HTTPURL()
	}
	res.URL = st.base + mgmtQuery
	defer func() {
		res.Notes = append(res.Notes, d.notes()...)
		st.cleanup()
		d.close()
	}()

	t0 := time.Now()
	if err := st.declare(ctx); err != nil {
		return err
	}
	res.SetupSeconds = time.Since(t0).Seconds()
	t0 = time.Now()
	n, err := st.preload(ctx)
	res.Preloaded = n
	if err != nil {
		return err
	}
	res.PreloadSeconds = time.Since(t0).Seconds()
	// One answer before the load: the API must list every queue.
	if _, err := st.poll(ctx, true, nil); err != nil {
		return fmt.Errorf("bench: %s: %w", res.URL, err)
	}
	hist0, _ := st.handlerHist(ctx)
	st.polls.Store(0)
	st.bytes.Store(0)
	st.lat.takeInto(newHist())

	meter := newCPUMeter(cfg)
	pr := probe{
		sent: st.hotConfirmed.Load, received: st.delivered.Load, published: st.trickleConfirmed.Load,
		errors: func() int64 {
			return st.hotErrors.Load() + st.trickleErrors.Load() + st.pollErrs.Load() + st.wrong.Load()
		},
		lat: st.lat,
	}
	if err := st.startWorkers(ctx); err != nil {
		return err
	}
	res.LoadAvgStart = loadAvg()
	smp := startSampler(pr, meter, cfg.Interval)
	smp.setStage("load")
	start := time.Now()
	base := [2]int64{st.hotConfirmed.Load(), st.delivered.Load()}
	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	stopProgress := progress(cfg, "Load", func() int64 { return int64(time.Since(start).Seconds()) }, int64(cfg.Duration.Seconds()))
	var wg sync.WaitGroup
	for i := range cfg.Publishers {
		wg.Go(func() { st.produce(runCtx, i) })
	}
	wg.Go(func() { st.trickle(runCtx) })
	checks := make(chan check, 1)
	wg.Go(func() {
		for c := range checks {
			st.check(c)
		}
	})
	st.pollLoop(runCtx, ctx, checks)
	close(checks)
	wg.Wait()
	stopProgress()
	secs := time.Since(start).Seconds()
	if hist1, err := st.handlerHist(ctx); err == nil && hist0 != nil {
		res.Handler = handlerTimes(hist0, hist1)
	}
	res.LoadAvgEnd = loadAvg()
	res.finish(smp, meter)
	res.PollLatency, _ = smp.latency()
	res.Confirmed, res.Delivered = st.hotConfirmed.Load()-base[0], st.delivered.Load()-base[1]
	res.PublishRate, res.DeliverRate = float64(res.Confirmed)/secs, float64(res.Delivered)/secs
	res.SubmitErrors = st.hotErrors.Load() + st.trickleErrors.Load()
	res.TrickleConfirmed = st.trickleConfirmed.Load()
	res.Polls, res.PollErrors, res.SlowPolls = st.polls.Load(), st.pollErrs.Load(), st.slow.Load()
	if res.Polls > 0 {
		res.ResponseBytes = st.bytes.Load() / res.Polls
	}
	res.Checks, res.Checked, res.Wrong, res.Missing = st.checks.Load(), st.checked.Load(), st.wrong.Load(), st.missing.Load()
	st.errMu.Lock()
	res.Notes = append(res.Notes, st.firstErrs...)
	st.errMu.Unlock()
	return ctx.Err()
}

// fail keeps the first few errors for the report's notes.
func (st *mgmtRun) fail(format string, args ...any) {
	st.errMu.Lock()
	if len(st.firstErrs) < 8 {
		st.firstErrs = append(st.firstErrs, fmt.Sprintf(format, args...))
	}
	st.errMu.Unlock()
}

// queueName is queue i's name: numbered with zeros, so that the API's
// name order is the numeric one.
func (st *mgmtRun) queueName(i int) string { return fmt.Sprintf("%s.q%07d", st.prefix, i) }

// Queues 0 to Hot-1 are hot, the next Idle are idle, the rest trickle.
func (st *mgmtRun) hot(i int) bool  { return i < st.m.Hot }
func (st *mgmtRun) idle(i int) bool { return i >= st.m.Hot && i < st.m.Hot+st.m.Idle }

// idleDepth is the number of tasks idle queue i holds: 1 to 7.
func idleDepth(i int) int { return 1 + i%7 }

// setupConns is how many connections declare the queues together.
const setupConns = 8

// declare declares every queue from setupConns connections, 8
// goroutines each: durable declarations share the store's syncs.
func (st *mgmtRun) declare(ctx context.Context) error {
	conns := make([]*courier.Conn, setupConns)
	for i := range conns {
		c, err := st.d.connect(ctx, fmt.Sprintf("bench-mgmt-setup-%d", i))
		if err != nil {
			return err
		}
		conns[i] = c
	}
	var next, done atomic.Int64
	stop := progress(st.cfg, "Queues", done.Load, int64(st.m.Queues))
	defer stop()
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for g := range setupConns * 8 {
		wg.Go(func() {
			c := conns[g%setupConns]
			for {
				i := int(next.Add(1) - 1)
				if i >= st.m.Queues || ctx.Err() != nil {
					return
				}
				t, err := c.Tasks(ctx, st.queueName(i))
				if err != nil {
					select {
					case errs <- fmt.Errorf("bench: declare %s: %w", st.queueName(i), err):
					default:
					}
					next.Store(int64(st.m.Queues))
					return
				}
				st.tasks[i] = t
				done.Add(1)
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}
	return ctx.Err()
}

// preload fills each idle queue with its depth and waits for the
// confirms.
func (st *mgmtRun) preload(ctx context.Context) (int64, error) {
	var want int64
	for i := range st.m.Queues {
		if st.idle(i) {
			want += int64(idleDepth(i))
		}
	}
	var done, failed atomic.Int64
	stop := progress(st.cfg, "Preload", done.Load, want)
	defer stop()
	w := newSlots(st.m.Window)
	for i := range st.m.Queues {
		if !st.idle(i) {
			continue
		}
		for range idleDepth(i) {
			if err := w.acquire(ctx); err != nil {
				return done.Load(), err
			}
			st.submitted[i].Add(1)
			err := st.tasks[i].SubmitAsync(ctx, courier.Task{Body: st.body}, func(_ courier.TaskID, err error) {
				if err != nil {
					failed.Add(1)
					st.fail("preload %s: %v", st.queueName(i), err)
				} else {
					st.confirmed[i].Add(1)
				}
				done.Add(1)
				w.release()
			})
			if err != nil {
				return done.Load(), fmt.Errorf("bench: preload %s: %w", st.queueName(i), err)
			}
		}
	}
	if err := w.drain(ctx); err != nil {
		return done.Load(), err
	}
	if n := failed.Load(); n > 0 {
		return done.Load(), fmt.Errorf("bench: preload: %d submits failed", n)
	}
	return done.Load(), nil
}

// startWorkers attaches cfg.Workers workers, each on its own connection
// with one attachment per hot queue, acking each task at once.
func (st *mgmtRun) startWorkers(ctx context.Context) error {
	for w := range st.cfg.Workers {
		c, err := st.d.connect(ctx, fmt.Sprintf("bench-mgmt-worker-%d", w))
		if err != nil {
			return err
		}
		for i := range st.m.Hot {
			t, err := c.Tasks(ctx, st.queueName(i))
			if err != nil {
				return fmt.Errorf("bench: open %s: %w", st.queueName(i), err)
			}
			if _, err := t.Work(ctx, func(*courier.Job) error {
				st.delivered.Add(1)
				return nil
			}, courier.Prefetch(st.m.Prefetch)); err != nil {
				return fmt.Errorf("bench: attach worker to %s: %w", st.queueName(i), err)
			}
		}
	}
	return nil
}

// produce submits to the hot queues in turn, as fast as confirms come
// back within the window (or at its share of Config.Rate), until ctx
// ends.
func (st *mgmtRun) produce(ctx context.Context, p int) {
	c, err := st.d.connect(ctx, fmt.Sprintf("bench-mgmt-producer-%d", p))
	if err != nil {
		st.hotErrors.Add(1)
		st.fail("producer %d: %v", p, err)
		return
	}
	hot := make([]*courier.Tasks, st.m.Hot)
	for i := range hot {
		if hot[i], err = c.Tasks(ctx, st.queueName(i)); err != nil {
			st.hotErrors.Add(1)
			st.fail("producer %d: %v", p, err)
			return
		}
	}
	w := newSlots(st.m.Window)
	done := func(_ courier.TaskID, err error) {
		if err != nil {
			if ctx.Err() == nil {
				st.hotErrors.Add(1)
				st.fail("producer %d: submit: %v", p, err)
			}
		} else {
			st.hotConfirmed.Add(1)
		}
		w.release()
	}
	var pace *pacer
	if st.cfg.Rate > 0 {
		pace = newPacer(st.cfg.Rate/float64(st.cfg.Publishers), float64(p)/float64(st.cfg.Publishers))
	}
	for k := p; ctx.Err() == nil; k++ {
		if pace != nil {
			if _, ok := pace.wait(ctx); !ok {
				break
			}
		}
		if w.acquire(ctx) != nil {
			break
		}
		if err := hot[k%len(hot)].SubmitAsync(ctx, courier.Task{Body: st.body}, done); err != nil {
			w.release()
			if ctx.Err() == nil {
				st.hotErrors.Add(1)
				st.fail("producer %d: submit: %v", p, err)
			}
			break
		}
	}
	// The confirms still on their way are counted (or failed) before
	// the producer is done.
	dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w.drain(dctx)
}

// trickle submits Trickle tasks a second, round-robin, to the queues
// that are neither hot nor idle, until ctx ends.
func (st *mgmtRun) trickle(ctx context.Context) {
	first := st.m.Hot + st.m.Idle
	if st.m.Trickle <= 0 || first >= st.m.Queues {
		return
	}
	w := newSlots(st.m.Window)
	p := newPacer(st.m.Trickle, 0)
	for k := 0; ; k++ {
		if _, ok := p.wait(ctx); !ok {
			break
		}
		if w.acquire(ctx) != nil {
			break
		}
		i := first + k%(st.m.Queues-first)
		st.submitted[i].Add(1)
		err := st.tasks[i].SubmitAsync(ctx, courier.Task{Body: st.body}, func(_ courier.TaskID, err error) {
			if err != nil {
				st.trickleErrors.Add(1)
				st.fail("trickle %s: %v", st.queueName(i), err)
			} else {
				st.confirmed[i].Add(1)
				st.trickleConfirmed.Add(1)
			}
			w.release()
		})
		if err != nil {
			w.release()
			if ctx.Err() == nil {
				st.trickleErrors.Add(1)
				st.fail("trickle %s: %v", st.queueName(i), err)
			}
			// The task may or may not have left: its queue is no
			// longer checked against an upper bound it may pass.
			break
		}
	}
	dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w.drain(dctx)
}

// check is an answer to verify, with the bounds read around it.
type check struct {
	body   []byte
	lo, hi []int64 // by queue: confirmed before the request, submitted after the answer
}

// checkEvery is how often an answer is checked for exactness.
const checkEvery = time.Second

// pollLoop polls the API every Poll until runCtx ends; about once a
// second it hands an answer with its bounds to checks, unless the
// checker is still busy with the last one. A poll under way at the end
// finishes, within ctx.
func (st *mgmtRun) pollLoop(runCtx, ctx context.Context, checks chan<- check) {
	t := time.NewTicker(st.m.Poll)
	defer t.Stop()
	var lastCheck time.Time
	// The answer's buffer is reused from poll to poll, unless handed to
	// the checker: reading 5.6 MB into a buffer grown from nothing
	// allocates twice that, on the machine the broker runs on.
	var buf []byte
	last := 0
	for {
		select {
		case <-runCtx.Done():
			return
		case <-t.C:
		}
		want := time.Since(lastCheck) >= checkEvery && len(checks) == 0
		var c check
		if want {
			c.lo = st.snapshot(st.confirmed)
		}
		if buf == nil {
			buf = make([]byte, 0, last+last/8+4096)
		}
		b, err := st.poll(ctx, false, buf[:0])
		buf, last = b, max(last, len(b))
		if err != nil {
			if ctx.Err() == nil {
				st.pollErrs.Add(1)
				st.fail("poll: %v", err)
			}
			continue
		}
		if want {
			c.hi = st.snapshot(st.submitted)
			c.body = b
			buf = nil
			lastCheck = time.Now()
			checks <- c
		}
	}
}

// snapshot copies counters.
func (st *mgmtRun) snapshot(v []atomic.Int64) []int64 {
	out := make([]int64, len(v))
	for i := range v {
		out[i] = v[i].Load()
	}
	return out
}

var mgmtClient = &http.Client{
	Transport: &http.Transport{MaxIdleConnsPerHost: 2, DisableCompression: true},
	Timeout:   30 * time.Second,
}

// poll asks the API for the queue list once and times the answer to
// its last byte, which it reads into buf (appending). With full, it
// returns an error unless every queue is listed.
func (st *mgmtRun) poll(ctx context.Context, full bool, buf []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, st.base+mgmtQuery, nil)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	resp, err := mgmtClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.ContentLength > 0 {
		buf = slices.Grow(buf, int(resp.ContentLength))
	}
	buf, err = readAll(resp.Body, buf)
	took := time.Since(start)
	if err != nil {
		return buf[:0], err
	}
	if resp.StatusCode != http.StatusOK {
		return buf[:0], fmt.Errorf("%s: %.200s", resp.Status, buf)
	}
	st.lat.record(0, took)
	st.polls.Add(1)
	st.bytes.Add(int64(len(buf)))
	if took > st.m.Poll {
		st.slow.Add(1)
	}
	if full {
		seen := 0
		err := scanQueues(buf, func(name string, _ int64) {
			if _, ok := st.index(name); ok {
				seen++
			}
		})
		if err != nil {
			return nil, err
		}
		if seen != st.m.Queues {
			return nil, fmt.Errorf("the API lists %d of the %d queues", seen, st.m.Queues)
		}
	}
	return buf, nil
}

// readAll appends what r reads to b until EOF, growing b only when it is
// full.
func readAll(r io.Reader, b []byte) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = slices.Grow(b, max(cap(b), 4096))
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// index returns the number of one of this run's queues.
func (st *mgmtRun) index(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, st.prefix+".q")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || i >= st.m.Queues {
		return 0, false
	}
	return i, true
}

// check verifies an answer: every queue once; each idle or trickle
// queue's depth within its bounds (an idle queue's bounds are equal:
// its exact depth). Hot queues, which workers drain, are only counted.
func (st *mgmtRun) check(c check) {
	seen := make([]bool, st.m.Queues)
	var checked, wrong int64
	err := scanQueues(c.body, func(name string, ready int64) {
		i, ok := st.index(name)
		if !ok {
			return
		}
		if seen[i] {
			wrong++
			st.fail("queue %s listed twice", name)
			return
		}
		seen[i] = true
		if st.hot(i) {
			return
		}
		checked++
		if ready < c.lo[i] || ready > c.hi[i] {
			wrong++
			if st.idle(i) {
				st.fail("idle queue %s: messages_ready %d, want %d", name, ready, c.lo[i])
			} else {
				st.fail("queue %s: messages_ready %d, want %d to %d", name, ready, c.lo[i], c.hi[i])
			}
		}
	})
	if err != nil {
		st.wrong.Add(1)
		st.fail("check: %v", err)
		return
	}
	var missing int64
	for _, ok := range seen {
		if !ok {
			missing++
		}
	}
	if missing > 0 {
		st.fail("%d queues missing from an answer", missing)
	}
	st.checks.Add(1)
	st.checked.Add(checked)
	st.wrong.Add(wrong)
	st.missing.Add(missing)
}

// scanQueues reads a JSON array of {"name": string, "messages_ready":
// number} objects, in that key order (the API's), and calls fn with
// each. It is a small scanner rather than encoding/json, so that
// checking 100,000 queues a second takes little of the machine the
// broker runs on.
func scanQueues(b []byte, fn func(name string, ready int64)) error {
	const nameKey, readyKey = `{"name":"`, `,"messages_ready":`
	b = bytes.TrimSpace(b)
	if len(b) < 2 || b[0] != '[' || b[len(b)-1] != ']' {
		return fmt.Errorf("not a JSON array: %.100q", b)
	}
	b = b[1 : len(b)-1]
	for len(b) > 0 {
		if !bytes.HasPrefix(b, []byte(nameKey)) {
			return fmt.Errorf("want %s at %.100q", nameKey, b)
		}
		b = b[len(nameKey):]
		end := bytes.IndexByte(b, '"')
		if end < 0 || bytes.IndexByte(b[:end], '\\') >= 0 {
			// Escaped names are not this run's: skip to the next object.
			end = bytes.Index(b, []byte(readyKey)) - 1
			if end < 0 {
				return fmt.Errorf("no %s after a name", readyKey)
			}
		}
		name := string(b[:end])
		b = b[end+1:]
		if !bytes.HasPrefix(b, []byte(readyKey)) {
			return fmt.Errorf("want %s after %q", readyKey, name)
		}
		b = b[len(readyKey):]
		n := 0
		for n < len(b) && b[n] >= '0' && b[n] <= '9' {
			n++
		}
		ready, err := strconv.ParseInt(string(b[:n]), 10, 64)
		if err != nil || n == len(b) || b[n] != '}' {
			return fmt.Errorf("bad messages_ready of %q", name)
		}
		fn(name, ready)
		b = b[n+1:]
		if len(b) > 0 {
			if b[0] != ',' {
				return fmt.Errorf("want , after the object of %q", name)
			}
			b = b[1:]
		}
	}
	return nil
}

// cleanup deletes the queues from a server; an embedded node goes with
// its data directory.
func (st *mgmtRun) cleanup() {
	if st.d.node != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := st.d.connect(ctx, "bench-mgmt-cleanup")
	if err != nil {
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= st.m.Queues || ctx.Err() != nil {
					return
				}
				c.DeleteExchange(ctx, st.queueName(i))
			}
		})
	}
	wg.Wait()
}

// slots bounds the submits awaiting their confirm.
type slots chan struct{}

func newSlots(n int) slots { return make(slots, n) }

// acquire waits for a free slot, or for ctx to end.
func (s slots) acquire(ctx context.Context) error {
	select {
	case s <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s slots) release() { <-s }

// drain waits until every slot is free, or for ctx to end.
func (s slots) drain(ctx context.Context) error {
	for range cap(s) {
		if err := s.acquire(ctx); err != nil {
			return err
		}
	}
	for range cap(s) {
		s.release()
	}
	return nil
}

// HandlerTimes are bucket bounds of the server's handler times, in ms:
// the bucket of each percentile's answer is "at most this long".
type HandlerTimes struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50_at_most"`
	P90   float64 `json:"p90_at_most"`
	P99   float64 `json:"p99_at_most"`
}

// bucket is one cumulative bucket of a Prometheus histogram.
type bucket struct {
	le    float64 // seconds
	count int64
}

// handlerHist reads the server's histogram of /api/queues handler times
// from /metrics.
func (st *mgmtRun) handlerHist(ctx context.Context) ([]bucket, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, st.base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := mgmtClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	const prefix = `courier_http_request_duration_seconds_bucket{endpoint="/api/queues",le="`
	var hist []bucket
	for line := range strings.Lines(string(b)) {
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok {
			continue
		}
		le, count, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		v, err1 := strconv.ParseFloat(le, 64)
		n, err2 := strconv.ParseInt(strings.TrimSpace(count), 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		hist = append(hist, bucket{v, n})
	}
	if len(hist) == 0 {
		return nil, errors.New("no /api/queues histogram in /metrics")
	}
	return hist, nil
}

// handlerTimes returns the percentiles' buckets of the answers counted
// between two readings of the histogram.
func handlerTimes(before, after []bucket) *HandlerTimes {
	if len(before) != len(after) {
		return nil
	}
	diff := make([]bucket, len(after))
	for i := range after {
		diff[i] = bucket{after[i].le, after[i].count - before[i].count}
	}
	total := diff[len(diff)-1].count
	if total <= 0 {
		return nil
	}
	at := func(q float64) float64 {
		for _, b := range diff {
			if float64(b.count) >= q*float64(total) {
				return b.le * 1e3
			}
		}
		return math.Inf(1)
	}
	return &HandlerTimes{Count: total, P50: at(0.5), P90: at(0.9), P99: at(0.99)}
}

// loadAvg reads the machine's load averages; zeros if it cannot.
func loadAvg() [3]float64 {
	var l [3]float64
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l
	}
	f := strings.Fields(string(b))
	for i := 0; i < 3 && i < len(f); i++ {
		l[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return l
}

// WriteText prints the result.
func (res *MgmtResult) WriteText(w io.Writer) error {
	var b strings.Builder
	offered := "as fast as confirmed"
	if res.Rate > 0 {
		offered = fmt.Sprintf("%g/s offered", res.Rate)
	}
	fmt.Fprintf(&b, "Management API under load: %s, %d queues: %d hot (%d producers %s, %d workers, %d-byte tasks), %d idle with known depths, %d with a trickle of %g/s; %gs\n",
		res.Target, res.Queues, res.Hot, res.Producers, offered, res.Workers, res.Size, res.Idle, res.Queues-res.Hot-res.Idle, res.Trickle, res.Duration)
	fmt.Fprintf(&b, "Setup: %d queues declared in %.1f s, %d tasks preloaded in %.1f s\n", res.Queues, res.SetupSeconds, res.Preloaded, res.PreloadSeconds)
	fmt.Fprintf(&b, "Load: %.0f tasks/s submitted and confirmed, %.0f/s delivered and acked; trickle %d confirmed; %d submits failed\n",
		res.PublishRate, res.DeliverRate, res.TrickleConfirmed, res.SubmitErrors)
	fmt.Fprintf(&b, "GET %s every %gms: %d answers, %d failed, %d took longer than the period\n", res.URL, res.PollMs, res.Polls, res.PollErrors, res.SlowPolls)
	if res.PollLatency.Count > 0 {
		l := res.PollLatency
		fmt.Fprintf(&b, "Poll latency p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, p99.9 %.2f ms, max %.2f ms (%d polls)\n",
			l.P50/1e3, l.P90/1e3, l.P99/1e3, l.P999/1e3, l.Max/1e3, l.Count)
	}
	if h := res.Handler; h != nil {
		fmt.Fprintf(&b, "Server handler time (its courier_http_request_duration_seconds): p50 <= %g ms, p90 <= %g ms, p99 <= %g ms (%d answers)\n",
			h.P50, h.P90, h.P99, h.Count)
	}
	fmt.Fprintf(&b, "Response %d bytes on average (%.1f bytes a queue)\n", res.ResponseBytes, float64(res.ResponseBytes)/float64(max(res.Queues, 1)))
	verdict := "exact"
	if res.Wrong > 0 || res.Missing > 0 || res.Checks == 0 {
		verdict = "NOT exact"
	}
	fmt.Fprintf(&b, "Figures %s: %d answers checked, %d depths compared, %d wrong, %d queues missing (idle queues must show their depth; trickle queues at least what was confirmed before the request, at most what was submitted after the answer)\n",
		verdict, res.Checks, res.Checked, res.Wrong, res.Missing)
	fmt.Fprintf(&b, "Load average %.2f %.2f %.2f at the start, %.2f %.2f %.2f at the end\n",
		res.LoadAvgStart[0], res.LoadAvgStart[1], res.LoadAvgStart[2], res.LoadAvgEnd[0], res.LoadAvgEnd[1], res.LoadAvgEnd[2])
	res.footer(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON prints the result as one JSON object.
func (res *MgmtResult) WriteJSON(w io.Writer) error { return writeJSON(w, res) }

// Metrics returns the poll latencies, the answer's size, the load's
// rates and the wrong figures.
func (res *MgmtResult) Metrics() []Metric {
	m := latencyMetrics("poll latency", res.PollLatency)
	return append(m,
		Metric{Name: "response size", Value: float64(res.ResponseBytes), Unit: "bytes", Lower: true},
		Metric{Name: "publish rate", Value: res.PublishRate, Unit: "msgs/s"},
		Metric{Name: "deliver rate", Value: res.DeliverRate, Unit: "msgs/s"},
		Metric{Name: "wrong figures", Value: float64(res.Wrong + res.Missing), Unit: "", Lower: true},
	)
}

// Timeline returns the run's samples: Sent is the hot queues' confirmed
// submits, Received their deliveries, Published the trickle, Latency the
// polls'.
func (res *MgmtResult) Timeline() Timeline {
	return Timeline{Title: fmt.Sprintf("mgmt: %s, %d queues, GET %s", res.Target, res.Queues, mgmtQuery), Samples: res.Samples}
}
