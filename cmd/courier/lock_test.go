package main

import (
	"runtime"
	"strconv"
	"testing"
)

// TestCLISecondServerNamesHolder: a second server on a data directory in
// use fails at once, naming the process that holds it.
func TestCLISecondServerNamesHolder(t *testing.T) {
	data := t.TempDir()
	_, first := cliServer(t, "--data", data)
	want := []string{"data directory " + data + " is in use", "process " + strconv.Itoa(first.cmd.Process.Pid), "LOCK", "another --data"}
	if runtime.GOOS == "linux" {
		want = append(want, "courier server")
	}
	cliFails(t, exitFailure, []string{"server", "--listen", "127.0.0.1:0", "--http", "off", "--data", data}, want...)
}
