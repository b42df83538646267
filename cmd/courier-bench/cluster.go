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

// clusterCmd is courier-bench cluster.
func clusterCmd(g *benchGlobal) *cobra.Command {
	var (
		cc                               bench.ClusterConfig
		size, count, parallelCount, subs int
		warmup                           int
		parallel                         []int
		duration                         time.Duration
	)
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Compare a Courier cluster, a NATS cluster and a single Courier server across nodes, side by side in one run",
		Long: `cluster runs each case against a Courier cluster (--courier-nodes), a NATS
cluster (--nats-nodes) and a single Courier server (--single) in turn,
--rounds times with the columns taking turns, and prints one table of the
medians with the Courier cluster's ratio to each other column (above 1:
Courier did better). A column with a node that does not accept
connections is skipped with a line saying so.

Cases:
  reqresp-cross  request-response, requesters on the first node, the
                 handler on the second: sequential and Parallel 100
  reqresp-same   the same with both on the first node
  fanout-spread  one publisher on the first node, --subscribers spread
                 round-robin over every node; with --courier-http, the
                 link counters of each Courier node (GET /api/nodes)
                 over 20 publications, and the copies of one publication
                 that crossed the links
The single server runs every case with all its clients on it: the
baseline a cluster's single-node path is held to.

scripts/cluster.sh starts the clusters on loopback and prints their
URLs (scripts/cluster.sh urls nats).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.url != "" || g.target != "" || g.harness || g.embedded {
				return errors.New("bench cluster: give the nodes with --courier-nodes, --nats-nodes and --single")
			}
			if len(cc.Courier) == 0 && len(cc.NATS) == 0 && cc.Single == "" {
				return errors.New("bench cluster: no columns: give --courier-nodes, --nats-nodes or --single")
			}
			if warmup == 0 {
				warmup = -1
			}
			cc.Config = bench.Config{Size: size, Count: count, ParallelCount: parallelCount, Parallel: parallel,
				Subscribers: subs, Duration: duration, Warmup: warmup, Interval: g.interval}
			if !cmd.Flags().Changed("parallel") {
				cc.Config.Parallel = nil
			}
			cc.Log = func(line string) { fmt.Fprintln(os.Stderr, line) }
			timeout := g.timeout
			if !g.timeoutChanged(cmd) {
				timeout = max(timeout, bench.ClusterTimeout)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			res, err := bench.CompareClusters(ctx, cc)
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
	fs.StringSliceVar(&cc.Courier, "courier-nodes", nil, "the Courier cluster's client URLs, node A first (courier://127.0.0.1:7410,courier://127.0.0.1:7420,...)")
	fs.StringSliceVar(&cc.CourierHTTP, "courier-http", nil, "the Courier nodes' management URLs, for the link counters (http://127.0.0.1:7481,...)")
	fs.StringSliceVar(&cc.NATS, "nats-nodes", nil, "the NATS cluster's client URLs, server A first (nats://127.0.0.1:4231,nats://127.0.0.1:4232,...)")
	fs.StringVar(&cc.Single, "single", "", "a single-node Courier server, the baseline (courier://127.0.0.1:7400)")
	fs.StringSliceVar(&cc.Cases, "cases", bench.ClusterCases, "cases to run: reqresp-cross, reqresp-same, fanout-spread")
	fs.IntVar(&cc.Rounds, "rounds", 1, "runs of each case on each column, taking turns; the table shows medians")
	fs.IntVar(&size, "size", 0, "body size in bytes (default: 4 for request-response, 128 for fan-out)")
	fs.IntVar(&count, "count", 0, "cycles of each request-response run (default: 20000 sequential, 50000 parallel)")
	fs.IntVar(&cc.Messages, "messages", 0, "messages of the fan-out, each delivered to every subscriber (default 200)")
	fs.IntVar(&parallelCount, "parallel-count", 0, "cycles of each parallel run (default: --count, else 50000)")
	fs.IntSliceVar(&parallel, "parallel", []int{100}, "requesting goroutines of each parallel run")
	fs.IntVar(&subs, "subscribers", 0, "fan-out subscribers, each on its own connection (default 10000)")
	fs.IntVar(&warmup, "warmup", 1000, "cycles or messages run before measuring (0 for none)")
	fs.DurationVar(&duration, "duration", 0, "bound each run by time")
	return cmd
}
