//go:build unix

package main

import (
	"fmt"
	"os"
	"syscall"
)

// execBench replaces this process with courier-bench and args, so that
// its output, signals and exit code are the user's as if they had run it.
func execBench(path string, args []string) error {
	argv := append([]string{path}, args...)
	if err := syscall.Exec(path, argv, os.Environ()); err != nil {
		return fmt.Errorf("courier bench: run %s: %w", path, err)
	}
	return nil // not reached: Exec returns only on failure
}
