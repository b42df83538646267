// Command courier-bench is Courier's load generator: request-response,
// pub-sub, many-users, durable tasks, backlog and management-API scenarios
// against an embedded Courier node, a Courier server, NATS or RabbitMQ.
//
// It is a binary of its own, as NATS and RabbitMQ ship their benchmark
// tools apart from their servers, so that the courier server binary does
// not link the NATS and AMQP clients, gonum/plot and its fonts, the
// progress bar and the HDR histogram. `courier bench ARGS` runs
// `courier-bench ARGS` when courier-bench is in courier's directory.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := benchCmd()
	root.SilenceUsage = true
	root.SilenceErrors = true
	root.Version = version()
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// version is the module version courier-bench was built from, as
// debug.ReadBuildInfo gives it: a tag with go install module@version,
// "(devel)" for a build in a clone.
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
