package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
)

// IdleConfig configures [RunIdle].
type IdleConfig struct {
	// Nodes are the client URLs of every server of the cluster (one for
	// a single server), all Courier or all NATS.
	Nodes []string
	// PIDs, if set, are the servers' processes, by node; default: the
	// process listening on each node's port.
	PIDs []int
	// Exchanges is how many exchanges are declared, spread round-robin
	// over the nodes (each is declared on node i%len(Nodes)). NATS has no
	// exchanges: as many subscriptions, each to a subject of its own,
	// are its nearest analogue (each is interest every server of the
	// cluster learns). Default: 10000.
	Exchanges int
	// Window is how long each server's CPU time is watched, idle.
	// Default: 30s.
	Window time.Duration
	// Settle is how long the cluster is left alone after declaring,
	// before the window. Default: 5s.
	Settle time.Duration
	// Baseline also watches a window before declaring. Default: no.
	Baseline bool
	// Log, if set, receives a line as each step starts.
	Log func(line string)
}

func (c IdleConfig) withDefaults() IdleConfig {
	if c.Exchanges == 0 {
		c.Exchanges = 10000
	}
	if c.Window == 0 {
		c.Window = 30 * time.Second
	}
	if c.Settle == 0 {
		c.Settle = 5 * time.Second
	}
	return c
}

// IdleResult is what [RunIdle] measured: each server's CPU and memory
// at rest.
type IdleResult struct {
	Kind      Kind   `json:"kind"`
	Exchanges int    `json:"exchanges"`
	What      string `json:"what"` // "exchanges" or "subscriptions"
	// DeclareSeconds is how long declaring them all took.
	DeclareSeconds float64 `json:"declare_seconds"`
	// Declare is the latency of each declaration (Courier only: each
	// is one call that returns once the node it was made on has applied
	// it, in a cluster through the metadata group), with setupWorkers
	// of them in flight at a time. NATS subscriptions are not
	// acknowledged one by one.
	Declare *Latency `json:"declare_latency,omitempty"`
	// Window and Settle are in seconds.
	Window float64     `json:"window_s"`
	Settle float64     `json:"settle_s"`
	Nodes  []IdleNode  `json:"nodes"`
	Notes  []string    `json:"notes,omitempty"`
	Error  string      `json:"error,omitempty"`
	conns  []io.Closer // closed when the run ends
}

// IdleNode is one server of an idle run.
type IdleNode struct {
	URL  string `json:"url"`
	PID  int    `json:"pid"`
	Name string `json:"process"`
	// Before is over a window before declaring (with Baseline), After
	// over the window after.
	Before *IdleSample `json:"before,omitempty"`
	After  IdleSample  `json:"after"`
}

// IdleSample is a server's CPU over a window and its memory at its end.
type IdleSample struct {
	// CPU is the share of one core the process used: CPU seconds over
	// the window's seconds, in percent.
	CPU float64 `json:"cpu_percent"`
	// RSS is its resident memory at the window's end, in bytes.
	RSS int64 `json:"rss_bytes"`
}

// RunIdle measures what a cluster costs at rest: it declares
// cfg.Exchanges exchanges (NATS: subscriptions) spread over the nodes,
// keeps the connections that declared them open and silent, waits
// cfg.Settle, then reads each server's CPU time (/proc/PID/stat) over
// cfg.Window and its resident memory; with cfg.Baseline, the same over
// a window before declaring. It deletes the exchanges at the end. ctx
// bounds the whole run.
func RunIdle(ctx context.Context, cfg IdleConfig) (*IdleResult, error) {
	cfg = cfg.withDefaults()
	res := &IdleResult{Exchanges: cfg.Exchanges, Window: cfg.Window.Seconds(), Settle: cfg.Settle.Seconds()}
	err := runIdle(ctx, cfg, res)
	for _, c := range res.conns {
		c.Close()
	}
	if err != nil {
		res.Error = err.Error()
	}
	return res, err
}

