package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/courier-mq/courier/internal/bench"
)

func init() { commands = append(commands, benchCmd) }

// benchFlags are the flags of courier bench and its subcommands.
type benchFlags struct {
	embedded    bool
	url         string
	target      string
	counts      []int
	parallel    []int
	warmup      int
	size        int
	subscribers int
	messages    int
	drain       time.Duration
	timeout     time.Duration
	serverPID   int
	json        bool
	cpuprofile  string
}

func benchCmd() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure request-response and pub-sub fan-out against Courier, NATS or RabbitMQ",
		Long: `bench runs one scenario against a broker and prints rates, latency
percentiles (HDR histogram) and the broker's CPU time per message.

Targets: an embedded Courier node (the default), a Courier server
(--url courier://127.0.0.1:7400), NATS (--target nats://127.0.0.1:4222) or
RabbitMQ (--target amqp://guest:guest@127.0.0.1:5672/). The broker's CPU
time is read from /proc for the process listening on the target's port
(or --server-pid); with an embedded node it is the whole process's.`,
	}
	p := cmd.PersistentFlags()
	p.BoolVar(&f.embedded, "embedded", false, "run against a Courier node embedded in this process (the default without --url or --target)")
	p.StringVar(&f.url, "url", "", "Courier server URL, such as courier://127.0.0.1:7400")
	p.StringVar(&f.target, "target", "", "broker URL: courier://..., nats://127.0.0.1:4222 or amqp://guest:guest@127.0.0.1:5672/")
	p.IntVar(&f.size, "size", 0, "body size in bytes (default: 4 for reqresp, 128 for pubsub)")
	p.DurationVar(&f.timeout, "timeout", 5*time.Minute, "bound on the whole run")
	p.IntVar(&f.serverPID, "server-pid", 0, "the broker's process id for CPU and memory (default: the process listening on the target's port)")
	p.BoolVar(&f.json, "json", false, "print one JSON object with the results")
	p.StringVar(&f.cpuprofile, "cpuprofile", "", "write a CPU profile of this process to this file (with --embedded it covers the broker)")

	rr := &cobra.Command{
		Use:   "reqresp",
		Short: "Request-response: sequential and parallel ping-pong cycles",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd, "cycles", func(ctx context.Context, cfg bench.Config) (result, error) {
				return bench.RunReqResp(ctx, cfg)
			})
		},
	}
	rr.Flags().IntSliceVar(&f.counts, "count", []int{10000, 20000, 100000}, "cycles of each sequential run; parallel runs use the largest")
	rr.Flags().IntSliceVar(&f.parallel, "parallel", []int{2, 4, 10, 100}, "requesting goroutines of each parallel run")
	rr.Flags().IntVar(&f.warmup, "warmup", 1000, "cycles run before measuring (0 for none)")

	ps := &cobra.Command{
		Use:   "pubsub",
		Short: "Pub-sub fan-out: one publisher, N subscribers on their own connections",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd, "msgs", func(ctx context.Context, cfg bench.Config) (result, error) {
				return bench.RunPubSub(ctx, cfg)
			})
		},
	}
	ps.Flags().IntVar(&f.subscribers, "subscribers", 10, "subscribers, each on its own connection")
	ps.Flags().IntVar(&f.messages, "messages", 1000000, "messages to publish")
	ps.Flags().DurationVar(&f.drain, "drain", 3*time.Second, "how long to wait for deliveries that stopped coming before counting them lost")

	cmd.AddCommand(rr, ps)
	return cmd
}

// result is what both scenarios return.
type result interface {
	WriteText(io.Writer) error
	WriteJSON(io.Writer) error
}

func (f *benchFlags) config() (bench.Config, error) {
	raw := f.target
	switch {
	case f.url != "" && f.target != "" && f.url != f.target:
		return bench.Config{}, errors.New("bench: give --url or --target, not both")
	case f.url != "":
		raw = f.url
	}
	if f.embedded && raw != "" {
		return bench.Config{}, errors.New("bench: --embedded runs its own node: drop --url and --target")
	}
	t, err := bench.ParseTarget(raw)
	if err != nil {
		return bench.Config{}, err
	}
	if f.url != "" && t.Kind != bench.KindCourier {
		return bench.Config{}, fmt.Errorf("bench: --url is for Courier servers (courier://...); use --target for %s", t.Kind)
	}
	warmup := f.warmup
	if warmup == 0 {
		warmup = -1
	}
	return bench.Config{
		Target: t, Counts: f.counts, Parallel: f.parallel, Warmup: warmup, Size: f.size,
		Subscribers: f.subscribers, Messages: f.messages, Drain: f.drain, ServerPID: f.serverPID,
	}, nil
}

func (f *benchFlags) run(cmd *cobra.Command, unit string, scenario func(context.Context, bench.Config) (result, error)) error {
	cfg, err := f.config()
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if isTerminal(os.Stdout) && !f.json {
		bar := &benchBar{unit: unit}
		cfg.Progress = bar.update
		defer bar.finish()
	}
	if f.cpuprofile != "" {
		pf, err := os.Create(f.cpuprofile)
		if err != nil {
			return fmt.Errorf("bench: cpuprofile: %w", err)
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return fmt.Errorf("bench: cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
	defer cancel()
	res, runErr := scenario(ctx, cfg)
	if res == nil {
		return runErr
	}
	if f.json {
		err = res.WriteJSON(out)
	} else {
		err = res.WriteText(out)
	}
	if runErr != nil {
		return runErr
	}
	return err
}

// benchBar shows a progress bar on stderr, one per stage.
type benchBar struct {
	unit  string
	stage string
	bar   *progressbar.ProgressBar
}

// update is called from one goroutine at a time.
func (b *benchBar) update(stage string, done, total int64) {
	if stage != b.stage || b.bar == nil {
		b.finish()
		b.stage = stage
		b.bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(os.Stderr),
			progressbar.OptionSetDescription(stage),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString(b.unit),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
	}
	b.bar.Set64(done)
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
