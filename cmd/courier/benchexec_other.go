//go:build !unix

package main

import (
	"errors"
	"os"
	"os/exec"
)

// execBench runs courier-bench with args as a child sharing this
// process's standard streams, and exits with its exit code.
func execBench(path string, args []string) error {
	cmd := exec.Command(path, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		os.Exit(ee.ExitCode())
	}
	return err
}
