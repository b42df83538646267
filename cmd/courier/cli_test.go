package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
)

// These tests run the courier binary as a user would: built once, a real
// `courier server` process on a free loopback port, and the client tools
// against it, checking their output, exit codes and error messages.

// cliBin is the courier binary built by TestMain.
var cliBin string

// cliSysProcAttr, if set, gives the attributes of child processes.
var cliSysProcAttr func() *syscall.SysProcAttr

// cliWait bounds every wait for a process or a condition.
const cliWait = 20 * time.Second

func TestMain(m *testing.M) { os.Exit(cliTestMain(m)) }

func cliTestMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "courier-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	cliBin = filepath.Join(dir, "courier")
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	build := exec.Command(gobin, "build", "-o", cliBin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// cliBuffer collects a process's output while it runs.
type cliBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (l *cliBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *cliBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// cliProc is a courier process.
type cliProc struct {
	args           []string
	cmd            *exec.Cmd
	stdout, stderr cliBuffer
	done           chan struct{} // closed when the process has exited
	err            error         // from Wait, set before done closes
}

// cliEnv is the environment of child processes: COURIER_URL removed so
// that only what a test passes counts.
func cliEnv(extra ...string) []string {
	e := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "COURIER_URL=") })
	return append(e, extra...)
}

// cliStart starts courier with args in the background. The process is killed
// when the test ends if it is still running.
func cliStart(t *testing.T, stdin string, envs []string, args ...string) *cliProc {
	t.Helper()
	p := &cliProc{args: args, done: make(chan struct{})}
	p.cmd = exec.Command(cliBin, args...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.Stdin = strings.NewReader(stdin)
	p.cmd.Env = cliEnv(envs...)
	if cliSysProcAttr != nil {
		p.cmd.SysProcAttr = cliSysProcAttr()
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start courier %v: %v", args, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	return p
}

// kill ends the process if it still runs, and waits for it.
func (p *cliProc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Kill()
	<-p.done
}

func (p *cliProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits for the process to exit and returns its exit code.
func (p *cliProc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(cliWait):
		p.kill()
		t.Fatalf("courier %v still running after %v\nstdout:\n%s\nstderr:\n%s", p.args, cliWait, p.stdout.String(), p.stderr.String())
	}
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("courier %v: %v", p.args, p.err)
	return -1
}

// waitStderr waits until the process has written want on stderr, which
// the long-running tools do once they are attached.
func (p *cliProc) waitStderr(t *testing.T, want string) {
	t.Helper()
	written := func() bool { return strings.Contains(p.stderr.String(), want) }
	testutil.Eventually(cliWait, func() bool { return written() || p.exited() })
	if !written() {
		t.Fatalf("courier %v did not write %q (exited: %v)\nstdout:\n%s\nstderr:\n%s", p.args, want, p.exited(), p.stdout.String(), p.stderr.String())
	}
}

// cliResult is what a finished command left.
type cliResult struct {
	code           int
	stdout, stderr string
}

// cliRun runs courier with args to completion.
func cliRun(t *testing.T, args ...string) cliResult {
	t.Helper()
	return cliRunIn(t, "", nil, args...)
}

// cliRunIn runs courier with stdin and extra environment.
func cliRunIn(t *testing.T, stdin string, envs []string, args ...string) cliResult {
	t.Helper()
	p := cliStart(t, stdin, envs, args...)
	code := p.wait(t)
	return cliResult{code: code, stdout: p.stdout.String(), stderr: p.stderr.String()}
}

// cliOK runs courier and fails the test unless it succeeds.
func cliOK(t *testing.T, args ...string) string {
	t.Helper()
	r := cliRun(t, args...)
	if r.code != 0 {
		t.Fatalf("courier %v: exit %d\nstdout:\n%s\nstderr:\n%s", args, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// cliFails runs courier, expects exit code code with an "error:" line on
// stderr that contains every piece of want, and nothing on stdout.
func cliFails(t *testing.T, code int, args []string, want ...string) {
	t.Helper()
	r := cliRun(t, args...)
	if r.code != code {
		t.Fatalf("courier %v: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", args, r.code, code, r.stdout, r.stderr)
	}
	if !strings.HasPrefix(r.stderr, "error: ") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("courier %v: stderr %q, want one line starting with \"error: \"", args, r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("courier %v: stderr %q lacks %q", args, r.stderr, w)
		}
	}
	if r.stdout != "" {
		t.Errorf("courier %v: stdout %q on failure, want nothing", args, r.stdout)
	}
}

// cliFreePort returns a loopback port that was free a moment ago.
func cliFreePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
}

// cliFreeClusterPort returns a port free for both TCP and UDP, as a
// cluster address needs both (memberlist probes over UDP): a port free
// for TCP alone can have its UDP twin taken by another test's node.
func cliFreeClusterPort(t *testing.T) string {
	t.Helper()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		ln.Close()
		if err == nil {
			udp.Close()
			return fmt.Sprint(port)
		}
	}
	t.Fatal("no port free for both TCP and UDP in 100 tries")
	return ""
}

// cliServer runs `courier server` on a free port and returns its URL once
// it accepts connections, with extra flags. It is killed when the test
// ends.
func cliServer(t *testing.T, extra ...string) (url string, srv *cliProc) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		addr := "127.0.0.1:" + cliFreePort(t)
		// No management or AMQP listener: on a machine where another server holds
		// its default address, the server would retry without it, and the
		// probe below could reach the first attempt's listener before it
		// closes, and the test's first command miss the second's.
		srv = cliStart(t, "", nil, append([]string{"server", "--listen", addr, "--http", "off", "--amqp", "off", "--data", t.TempDir(), "--log-level", "warn"}, extra...)...)
		var err error
		accepts := func() bool {
			var c net.Conn
			if c, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				return true
			}
			return false
		}
		testutil.Eventually(cliWait, func() bool { return accepts() || srv.exited() })
		if err == nil {
			return "courier://" + addr, srv
		}
		if !srv.exited() {
			t.Fatalf("server on %s does not accept connections after %v: %v\nstderr:\n%s", addr, cliWait, err, srv.stderr.String())
		}
		// The port was taken between cliFreePort and the server's bind.
		if attempt == 2 {
			t.Fatalf("server exited: %v\nstderr:\n%s", srv.err, srv.stderr.String())
		}
	}
}

