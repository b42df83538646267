// Command courier runs the Courier broker (courier server) and client
// tools in the style of the nats CLI. The load generator is its own
// binary, courier-bench (cmd/courier-bench); courier bench runs it.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/courier-mq/courier/internal/buildinfo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := &cobra.Command{
		Use:           "courier",
		Short:         "Courier: a broker for distributed, reactive services",
		Long:          "Courier: a broker for distributed, reactive services.\n\n" + exitCodesHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       buildinfo.Version(),
	}
	root.SetVersionTemplate("courier " + buildinfo.Long() + "\n")
	for _, add := range commands {
		root.AddCommand(add())
	}
	markUsage(root)
	err := root.ExecuteContext(ctx)
	stop()
	exit(err)
}

// commands holds the constructors of the subcommands; each file adds its
// own in an init function, so that commands live one per file.
var commands []func() *cobra.Command
