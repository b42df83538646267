package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/courier-mq/courier/internal/bench"
)

// benchGlobal holds the flags every courier-bench subcommand shares.
type benchGlobal struct {
	embedded   bool
	harness    bool
	url        string
	target     string
	timeout    time.Duration
	interval   time.Duration
	serverPID  int
	json       bool
	plot       string
	cpuprofile string
}

// benchFlags are one scenario subcommand's flags. Each subcommand has
// its own, so that their defaults do not mix.
type benchFlags struct {
	size        int
	count       int
	counts      []int
	duration    time.Duration
	publishers  int
	subscribers int
	workers     int
	rate        float64
	warmup      int

	parallel   []int         // reqresp
	handlerURL string        // reqresp
	embCross   bool          // reqresp
	subURLs    []string      // pubsub
	nodesHTTP  []string      // pubsub
	mode       string        // pubsub
	drain      time.Duration // pubsub, tasks
	users      bench.UsersConfig
	mgmt       bench.MgmtConfig
	queue      bench.QueueConfig // tasks, backlog
	maxRSSMB   int64             // backlog
}

// benchCmd is the root command of courier-bench, with a subcommand per
// scenario, echo and compare.
func benchCmd() *cobra.Command {
	g := &benchGlobal{}
	cmd := &cobra.Command{
		Use:   "courier-bench",
		Short: "Load generator: request-response, pub-sub, many-users, durable tasks and backlog scenarios against Courier, NATS or RabbitMQ",
		Long: `courier-bench runs a scenario against a broker and prints rates, latency
percentiles (HDR histogram: p50, p90, p99, p99.9, max), the server's CPU
seconds and peak memory over the run, and this process's own CPU.

Targets: an embedded Courier node (the default), a Courier server
(--url courier://127.0.0.1:7400), NATS (--target nats://127.0.0.1:4222;
JetStream for tasks and backlog) or
RabbitMQ (--target amqp://guest:guest@127.0.0.1:5672/); --harness runs
against an in-process echo with no broker, to show what the load generator
itself sustains (courier-bench echo does that for request-response). The
server's CPU and memory are read from /proc for the process listening on
the target's port (or --server-pid); with an embedded node they are the
whole process's. Every run is bounded by its count or --duration, and by
--timeout (default 5m; 30m for backlog).

courier-bench is a binary of its own, apart from the courier server and
tools, as NATS and RabbitMQ ship their benchmark tools: the NATS and AMQP
clients, the plotting and the progress bar it needs stay out of the
server. courier bench ARGS runs courier-bench ARGS when courier-bench is
in the same directory as courier.`,
	}
	p := cmd.PersistentFlags()
	p.BoolVar(&g.embedded, "embedded", false, "run against a Courier node embedded in this process (the default without --url or --target)")
	p.BoolVar(&g.harness, "harness", false, "run against an in-process echo, no broker: what the load generator itself sustains")
	p.StringVar(&g.url, "url", "", "Courier server URL, such as courier://127.0.0.1:7400")
	p.StringVar(&g.target, "target", "", "broker URL: courier://..., nats://127.0.0.1:4222 or amqp://guest:guest@127.0.0.1:5672/")
	p.DurationVar(&g.timeout, "timeout", 5*time.Minute, "bound on the whole run (raised to fit --duration)")
	p.DurationVar(&g.interval, "interval", time.Second, "sampling interval of the time series (users lines, --plot, --json samples)")
	p.IntVar(&g.serverPID, "server-pid", 0, "the broker's process id for CPU and memory (default: the process listening on the target's port)")
	p.BoolVar(&g.json, "json", false, "print one JSON object with the results")
	p.StringVar(&g.plot, "plot", "", "write rates, latencies, CPU and memory over time to this .svg or .png file")
	p.StringVar(&g.cpuprofile, "cpuprofile", "", "write a CPU profile of this process to this file (with --embedded it covers the broker)")

	for _, sc := range bench.Scenarios() {
		cmd.AddCommand(scenarioCmd(g, sc, sc.Name, sc.Short, false))
	}
	rr, _ := bench.LookupScenario("reqresp")
	cmd.AddCommand(scenarioCmd(g, rr, "echo",
		"Request-response against an in-process echo, no broker: how many cycles/s the load generator itself sustains", true))
	cmd.AddCommand(compareCmd(g))
	cmd.AddCommand(clusterCmd(g))
	cmd.AddCommand(idleCmd(g))
	return cmd
}

