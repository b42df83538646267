package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/spf13/cobra"
)

func init() { commands = append(commands, benchExecCmd) }

// benchBinary is the load generator's own binary (cmd/courier-bench).
const benchBinary = "courier-bench"

// errNoBench is returned by courier bench when courier-bench is not in
// courier's directory.
var errNoBench = errors.New("courier bench: the load generator is its own binary, " + benchBinary)

// benchExecCmd is courier bench: it runs courier-bench from courier's
// directory with the same arguments, so that the server binary does not
// link the load generator's dependencies.
func benchExecCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "bench [scenario] [flags]",
		Short: "Run the load generator, " + benchBinary + ", if it is in courier's directory",
		Long: `The load generator is its own binary, courier-bench, as NATS and RabbitMQ
ship their benchmark tools apart from their servers: the server binary
does not link the NATS and AMQP clients, the plotting or the progress bar.

courier bench ARGS runs courier-bench ARGS (it replaces this process) when
courier-bench is in the same directory as the courier executable, as
go install and the release archives put them. Otherwise it says how to
get courier-bench, and exits with an error. See courier-bench --help.`,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := findBench()
			if err != nil {
				return err
			}
			return execBench(path, args)
		},
	}
}

// findBench returns the path of courier-bench in the directory of the
// running courier executable (symbolic links resolved), or an error that
// tells how to build or install it.
func findBench() (string, error) {
	exe, err := os.Executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil {
		return "", fmt.Errorf("%w: cannot find courier's own path: %w", errNoBench, err)
	}
	name := benchBinary
	if runtime.GOOS == "windows" {
		name += ".exe"
	}
	path := filepath.Join(filepath.Dir(exe), name)
	if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
		return path, nil
	}
	return "", fmt.Errorf(`%w, and there is no %s next to %s.
Build it beside courier: go build -o %s ./cmd/courier-bench
Install both:            go install github.com/courier-mq/courier/cmd/...@latest
Run it from a clone:     go run ./cmd/courier-bench SCENARIO [flags]`,
		errNoBench, name, exe, path)
}
