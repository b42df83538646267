package main

import (
	"strings"
	"testing"
)

// TestServerNodeName: `courier server` without --node names itself at
// its first start and keeps that name after a restart, a kill -9
// included; another --node on that data directory exits 2 with an error
// that says how to proceed.
func TestServerNodeName(t *testing.T) {
	dir := t.TempDir()
	start := func() string {
		t.Helper()
		srv := cliStart(t, "", nil, "server", "--listen", "127.0.0.1:0", "--http", "off", "--data", dir, "--log-level", "info")
		srv.waitStderr(t, "courier server started")
		defer srv.kill()
		for _, l := range strings.Split(srv.stderr.String(), "\n") {
			if _, rest, ok := strings.Cut(l, `msg="courier server started" node=`); ok {
				name, _, _ := strings.Cut(rest, " ")
				return name
			}
		}
		t.Fatalf("no node name in the log:\n%s", srv.stderr.String())
		return ""
	}
	first := start()
	if first == "" || first == "n1" || !strings.Contains(first, "-") {
		t.Fatalf("generated name %q", first)
	}
	if again := start(); again != first {
		t.Fatalf("restarted as %q, first started as %q", again, first)
	}
	r := cliRun(t, "server", "--node", "other", "--listen", "127.0.0.1:0", "--http", "off", "--data", dir)
	if r.code != exitUsage || !strings.Contains(r.stderr, "--node "+first) || !strings.Contains(r.stderr, `not "other"'s`) {
		t.Errorf("server --node other on %s's data: exit %d\n%s", first, r.code, r.stderr)
	}
}
