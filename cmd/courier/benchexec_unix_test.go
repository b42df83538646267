//go:build unix

package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// benchDir returns a directory holding a copy of courier and, if script
// is not empty, a courier-bench shell script with that body and mode.
func benchDir(t *testing.T, script string, mode os.FileMode) string {
	t.Helper()
	dir := t.TempDir()
	b, err := os.ReadFile(cliBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "courier"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	if script != "" {
		if err := os.WriteFile(filepath.Join(dir, "courier-bench"), []byte("#!/bin/sh\n"+script), mode); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// runIn runs path with args and returns its stdout, stderr and exit code.
func runIn(t *testing.T, path string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(path, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = cliEnv()
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), stderr.String(), 0
	case errors.As(err, &ee):
		return stdout.String(), stderr.String(), ee.ExitCode()
	}
	t.Fatalf("%s %v: %v", path, args, err)
	return "", "", -1
}

// TestBenchRunsCourierBench: courier bench ARGS becomes courier-bench ARGS
// when it is in courier's directory, found through a symbolic link to
// courier too: the arguments verbatim (flags and --help included), its
// output and its exit code.
func TestBenchRunsCourierBench(t *testing.T) {
	dir := benchDir(t, `printf '%s\n' "$0" "$@"; echo oops >&2; exit 7`+"\n", 0o755)
	link := filepath.Join(t.TempDir(), "courier")
	if err := os.Symlink(filepath.Join(dir, "courier"), link); err != nil {
		t.Fatal(err)
	}
	for _, exe := range []string{filepath.Join(dir, "courier"), link} {
		args := []string{"reqresp", "--count", "5,6", "--json", "--help", "a b"}
		stdout, stderr, code := runIn(t, exe, append([]string{"bench"}, args...)...)
		want := filepath.Join(dir, "courier-bench") + "\n" + strings.Join(args, "\n") + "\n"
		if stdout != want || stderr != "oops\n" || code != 7 {
			t.Errorf("%s bench: exit %d, stdout %q, stderr %q; want exit 7, stdout %q, stderr \"oops\\n\"", exe, code, stdout, stderr, want)
		}
	}
}

// TestBenchNotExecutable: a courier-bench that is not executable is not
// run; courier bench says how to get one.
func TestBenchNotExecutable(t *testing.T) {
	dir := benchDir(t, "exit 0\n", 0o644)
	stdout, stderr, code := runIn(t, filepath.Join(dir, "courier"), "bench", "echo")
	if code == 0 || stdout != "" || !strings.Contains(stderr, "there is no courier-bench next to "+filepath.Join(dir, "courier")) {
		t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