// scenarioCmd returns the subcommand of a scenario, with the flags of the
// settings it uses.
func scenarioCmd(g *benchGlobal, sc bench.Scenario, use, short string, echo bool) *cobra.Command {
	f := &benchFlags{}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.config(cmd, g, sc, echo)
			if err != nil {
				return err
			}
			return g.run(cmd, sc, cfg)
		},
	}
	fs := cmd.Flags()
	addScenarioFlags(fs, f, sc)
	return cmd
}

// addScenarioFlags registers the flags of the settings sc uses, and its
// own.
func addScenarioFlags(fs *pflag.FlagSet, f *benchFlags, sc bench.Scenario) {
	if sc.Has(bench.UsesSize) {
		fs.IntVar(&f.size, "size", 0, "body size in bytes (default: 4 for reqresp, 128 for pubsub, 64 for users, 256 for mgmt, 1024 for tasks and backlog)")
	}
	if sc.Has(bench.UsesCount) {
		if sc.Name == "reqresp" {
			fs.IntSliceVar(&f.counts, "count", []int{10000, 20000, 100000}, "cycles of each sequential run; parallel runs use the largest")
		} else {
			what := "messages to publish, shared by the publishers"
			if sc.Name == "tasks" {
				what = "tasks to submit"
			}
			fs.IntVar(&f.count, "count", 1000000, what+" (unlimited with --duration unless given)")
		}
	}
	if sc.Has(bench.UsesDuration) {
		help := "bound each run by time too: with no --count given, runs last this long"
		switch sc.Name {
		case "users":
			help = "length of the whole run, ramp-up included (default: users/ramp + 10s)"
		case "mgmt":
			help = "length of the load, after the queues are created (default: 30s)"
		case "backlog":
			help = "bound the loop by time too: it stops at --depth or after this long"
		}
		fs.DurationVar(&f.duration, "duration", 0, help)
	}
	if sc.Has(bench.UsesPublishers) {
		help := "publishers, each on its own connection (default: 1 for --mode fanout, 10 for fanin)"
		if sc.Name == "mgmt" {
			help = "producers submitting to the hot queues, each on its own connection (default: 2)"
		}
		fs.IntVar(&f.publishers, "publishers", 0, help)
	}
	if sc.Has(bench.UsesSubscribers) {
		fs.IntVar(&f.subscribers, "subscribers", 0, "subscribers, each on its own connection (default: 10 for --mode fanout, 1 for fanin)")
	}
	if sc.Has(bench.UsesWorkers) {
		def, help := 1, "request handlers, each on its own connection, sharing the requests"
		switch sc.Name {
		case "users":
			def = 2
		case "mgmt":
			def, help = 2, "workers acking the hot queues' tasks, each on its own connection"
		case "tasks":
			help = "workers, each on its own connection, sharing the tasks"
		}
		fs.IntVar(&f.workers, "workers", def, help)
	}
	if sc.Has(bench.UsesRate) {
		fs.Float64Var(&f.rate, "rate", 0, "offered rate in requests or messages per second, shared by the requesters or publishers (default: as fast as possible)")
	}
	if sc.Has(bench.UsesWarmup) {
		fs.IntVar(&f.warmup, "warmup", 1000, "cycles or messages run before measuring (0 for none)")
	}
	switch sc.Name {
	case "reqresp":
		fs.IntSliceVar(&f.parallel, "parallel", []int{2, 4, 10, 100}, "requesting goroutines of each parallel run")
		fs.StringVar(&f.handlerURL, "handler-url", "", "connect the handlers to this server, such as another node of a cluster (the requesters stay on --url or --target)")
		fs.BoolVar(&f.embCross, "embedded-cross", false, "embedded: run two nodes joined as a cluster in this process (node.ClusterConfig on 127.0.0.1:0), the requesters on one and the handlers on the other")
	case "pubsub":
		fs.StringVar(&f.mode, "mode", "fanout", "fanout (one publisher, many subscribers) or fanin (many publishers, one subscriber)")
		fs.DurationVar(&f.drain, "drain", 3*time.Second, "how long to wait for deliveries that stopped coming before counting them lost")
		fs.StringSliceVar(&f.subURLs, "subscriber-urls", nil, "spread the subscribers round-robin over these servers, such as a cluster's nodes (the publishers stay on --url or --target)")
		fs.StringSliceVar(&f.nodesHTTP, "nodes-http", nil, "Courier cluster: the nodes' management URLs (http://127.0.0.1:7481,...); their link counters (GET /api/nodes) are read before and after 20 publications, and the copies of one that crossed the links printed")
		fs.IntVar(&f.count, "messages", 1000000, "same as --count")
		fs.MarkDeprecated("messages", "use --count")
	case "users":
		u := &f.users
		fs.IntVar(&u.Users, "users", 100, "simulated users, each on its own connection (at most 10000)")
		fs.Float64Var(&u.Ramp, "ramp", 50, "users connecting per second")
		fs.Float64Var(&u.RequestRate, "request-rate", 1, "requests per second of each user (0 for none)")
		fs.Float64Var(&u.PublishRate, "publish-rate", 1, "messages per second of each user, each to another user (0 for none)")
		fs.DurationVar(&u.Threshold, "threshold", 100*time.Millisecond, "latency p99 over which the server counts as falling behind")
		fs.DurationVar(&u.RequestTimeout, "request-timeout", 5*time.Second, "bound on each request; one that times out is an error")
		fs.IntVar(&u.RoomSize, "room-size", 0, "a chat: users in rooms of about this many, each message to one of its sender's rooms (0: each message to another user)")
		fs.IntVar(&u.RoomsPerUser, "rooms-per-user", 3, "with --room-size: each user is in 1 to this many rooms")
		fs.BoolVar(&u.WS, "ws", false, "Courier: each user connects over WebSocket (ws://HTTP/ws) instead of TCP")
		fs.StringVar(&u.WSURL, "ws-url", "", "with --ws: the WebSocket endpoint (default: the embedded node's, or ws://<target host>:7480/ws)")
	case "mgmt":
		m := &f.mgmt
		fs.IntVar(&m.Queues, "queues", 10000, "queues (durable task exchanges) to create")
		fs.IntVar(&m.Hot, "hot", 8, "queues taking the full load (producers and workers)")
		fs.IntVar(&m.Idle, "idle", 0, "queues filled with a known depth and left alone (default: a tenth of --queues)")
		fs.Float64Var(&m.Trickle, "trickle", 1000, "tasks per second spread over the other queues (0 for none)")
		fs.DurationVar(&m.Poll, "poll", 100*time.Millisecond, "how often to GET /api/queues?columns=name,messages_ready")
		fs.StringVar(&m.HTTP, "http", "", "the server's management API, such as http://127.0.0.1:7480 (default with --url: that one; an embedded node serves its own)")
		fs.IntVar(&m.Window, "window", 1000, "each producer's submits awaiting their confirm")
		fs.IntVar(&m.Prefetch, "prefetch", 100, "each worker's prefetch on each hot queue")
	case "tasks":
		fs.IntVar(&f.queue.Prefetch, "prefetch", 100, "each worker's prefetch: tasks it may hold unacked")
		fs.IntVar(&f.queue.Window, "window", 1000, "submits that may await their confirm at a time (pipelining)")
		fs.DurationVar(&f.drain, "drain", 3*time.Second, "how long to wait for tasks that stopped coming before counting them missing")
	case "backlog":
		q := &f.queue
		fs.IntVar(&q.Depth, "depth", 1000000, "queue depth (iterations) at which the run stops")
		fs.IntVar(&q.SampleEvery, "sample-every", 50000, "iterations between two samples of the server's memory")
		fs.IntVar(&q.Prefetch, "prefetch", 10, "the consumer's prefetch: messages it may hold unacked")
		fs.IntVar(&q.Window, "window", 1000, "publishes that may await their confirm at a time (pipelining)")
		fs.Int64Var(&f.maxRSSMB, "max-rss-mb", 0, "stop once the server's resident memory passes this many MB (0: no limit; guards a shared machine)")
	}
}