// cliExchanges lists the server's exchanges with --json.
func cliExchanges(t *testing.T, url string) map[string]courier.ExchangeInfo {
	t.Helper()
	out := cliOK(t, "exchanges", "list", "--json", "--url", url)
	var list []courier.ExchangeInfo
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("exchanges list --json: %v\n%s", err, out)
	}
	m := make(map[string]courier.ExchangeInfo, len(list))
	for _, e := range list {
		m[e.Name] = e
	}
	return m
}

func TestCLI(t *testing.T) {
	url, srv := cliServer(t)
	u := func(args ...string) []string { return append(args, "--url", url) }

	t.Run("Exchanges", func(t *testing.T) {
		if out := cliOK(t, u("exchanges", "create", "cli.rr", "--strategy", "round-robin")...); out != "exchange cli.rr: reqresp round-robin\n" {
			t.Errorf("create printed %q", out)
		}
		if out := cliOK(t, u("exchanges", "create", "cli.news", "--pattern", "pubsub")...); out != "exchange cli.news: pubsub\n" {
			t.Errorf("create printed %q", out)
		}
		// Declaring again with the same options is not an error.
		cliOK(t, u("exchanges", "create", "cli.rr", "--strategy", "round-robin")...)

		exs := cliExchanges(t, url)
		if e, found := exs["cli.rr"]; !found || e.Pattern != "reqresp" || e.Strategy != "round-robin" {
			t.Errorf("cli.rr listed as %+v (found %v)", e, found)
		}
		if e, found := exs["cli.news"]; !found || e.Pattern != "pubsub" {
			t.Errorf("cli.news listed as %+v (found %v)", e, found)
		}
		// `exchanges` alone lists too, as a table.
		table := cliOK(t, u("exchanges")...)
		if !strings.HasPrefix(table, "NAME") || !strings.Contains(table, "cli.rr") || !strings.Contains(table, "round-robin") {
			t.Errorf("exchanges table:\n%s", table)
		}

		if out := cliOK(t, u("exchanges", "delete", "cli.news")...); out != "exchange cli.news deleted\n" {
			t.Errorf("delete printed %q", out)
		}
		if _, found := cliExchanges(t, url)["cli.news"]; found {
			t.Error("cli.news still listed after delete")
		}
		cliFails(t, exitNotFound, u("exchanges", "delete", "cli.news"), "not found", `"cli.news"`)

		// --replicas: a server alone keeps a queue on itself only.
		cliOK(t, u("exchanges", "create", "cli.r1", "--pattern", "tasks", "--replicas", "1")...)
		cliFails(t, exitFailure, u("exchanges", "create", "cli.r3", "--pattern", "tasks", "--replicas", "3"), "replicas 3 needs a cluster")
	})

	t.Run("ReplyReq", func(t *testing.T) {
		cliOK(t, u("exchanges", "create", "cli.echo", "--strategy", "round-robin")...)
		rep := cliStart(t, "", nil, u("reply", "cli.echo", "pong", "--count", "2")...)
		rep.waitStderr(t, "handling requests on cli.echo as ")
		if out := cliOK(t, u("req", "cli.echo", "ping")...); out != "pong\n" {
			t.Errorf("req printed %q, want \"pong\\n\"", out)
		}
		// The body can come from stdin.
		r := cliRunIn(t, "from stdin", nil, u("req", "cli.echo", "-")...)
		if r.code != 0 || r.stdout != "pong\n" {
			t.Errorf("req with stdin: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		if code := rep.wait(t); code != 0 {
			t.Fatalf("reply --count 2 exited %d\nstderr:\n%s", code, rep.stderr.String())
		}
		out := rep.stdout.String()
		if !strings.Contains(out, "[#1] request from ") || !strings.Contains(out, ": ping\n") || !strings.Contains(out, "[#2] request from ") || !strings.Contains(out, ": from stdin\n") {
			t.Errorf("reply printed:\n%s", out)
		}
		// The handler left: the exchange has no handler now, a clear
		// error rather than a timeout.
		cliFails(t, exitFailure, u("req", "cli.echo", "ping"), "no handler", `"cli.echo"`)
	})

	t.Run("SubPub", func(t *testing.T) {
		cliOK(t, u("exchanges", "create", "cli.prices", "--pattern", "pubsub")...)
		sub := cliStart(t, "", nil, u("sub", "cli.prices", "eu.#", "--count", "1")...)
		sub.waitStderr(t, "subscribed to eu.# on cli.prices as ")
		// A key the pattern does not match is not delivered; then one
		// that does ends the subscriber.
		cliOK(t, u("pub", "cli.prices", "us.nyc", "skip me")...)
		if out := cliOK(t, u("pub", "cli.prices", "eu.fr.paris", "bonjour")...); !strings.Contains(out, "published 1 message(s) to cli.prices") {
			t.Errorf("pub printed %q", out)
		}
		if code := sub.wait(t); code != 0 {
			t.Fatalf("sub --count 1 exited %d\nstderr:\n%s", code, sub.stderr.String())
		}
		if out := sub.stdout.String(); out != "[#1] eu.fr.paris: bonjour\n" {
			t.Errorf("sub printed %q", out)
		}
	})

	t.Run("Tasks", func(t *testing.T) {
		out := cliOK(t, u("exchanges", "create", "cli.jobs", "--pattern", "tasks", "--max-attempts", "3")...)
		if !strings.Contains(out, "exchange cli.jobs: tasks competing") {
			t.Errorf("create printed %q", out)
		}
		if out := cliOK(t, u("task", "submit", "cli.jobs", "resize me", "--count", "2", "--key", "k")...); out != "task 1 submitted to cli.jobs\ntask 2 submitted to cli.jobs\n" {
			t.Errorf("submit printed %q", out)
		}
		if out := cliOK(t, u("task", "work", "cli.jobs", "--count", "2")...); out != "[#1] task 1 (key k): resize me\n[#2] task 2 (key k): resize me\n" {
			t.Errorf("work printed %q", out)
		}
		// A watched task: submitted, handled by a worker, completed.
		w := cliStart(t, "", nil, u("task", "work", "cli.jobs", "--count", "1")...)
		w.waitStderr(t, "working on cli.jobs as ")
		out = cliOK(t, u("task", "submit", "cli.jobs", "watched", "--watch")...)
		if !strings.Contains(out, "task 3 submitted to cli.jobs\n") || !strings.Contains(out, "task 3: completed by ") {
			t.Errorf("submit --watch printed %q", out)
		}
		if code := w.wait(t); code != 0 {
			t.Fatalf("work --count 1 exited %d\nstderr:\n%s", code, w.stderr.String())
		}
		if exs := cliExchanges(t, url); exs["cli.jobs"].Queue == nil || exs["cli.jobs"].Queue.Messages != 0 {
			t.Errorf("cli.jobs after the work: %+v", exs["cli.jobs"].Queue)
		}
		cliFails(t, exitNotFound, u("task", "submit", "cli.nojobs", "x"), "not found", `"cli.nojobs"`)
	})

	t.Run("SubExchangeDeleted", func(t *testing.T) {
		cliOK(t, u("exchanges", "create", "cli.gone", "--pattern", "pubsub")...)
		sub := cliStart(t, "", nil, u("sub", "cli.gone", "#")...)
		sub.waitStderr(t, "subscribed to # on cli.gone")
		cliOK(t, u("exchanges", "delete", "cli.gone")...)
		if code := sub.wait(t); code != exitFailure {
			t.Fatalf("sub exited %d after its exchange was deleted, want 1\nstderr:\n%s", code, sub.stderr.String())
		}
		if s := sub.stderr.String(); !strings.Contains(s, "error: ") || !strings.Contains(s, `"cli.gone"`) || !strings.Contains(s, "deleted") {
			t.Errorf("sub's stderr:\n%s", s)
		}
	})

	t.Run("ReqAllBroadcast", func(t *testing.T) {
		cliOK(t, u("exchanges", "create", "cli.bcast", "--strategy", "broadcast")...)
		r1 := cliStart(t, "", nil, u("reply", "cli.bcast", "one", "--count", "1")...)
		r2 := cliStart(t, "", nil, u("reply", "cli.bcast", "two", "--count", "1")...)
		r1.waitStderr(t, "handling requests on cli.bcast as ")
		r2.waitStderr(t, "handling requests on cli.bcast as ")
		id1 := cliMemberID(t, r1)
		id2 := cliMemberID(t, r2)
		out := cliOK(t, u("req", "cli.bcast", "all?", "--all")...)
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		slices.Sort(lines)
		want := []string{id1 + ": one", id2 + ": two"}
		slices.Sort(want)
		if !slices.Equal(lines, want) {
			t.Errorf("req --all printed %q, want the lines %q", out, want)
		}
		for _, r := range []*cliProc{r1, r2} {
			if code := r.wait(t); code != 0 {
				t.Errorf("reply exited %d\nstderr:\n%s", code, r.stderr.String())
			}
		}
	})

	t.Run("URLFromEnv", func(t *testing.T) {
		r := cliRunIn(t, "", []string{"COURIER_URL=" + url}, "exchanges", "list", "--json")
		if r.code != 0 || !strings.Contains(r.stdout, `"cli.rr"`) {
			t.Errorf("with COURIER_URL: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
	})

	t.Run("Errors", func(t *testing.T) {
		closed := "courier://127.0.0.1:" + cliFreePort(t)
		for _, tc := range []struct {
			name string
			code int
			args []string
			want []string
		}{
			{"BadURL", exitUsage, []string{"req", "cli.rr", "x", "--url", "http://x"}, []string{"bad URL", `"http://x"`, "courier://host:port"}},
			{"BadURLPub", exitUsage, []string{"pub", "cli.rr", "k", "x", "--url", "127.0.0.1:7400"}, []string{"bad URL"}},
			{"Refused", exitConnect, []string{"req", "cli.rr", "x", "--url", closed}, []string{"connection refused", closed}},
			{"RefusedExchanges", exitConnect, []string{"exchanges", "--url", closed}, []string{"connection refused"}},
			{"UnknownExchangeReq", exitNotFound, u("req", "nope"), []string{"not found", `exchange "nope"`}},
			{"UnknownExchangePub", exitNotFound, u("pub", "nope", "k", "x"), []string{"not found", `exchange "nope"`}},
			{"UnknownExchangeSub", exitNotFound, u("sub", "nope", "#"), []string{"not found", `exchange "nope"`}},
			{"UnknownExchangeReply", exitNotFound, u("reply", "nope", "x"), []string{"not found", `exchange "nope"`}},
			{"ClashPattern", exitFailure, u("exchanges", "create", "cli.rr", "--pattern", "pubsub"), []string{"clash", `"cli.rr"`, "reqresp", "pubsub"}},
			{"ClashStrategy", exitFailure, u("exchanges", "create", "cli.rr", "--strategy", "leader"), []string{"clash", `"cli.rr"`, "round-robin", "leader"}},
			{"BadStrategy", exitFailure, u("exchanges", "create", "cli.bad", "--strategy", "bogus"), []string{"bad options", "unknown strategy", `"bogus"`}},
			{"BadPattern", exitFailure, u("exchanges", "create", "cli.bad", "--pattern", "bogus"), []string{"bad options", "unknown pattern", `"bogus"`}},
			{"StrategyOnPubSub", exitFailure, u("exchanges", "create", "cli.bad", "--pattern", "pubsub", "--strategy", "round-robin"), []string{"bad options", "round-robin"}},
			{"BadName", exitFailure, u("exchanges", "create", "bad..name"), []string{"bad options", `"bad..name"`}},
			{"ReqAllNoHandler", exitFailure, u("req", "cli.rr", "x", "--all"), []string{"no handler", `"cli.rr"`}},
			{"BadHeader", exitUsage, u("req", "cli.rr", "-H", "novalue"), []string{"bad header", `"novalue"`}},
			{"ReplyWithoutBody", exitUsage, u("reply", "cli.rr"), []string{"--echo"}},
			{"MissingArgs", exitUsage, u("req"), []string{"arg"}},
		} {
			t.Run(tc.name, func(t *testing.T) { cliFails(t, tc.code, tc.args, tc.want...) })
		}
		// Nothing of the above created an exchange.
		for name := range cliExchanges(t, url) {
			if name == "nope" || name == "cli.bad" || name == "bad..name" {
				t.Errorf("a failed command left exchange %q", name)
			}
		}
	})

	// The server survived all of the above, and stops cleanly on an
	// interrupt; clients attached to it are told and exit non-zero.
	if srv.exited() {
		t.Fatalf("the server exited during the tests: %v\nstderr:\n%s", srv.err, srv.stderr.String())
	}
	cliOK(t, u("exchanges", "create", "cli.last", "--pattern", "pubsub")...)
	sub := cliStart(t, "", nil, u("sub", "cli.last", "#")...)
	sub.waitStderr(t, "subscribed to # on cli.last")
	if err := srv.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := srv.wait(t); code != 0 {
		t.Errorf("server exited %d on interrupt\nstderr:\n%s", code, srv.stderr.String())
	}
	if code := sub.wait(t); code != exitConnect || !strings.Contains(sub.stderr.String(), "error: ") || !strings.Contains(sub.stderr.String(), "shutting down") {
		t.Errorf("sub exited %d when the server stopped\nstderr:\n%s", code, sub.stderr.String())
	}
}

// cliMemberID reads the member id a `courier reply` printed on stderr.
func cliMemberID(t *testing.T, p *cliProc) string {
	t.Helper()
	s := p.stderr.String()
	_, id, found := strings.Cut(s, " as ")
	if !found {
		t.Fatalf("no member id in %q", s)
	}
	return strings.TrimSpace(strings.SplitN(id, "\n", 2)[0])
}