func runIdle(ctx context.Context, cfg IdleConfig, res *IdleResult) error {
	if len(cfg.Nodes) == 0 {
		return errors.New("bench: idle: no nodes")
	}
	if cfg.Exchanges < 0 || cfg.Window < 0 || cfg.Settle < 0 {
		return errors.New("bench: idle: exchanges, window and settle must not be negative")
	}
	if len(cfg.PIDs) > 0 && len(cfg.PIDs) != len(cfg.Nodes) {
		return fmt.Errorf("bench: idle: %d process ids for %d nodes", len(cfg.PIDs), len(cfg.Nodes))
	}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			cfg.Log(fmt.Sprintf(format, args...))
		}
	}
	for i, raw := range cfg.Nodes {
		t, err := ParseTarget(raw)
		if err != nil {
			return err
		}
		if t.Kind != KindCourier && t.Kind != KindNATS {
			return fmt.Errorf("bench: idle: %s: want courier:// or nats:// URLs", redact(raw))
		}
		if i == 0 {
			res.Kind = t.Kind
		} else if t.Kind != res.Kind {
			return fmt.Errorf("bench: idle: %s is not a %s URL like the first", redact(raw), kindName(res.Kind))
		}
		n := IdleNode{URL: redact(raw)}
		if len(cfg.PIDs) > 0 {
			n.PID = cfg.PIDs[i]
		} else if port, err := t.port(); err == nil && t.local() {
			n.PID, err = listenerPID(port)
			if err != nil {
				return fmt.Errorf("bench: idle: %w (give the process ids)", err)
			}
		} else {
			return fmt.Errorf("bench: idle: %s is not on this machine: give the process ids", redact(raw))
		}
		if _, err := procCPU(n.PID); err != nil {
			return fmt.Errorf("bench: idle: %s: %w", n.URL, err)
		}
		n.Name = procName(n.PID)
		res.Nodes = append(res.Nodes, n)
	}
	res.What = "exchanges"
	if res.Kind == KindNATS {
		res.What = "subscriptions"
	}
	if cfg.Baseline {
		logf("Watching %d server(s) for %s before declaring", len(res.Nodes), cfg.Window)
		before, err := watchIdle(ctx, res.Nodes, cfg.Window)
		if err != nil {
			return err
		}
		for i := range res.Nodes {
			res.Nodes[i].Before = &before[i]
		}
	}
	logf("Declaring %d %s over %d server(s)", cfg.Exchanges, res.What, len(res.Nodes))
	start := time.Now()
	var err error
	if res.Kind == KindNATS {
		err = declareNATS(ctx, cfg, res)
	} else {
		err = declareCourier(ctx, cfg, res)
	}
	res.DeclareSeconds = time.Since(start).Seconds()
	if err != nil {
		return err
	}
	logf("Declared in %.1f s; settling for %s, then watching for %s", res.DeclareSeconds, cfg.Settle, cfg.Window)
	sleepCtx(ctx, cfg.Settle)
	after, err := watchIdle(ctx, res.Nodes, cfg.Window)
	if err != nil {
		return err
	}
	for i := range res.Nodes {
		res.Nodes[i].After = after[i]
	}
	if res.Kind == KindCourier {
		logf("Deleting the %d exchanges", cfg.Exchanges)
		return deleteCourier(ctx, cfg, res)
	}
	return nil
}

// watchIdle reads each node's CPU time at the start and the end of a
// window, and its resident memory at the end.
func watchIdle(ctx context.Context, nodes []IdleNode, window time.Duration) ([]IdleSample, error) {
	from := make([]time.Duration, len(nodes))
	for i, n := range nodes {
		d, err := procCPU(n.PID)
		if err != nil {
			return nil, fmt.Errorf("bench: idle: %s: %w", n.URL, err)
		}
		from[i] = d
	}
	start := time.Now()
	sleepCtx(ctx, window)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	wall := time.Since(start)
	out := make([]IdleSample, len(nodes))
	for i, n := range nodes {
		d, err := procCPU(n.PID)
		if err != nil {
			return nil, fmt.Errorf("bench: idle: %s: %w", n.URL, err)
		}
		out[i].CPU = 100 * float64(d-from[i]) / float64(wall)
		out[i].RSS, _, _ = procMem(n.PID)
	}
	return out, nil
}

// idleName is the name of exchange (or subject) i of an idle run.
func idleName(i int) string { return fmt.Sprintf("%s.%d", names("idle"), i) }

// declareCourier declares the exchanges, exchange i on node i%N, from
// one connection per node kept open.
func declareCourier(ctx context.Context, cfg IdleConfig, res *IdleResult) error {
	conns := make([]*courier.Conn, len(cfg.Nodes))
	for i, u := range cfg.Nodes {
		c, err := client.Dial(ctx, u, client.Options{Name: fmt.Sprintf("bench-idle-%d", i)})
		if err != nil {
			return fmt.Errorf("bench: connect to %s: %w", redact(u), err)
		}
		conns[i] = c
		res.conns = append(res.conns, c)
	}
	took := make([]time.Duration, cfg.Exchanges)
	err := forEach(ctx, cfg.Exchanges, func(i int) error {
		start := time.Now()
		if _, err := conns[i%len(conns)].PubSub(ctx, idleName(i)); err != nil {
			return fmt.Errorf("bench: declare %s: %w", idleName(i), err)
		}
		took[i] = time.Since(start)
		return nil
	})
	if err == nil {
		h := newHist()
		for _, d := range took {
			record(h, d)
		}
		l := latencyOf(h)
		res.Declare = &l
	}
	return err
}

