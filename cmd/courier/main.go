// Command courier runs the Courier broker (courier server) and client
// tools in the style of the nats CLI. The load generator is its own
// binary, courier-bench (cmd/courier-bench); courier bench runs it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := &cobra.Command{
		Use:           "courier",
		Short:         "Courier: a broker for distributed, reactive services",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	for _, add := range commands {
		root.AddCommand(add())
	}
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// commands holds the constructors of the subcommands; each file adds its
// own in an init function, so that commands live one per file.
var commands []func() *cobra.Command