// target returns the target the global flags name.
func (g *benchGlobal) targetOf(echo bool) (bench.Target, error) {
	raw := g.target
	switch {
	case g.url != "" && g.target != "" && g.url != g.target:
		return bench.Target{}, errors.New("bench: give --url or --target, not both")
	case g.url != "":
		raw = g.url
	}
	if (g.embedded || g.harness || echo) && raw != "" {
		return bench.Target{}, errors.New("bench: --embedded, --harness and echo run in this process: drop --url and --target")
	}
	if g.harness || echo {
		return bench.Target{Kind: bench.KindEcho}, nil
	}
	t, err := bench.ParseTarget(raw)
	if err != nil {
		return bench.Target{}, err
	}
	if g.url != "" && t.Kind != bench.KindCourier {
		return bench.Target{}, fmt.Errorf("bench: --url is for Courier servers (courier://...); use --target for %s", t.Kind)
	}
	return t, nil
}

func (f *benchFlags) config(cmd *cobra.Command, g *benchGlobal, sc bench.Scenario, echo bool) (bench.Config, error) {
	t, err := g.targetOf(echo)
	if err != nil {
		return bench.Config{}, err
	}
	if !sc.Supports(t.Kind) {
		return bench.Config{}, fmt.Errorf("%w: %s on %s", bench.ErrNoMapping, sc.Name, t)
	}
	changed := cmd.Flags().Changed
	warmup := f.warmup
	if warmup == 0 {
		warmup = -1
	}
	cfg := bench.Config{
		Target: t, Size: f.size, Duration: f.duration, Publishers: f.publishers, Subscribers: f.subscribers,
		Workers: f.workers, Rate: f.rate, Warmup: warmup, Interval: g.interval, ServerPID: g.serverPID,
		Parallel: f.parallel, Drain: f.drain, Users: f.users, Mgmt: f.mgmt, Queue: f.queue,
		HandlerURL: f.handlerURL, EmbeddedCross: f.embCross, SubscriberURLs: f.subURLs, NodesHTTP: f.nodesHTTP,
	}
	cfg.Queue.MaxRSS = f.maxRSSMB * 1e6
	switch sc.Name {
	case "reqresp":
		if f.duration == 0 || changed("count") {
			cfg.Counts = f.counts
		}
	case "tasks":
		if f.duration == 0 || changed("count") {
			cfg.Count = f.count
		}
	case "pubsub":
		if f.duration == 0 || changed("count") || changed("messages") {
			cfg.Count = f.count
		}
		switch f.mode {
		case "fanout":
		case "fanin":
			if cfg.Publishers == 0 {
				cfg.Publishers = 10
			}
			if cfg.Subscribers == 0 {
				cfg.Subscribers = 1
			}
		default:
			return bench.Config{}, fmt.Errorf("bench: --mode %q: want fanout or fanin", f.mode)
		}
	case "mgmt":
		if cfg.Mgmt.Trickle == 0 {
			cfg.Mgmt.Trickle = -1
		}
		if cfg.Duration == 0 {
			cfg.Duration = 30 * time.Second
		}
		// Creating 100,000 queues takes a while before the load.
		if !g.timeoutChanged(cmd) {
			g.timeout = max(g.timeout, cfg.Duration+15*time.Minute)
		}
	case "users":
		if cfg.Users.RequestRate == 0 {
			cfg.Users.RequestRate = -1
		}
		if cfg.Users.PublishRate == 0 {
			cfg.Users.PublishRate = -1
		}
	}
	// A deep backlog takes long: RabbitMQ does a few thousand
	// iterations a second.
	if sc.Name == "backlog" && !g.timeoutChanged(cmd) {
		g.timeout = max(g.timeout, backlogTimeout)
	}
	// A run bounded by time gets the time it needs.
	if f.duration > 0 && !g.timeoutChanged(cmd) {
		runs := 1
		if sc.Name == "reqresp" {
			runs += len(f.parallel)
		}
		g.timeout = max(g.timeout, time.Duration(runs)*f.duration+time.Minute)
	}
	return cfg, nil
}

