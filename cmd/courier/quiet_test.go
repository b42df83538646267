package main

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
)

// TestCLIQuiet: a client command prints its output and nothing else,
// and the server logs one line when the command's connection opens and
// one when it closes, with the reason of a normal close and no err=.
func TestCLIQuiet(t *testing.T) {
	var addr string
	var srv *cliProc
	for attempt := 0; ; attempt++ {
		addr = "127.0.0.1:" + cliFreePort(t)
		srv = cliStart(t, "", nil, "server", "--node", "quiet", "--listen", addr, "--http", "off", "--data", t.TempDir(), "--log-level", "info")
		up := func() bool {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				c.Close()
			}
			return err == nil
		}
		testutil.Eventually(cliWait, func() bool { return up() || srv.exited() })
		if !srv.exited() {
			break
		}
		if attempt == 2 {
			t.Fatalf("server exited:\n%s", srv.stderr.String())
		}
	}
	url := "courier://" + addr
	r := cliRun(t, "exchanges", "create", "cli.quiet", "--url", url)
	if r.code != 0 || r.stdout != "exchange cli.quiet: reqresp broadcast\n" || r.stderr != "" {
		t.Fatalf("exchanges create: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// The probe connections above closed the socket before a HELLO: the
	// command's connection is the one that says its name.
	var open, closed []string
	testutil.WaitForf(t, cliWait, func() bool {
		open, closed = nil, nil
		for _, l := range strings.Split(srv.stderr.String(), "\n") {
			switch {
			case strings.Contains(l, `msg="connection open"`):
				open = append(open, l)
			case strings.Contains(l, `msg="connection closed"`):
				closed = append(closed, l)
			}
		}
		return len(closed) == 1
	}, "the server logs the command's connection closing")
	if len(open) != 1 || !strings.Contains(open[0], "level=INFO") || !strings.Contains(open[0], "name=courier-cli") {
		t.Errorf("connection open lines: %q", open)
	}
	if c := closed[0]; !strings.Contains(c, "level=INFO") || strings.Contains(c, "err=") || !strings.Contains(c, `reason="the client sent CLOSE: client closed"`) {
		t.Errorf("connection closed line: %q", c)
	}
	if n := strings.Count(srv.stderr.String(), "conn=quiet/c1 "); n != 2 {
		t.Errorf("%d lines about the command's connection, want 2:\n%s", n, srv.stderr.String())
	}
}
