package main

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
)

// adminServer runs `courier server` with the management API on a free
// loopback port and returns the client URL and the API URL.
func adminServer(t *testing.T) (url, api string) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		addr, httpAddr := "127.0.0.1:"+cliFreePort(t), "127.0.0.1:"+cliFreePort(t)
		srv := cliStart(t, "", nil, "server", "--node", "cli-admin", "--listen", addr, "--http", httpAddr, "--data", t.TempDir(), "--log-level", "warn")
		var err error
		up := func() bool {
			var resp *http.Response
			if resp, err = http.Get("http://" + httpAddr + "/api/overview"); err == nil {
				resp.Body.Close()
				return true
			}
			return false
		}
		testutil.Eventually(cliWait, func() bool { return up() || srv.exited() })
		if err == nil {
			return "courier://" + addr, "http://" + httpAddr
		}
		if !srv.exited() || attempt == 2 {
			t.Fatalf("management API on %s not up: %v\nstderr:\n%s", httpAddr, err, srv.stderr.String())
		}
	}
}

func TestCLIAdmin(t *testing.T) {
	url, api := adminServer(t)
	u := func(args ...string) []string { return append(args, "--url", url) }
	a := func(args ...string) []string { return append(args, "--api", api) }
	cliOK(t, u("exchanges", "create", "cli.news", "--pattern", "pubsub")...)
	sub := cliStart(t, "", nil, u("sub", "cli.news", "#")...)
	sub.waitStderr(t, "subscribed to")
	cliOK(t, u("pub", "cli.news", "k", "hello", "--count", "3")...)

	t.Run("Overview", func(t *testing.T) {
		out := cliOK(t, a("overview")...)
		for _, w := range []string{"node", "cli-admin", "objects", "1 connections, 1 exchanges, 0 queues, 1 attachments",
			"listeners", "courier 127.0.0.1:", "http 127.0.0.1:", "alarms", "none", "MESSAGES", "publish", "deliver"} {
			if !strings.Contains(out, w) {
				t.Errorf("overview lacks %q:\n%s", w, out)
			}
		}
		testutil.WaitForf(t, 10*time.Second, func() bool {
			var o struct {
				MessageStats struct{ Publish, Deliver int } `json:"message_stats"`
			}
			json.Unmarshal([]byte(cliOK(t, a("overview", "--json")...)), &o)
			return o.MessageStats.Publish == 3 && o.MessageStats.Deliver == 3
		}, "overview --json counts 3 publishes and 3 deliveries")
	})

	t.Run("Connections", func(t *testing.T) {
		out := cliOK(t, a("connections")...)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "ID") || !strings.HasPrefix(lines[1], "cli-admin/c") || !strings.Contains(lines[1], "courier-cli") ||
			!strings.Contains(lines[1], "network") || !strings.Contains(lines[1], "127.0.0.1:") {
			t.Errorf("connections table:\n%s", out)
		}
		var list []map[string]any
		if err := json.Unmarshal([]byte(cliOK(t, a("connections", "--json")...)), &list); err != nil || len(list) != 1 ||
			list[0]["type"] != "network" || list[0]["attachments"] != 1.0 {
			t.Errorf("connections --json: %v %v", err, list)
		}
		// The API URL can come from the environment.
		r := cliRunIn(t, "", []string{"COURIER_API=" + api}, "connections", "--name", "nothing-matches")
		if r.code != 0 || strings.Count(r.stdout, "\n") != 1 {
			t.Errorf("connections with COURIER_API and --name: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		cliFails(t, exitFailure, a("connections", "--sort", "bogus"), `cannot sort by "bogus"`, "HTTP 400")
	})

	t.Run("Queues", func(t *testing.T) {
		if out := cliOK(t, a("queues")...); out != "no queues\n" {
			t.Errorf("queues printed %q", out)
		}
		if out := cliOK(t, a("queues", "--json")...); strings.TrimSpace(out) != "[]" {
			t.Errorf("queues --json printed %q", out)
		}
	})

	t.Run("Errors", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := "http://" + ln.Addr().String()
		ln.Close()
		cliFails(t, exitConnect, []string{"overview", "--api", dead}, "cannot reach the management API", dead)
		cliFails(t, exitUsage, []string{"queues", "--api", "ftp://x"}, "bad --api")
	})
}

func TestCLIServerHTTPFlag(t *testing.T) {
	// --http off: no management listener.
	addr, httpAddr := "127.0.0.1:"+cliFreePort(t), "127.0.0.1:"+cliFreePort(t)
	srv := cliStart(t, "", nil, "server", "--listen", addr, "--http", "off", "--data", t.TempDir())
	srv.waitStderr(t, "courier server started")
	if strings.Contains(srv.stderr.String(), "management API listening") {
		t.Errorf("--http off still serves HTTP:\n%s", srv.stderr.String())
	}
	srv.kill()

	// Not loopback: refused with the reason.
	cliFails(t, exitFailure, []string{"server", "--listen", addr, "--http", "0.0.0.0:" + strings.Split(httpAddr, ":")[1], "--data", t.TempDir()}, "loopback")

	// An address in use, given explicitly: an error.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// (--amqp off: another test's server may hold AMQP's default port,
	// and its warning would be a second line.)
	cliFails(t, exitFailure, []string{"server", "--listen", addr, "--http", ln.Addr().String(), "--amqp", "off", "--data", t.TempDir(), "--log-level", "warn"}, ln.Addr().String(), "address already in use")

	// The default address in use (another server on this machine): the
	// server runs without the management API and says so.
	if l, err := net.Listen("tcp", "127.0.0.1:7480"); err == nil {
		defer l.Close()
	}
	srv = cliStart(t, "", nil, "server", "--listen", addr, "--data", t.TempDir())
	srv.waitStderr(t, "courier server started")
	if !strings.Contains(srv.stderr.String(), "management API off") {
		t.Errorf("no warning with 127.0.0.1:7480 taken:\n%s", srv.stderr.String())
	}
}