// deleteCourier deletes what declareCourier declared, each exchange
// from the node that declared it.
func deleteCourier(ctx context.Context, cfg IdleConfig, res *IdleResult) error {
	return forEach(ctx, cfg.Exchanges, func(i int) error {
		c := res.conns[i%len(res.conns)].(*courier.Conn)
		if err := c.DeleteExchange(ctx, idleName(i)); err != nil {
			return fmt.Errorf("bench: delete %s: %w", idleName(i), err)
		}
		return nil
	})
}

// natsCloser closes a NATS connection.
type natsCloser struct{ nc *nats.Conn }

func (c natsCloser) Close() error { c.nc.Close(); return nil }

// declareNATS subscribes to as many subjects, subscription i on server
// i%N, from one connection per server kept open, and waits until every
// server has processed them (a flush per connection).
func declareNATS(ctx context.Context, cfg IdleConfig, res *IdleResult) error {
	conns := make([]*nats.Conn, len(cfg.Nodes))
	for i, u := range cfg.Nodes {
		nc, err := nats.Connect(u, nats.Name(fmt.Sprintf("bench-idle-%d", i)))
		if err != nil {
			return fmt.Errorf("bench: connect to %s: %w", redact(u), err)
		}
		conns[i] = nc
		res.conns = append(res.conns, natsCloser{nc})
	}
	noop := func(*nats.Msg) {}
	for i := range cfg.Exchanges {
		if _, err := conns[i%len(conns)].Subscribe(idleName(i), noop); err != nil {
			return fmt.Errorf("bench: subscribe %s: %w", idleName(i), err)
		}
	}
	for _, nc := range conns {
		if err := nc.FlushWithContext(ctx); err != nil {
			return fmt.Errorf("bench: flush: %w", err)
		}
	}
	return nil
}

// WriteText prints the result: a line per server and the total.
func (res *IdleResult) WriteText(w io.Writer) error {
	var b strings.Builder
	system := "Courier"
	if res.Kind == KindNATS {
		system = "NATS"
	}
	fmt.Fprintf(&b, "Idle cost: %s, %d server(s), %d %s spread over them", system, len(res.Nodes), res.Exchanges, res.What)
	if res.Kind == KindNATS {
		b.WriteString(" (each to a subject of its own: the nearest analogue of an exchange)")
	}
	fmt.Fprintf(&b, "\nDeclared %d %s in ~%.1f seconds; settled %.1f s; CPU over %.1f s windows (/proc/PID/stat utime+stime, 10 ms ticks)\n",
		res.Exchanges, res.What, res.DeclareSeconds, res.Settle, res.Window)
	if d := res.Declare; d != nil && res.DeclareSeconds > 0 {
		fmt.Fprintf(&b, "Declare rate %.0f/s (%d declarers in flight); each declare p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
			float64(res.Exchanges)/res.DeclareSeconds, min(setupWorkers, res.Exchanges), d.P50/1e3, d.P99/1e3, d.Max/1e3)
	}
	mb := func(v int64) string { return fmt.Sprintf("%.1f", float64(v)/1e6) }
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	baseline := len(res.Nodes) > 0 && res.Nodes[0].Before != nil
	if baseline {
		fmt.Fprint(tw, "server\tprocess\tpid\tCPU % before\tRSS MB before\tCPU % after\tRSS MB after\t\n")
	} else {
		fmt.Fprint(tw, "server\tprocess\tpid\tCPU %\tRSS MB\t\n")
	}
	var tot, totBefore IdleSample
	for _, n := range res.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%d\t", n.URL, n.Name, n.PID)
		if baseline && n.Before != nil {
			fmt.Fprintf(tw, "%.2f\t%s\t", n.Before.CPU, mb(n.Before.RSS))
			totBefore.CPU += n.Before.CPU
			totBefore.RSS += n.Before.RSS
		}
		fmt.Fprintf(tw, "%.2f\t%s\t\n", n.After.CPU, mb(n.After.RSS))
		tot.CPU += n.After.CPU
		tot.RSS += n.After.RSS
	}
	if len(res.Nodes) > 1 {
		fmt.Fprint(tw, "total\t\t\t")
		if baseline {
			fmt.Fprintf(tw, "%.2f\t%s\t", totBefore.CPU, mb(totBefore.RSS))
		}
		fmt.Fprintf(tw, "%.2f\t%s\t\n", tot.CPU, mb(tot.RSS))
	}
	tw.Flush()
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
func (res *IdleResult) WriteJSON(w io.Writer) error { return writeJSON(w, res) }

// TotalCPU is the CPU of every server after declaring, summed, in
// percent of one core; NaN without servers.
func (res *IdleResult) TotalCPU() float64 {
	if len(res.Nodes) == 0 {
		return math.NaN()
	}
	var t float64
	for _, n := range res.Nodes {
		t += n.After.CPU
	}
	return t
}
