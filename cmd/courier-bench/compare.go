package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/courier-mq/courier/internal/bench"
)

// compareCmd is courier-bench compare.
func compareCmd(g *benchGlobal) *cobra.Command {
	var (
		courierURL, natsURL string
		amqpURLs            []string
		cases               []string
		size, count, depth  int
		duration            time.Duration
	)
	cmd := &cobra.Command{
		Use:   "compare",
		Short: "Run scenarios against Courier, NATS and RabbitMQ one after another and print one table with the ratios",
		Long: `compare runs each case against each target in turn, on this machine, and
prints one table: a row per figure, a column per target, and Courier's
ratio to each other target (above 1: Courier did better). A target that
does not accept connections is skipped with a line saying so. --amqp
takes several URLs, such as RabbitMQ's and Courier's AMQP port; each
AMQP column is headed by the product its server announces (RabbitMQ,
Courier AMQP), and the ratios compare the Courier server with each. With
--embedded, an embedded Courier node comes first (and the ratios are
about it).

Cases: reqresp (sequential and parallel request-response), fanout (one
publisher, 10 subscribers), fanin (10 publishers, one subscriber), users
(100 users for 10s), tasks (100000 durable 1 KB tasks with confirms, one
worker with prefetch 100; NATS: JetStream) and backlog (publish two,
receive and ack one, to a depth of 200000). Their counts are smaller than
the scenarios' own defaults, so that a comparison takes minutes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.url != "" || g.target != "" || g.harness {
				return errors.New("bench compare: give the targets with --courier, --nats and --amqp")
			}
			var targets []bench.Target
			if g.embedded {
				targets = append(targets, bench.Target{Kind: bench.KindEmbedded})
			}
			for _, raw := range append([]string{courierURL, natsURL}, amqpURLs...) {
				if raw == "" {
					continue
				}
				t, err := bench.ParseTarget(raw)
				if err != nil {
					return err
				}
				targets = append(targets, t)
			}
			if len(targets) == 0 {
				return errors.New("bench compare: no targets")
			}
			cc := bench.CompareConfig{
				Targets: targets, Cases: cases,
				Config: bench.Config{Size: size, Count: count, Duration: duration, Interval: g.interval,
					Queue: bench.QueueConfig{Depth: depth}},
				Log: func(line string) { fmt.Fprintln(os.Stderr, line) },
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
			defer cancel()
			res, err := bench.Compare(ctx, cc)
			if res == nil {
				return err
			}
			out := cmd.OutOrStdout()
			var werr error
			if g.json {
				werr = res.WriteJSON(out)
			} else {
				werr = res.WriteText(out)
			}
			return errors.Join(err, werr)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&courierURL, "courier", "courier://127.0.0.1:7400", "Courier server URL (empty to leave out)")
	fs.StringVar(&natsURL, "nats", "nats://127.0.0.1:4222", "NATS URL (empty to leave out)")
	fs.StringSliceVar(&amqpURLs, "amqp", []string{"amqp://guest:guest@127.0.0.1:5672/"}, "AMQP 0-9-1 URLs, comma-separated: RabbitMQ, Courier's AMQP port (empty to leave out)")
	fs.StringSliceVar(&cases, "cases", []string{"reqresp", "fanout", "fanin"}, "cases to run: reqresp, fanout, fanin, users, tasks, backlog")
	fs.IntVar(&size, "size", 0, "body size in bytes (default: each scenario's)")
	fs.IntVar(&count, "count", 0, "cycles, messages or tasks of each run (default: 20000 sequential and 50000 parallel cycles, 100000 messages or tasks)")
	fs.IntVar(&depth, "depth", 0, "queue depth of the backlog case (default 200000)")
	fs.DurationVar(&duration, "duration", 0, "bound each run by time (users: its length, default 10s)")
	return cmd
}