// backlogTimeout is the backlog scenario's default bound on the whole
// run, instead of --timeout's 5 minutes.
const backlogTimeout = 30 * time.Minute

func (g *benchGlobal) timeoutChanged(cmd *cobra.Command) bool {
	fl := cmd.Flag("timeout")
	return fl != nil && fl.Changed
}

func (g *benchGlobal) run(cmd *cobra.Command, sc bench.Scenario, cfg bench.Config) error {
	if g.plot != "" {
		ext := strings.ToLower(g.plot)
		if !strings.HasSuffix(ext, ".svg") && !strings.HasSuffix(ext, ".png") {
			return fmt.Errorf("bench: --plot %s: the file name must end in .svg or .png", g.plot)
		}
	}
	out := cmd.OutOrStdout()
	if isTerminal(os.Stdout) && !g.json {
		bar := &benchBar{start: time.Now()}
		cfg.Progress = bar.update
		defer bar.finish()
	}
	if g.cpuprofile != "" {
		pf, err := os.Create(g.cpuprofile)
		if err != nil {
			return fmt.Errorf("bench: cpuprofile: %w", err)
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return fmt.Errorf("bench: cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
	defer cancel()
	res, runErr := sc.Run(ctx, cfg)
	if res == nil {
		return runErr
	}
	var err error
	if g.json {
		err = res.WriteJSON(out)
	} else {
		err = res.WriteText(out)
	}
	if g.plot != "" {
		if perr := bench.WritePlotFile(g.plot, res.Timeline()); perr != nil {
			err = errors.Join(err, perr)
		} else if !g.json {
			fmt.Fprintf(out, "Plot written to %s\n", g.plot)
		}
	}
	if runErr != nil {
		return runErr
	}
	return err
}

// barDelay is how long a run goes before it shows a progress bar: short
// runs print their result and nothing else.
const barDelay = 3 * time.Second

// benchBar shows a progress bar on stderr, one per stage, once the run
// has gone on for barDelay.
type benchBar struct {
	start time.Time
	stage string
	bar   *progressbar.ProgressBar
}

// update is called from one goroutine at a time.
func (b *benchBar) update(stage string, done, total int64) {
	if stage != b.stage || b.bar == nil {
		b.finish()
		b.stage = stage
		// The bar counts from its stage's start, so that its rate is
		// right, but draws nothing until barDelay.
		b.bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(delayedWriter{show: b.start.Add(barDelay), w: os.Stderr}),
			progressbar.OptionSetDescription(stage),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
	}
	b.bar.Set64(done)
}

// delayedWriter drops what is written to it before show.
type delayedWriter struct {
	show time.Time
	w    io.Writer
}

func (d delayedWriter) Write(p []byte) (int, error) {
	if time.Now().Before(d.show) {
		return len(p), nil
	}
	return d.w.Write(p)
}

func (b *benchBar) finish() {
	if b.bar != nil {
		b.bar.Finish()
		b.bar = nil
	}
}

// isTerminal reports whether f is a character device, such as a terminal.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
