package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/courier-mq/courier/internal/bench"
)

// idleCmd is courier-bench idle.
func idleCmd(g *benchGlobal) *cobra.Command {
	var cfg bench.IdleConfig
	cmd := &cobra.Command{
		Use:   "idle",
		Short: "The cost of a cluster at rest: each server's CPU and RSS after declaring N exchanges (NATS: subscriptions)",
		Long: `idle declares --exchanges exchanges spread round-robin over the servers
given (--url for Courier, --target for NATS: a comma-separated list of
every node's client URL), keeps the connections that declared them open
and silent, waits --settle, then reads each server's CPU time from
/proc/PID/stat over --window and its resident memory, and prints them per
server. NATS has no exchanges: as many subscriptions, each to a subject of
its own, are the nearest analogue (interest every server of the cluster
learns). With --baseline it also watches a window before declaring. The
Courier exchanges are deleted at the end.

  courier-bench idle --url courier://127.0.0.1:7410,courier://127.0.0.1:7420,courier://127.0.0.1:7430
  courier-bench idle --target nats://127.0.0.1:4231,nats://127.0.0.1:4232,nats://127.0.0.1:4233`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			raw := g.url
			if raw == "" {
				raw = g.target
			}
			if raw == "" || g.embedded || g.harness || (g.url != "" && g.target != "") {
				return errors.New("bench idle: give the servers with --url (Courier) or --target (NATS)")
			}
			cfg.Nodes = strings.Split(raw, ",")
			if g.serverPID != 0 {
				cfg.PIDs = []int{g.serverPID}
			}
			cfg.Log = func(line string) { fmt.Fprintln(os.Stderr, line) }
			timeout := g.timeout
			if !g.timeoutChanged(cmd) {
				timeout = max(timeout, 2*cfg.Window+cfg.Settle+10*time.Minute)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			res, err := bench.RunIdle(ctx, cfg)
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
	fs.IntVar(&cfg.Exchanges, "exchanges", 10000, "exchanges to declare (NATS: subscriptions), spread over the servers")
	fs.DurationVar(&cfg.Window, "window", 30*time.Second, "how long each server's CPU is watched")
	fs.DurationVar(&cfg.Settle, "settle", 5*time.Second, "how long the cluster is left alone after declaring, before the window")
	fs.BoolVar(&cfg.Baseline, "baseline", false, "also watch a window before declaring")
	return cmd
}
