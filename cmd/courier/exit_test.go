package main

import (
	"strings"
	"testing"
)

// TestCLIUsageExitCode: unknown commands, subcommands and flags, and
// missing arguments, exit 2 with one error line; help and version exit
// 0; `courier --help` documents every exit code.
func TestCLIUsageExitCode(t *testing.T) {
	for _, args := range [][]string{
		{"bogus"},
		{"task", "bogus"},
		{"users", "bogus"},
		{"exchanges", "bogus"},
		{"req", "x", "--bogus"},
		{"pub", "x"},
		{"server", "extra"},
		{"server", "--log-level", "loud", "--http", "off", "--listen", "127.0.0.1:0", "--data", t.TempDir()},
		{"server", "--max-frame", "-5", "--http", "off", "--listen", "127.0.0.1:0", "--data", t.TempDir()},
	} {
		cliFails(t, exitUsage, args)
	}
	for _, args := range [][]string{{"task"}, {"--help"}, {"--version"}} {
		cliOK(t, args...)
	}
	help := cliOK(t, "--help")
	for _, w := range []string{"Exit codes:", "  0  success", "  1  the operation failed", "  2  usage", "  3  connection", "  4  not found", "  5  refused"} {
		if !strings.Contains(help, w) {
			t.Errorf("courier --help lacks %q:\n%s", w, help)
		}
	}
}
