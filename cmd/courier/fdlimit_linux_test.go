//go:build linux

package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
)

// TestHTTPSlowlorisKeepsClientListener runs `courier server` with its
// file descriptor limit at 400 (ulimit -n in a shell that then execs it)
// and holds 420 slow HTTP connections open on the management listener:
// the server fits its caps to the limit at start (and says so), the
// extra HTTP connections wait in the kernel's backlog, and a client still
// connects and logs in, with no "too many open files" on the way.
func TestHTTPSlowlorisKeepsClientListener(t *testing.T) {
	const limit, slow = 400, 420
	addr, httpAddr := "127.0.0.1:"+cliFreePort(t), "127.0.0.1:"+cliFreePort(t)
	args := []string{"server", "--listen", addr, "--http", httpAddr, "--data", t.TempDir()}
	p := &cliProc{args: args, done: make(chan struct{})}
	p.cmd = exec.Command("sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, limit), cliBin}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.Env = cliEnv("COURIER_ADMIN_USER=admin", "COURIER_ADMIN_PASSWORD=adminpw")
	if cliSysProcAttr != nil {
		p.cmd.SysProcAttr = cliSysProcAttr()
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	cliAccepting(t, p, httpAddr)
	p.waitStderr(t, "courier server started")
	if !strings.Contains(p.stderr.String(), "file descriptor limit too low") {
		t.Errorf("the server did not say it fitted its caps to %d descriptors:\n%s", limit, p.stderr.String())
	}

	for i := range slow {
		c, err := net.DialTimeout("tcp", httpAddr, 5*time.Second)
		if err != nil {
			t.Fatalf("slow connection %d: %v", i, err)
		}
		defer c.Close()
		fmt.Fprint(c, "GET /api/overview HTTP/1.1\r\nHost: x\r\n") // never the end of the header
	}
	// Let the server take what it will of them, until it is near its
	// limit or its count of descriptors stops moving: not needed for the
	// fix to pass, but without it the code before the fix could pass by
	// luck, its client connection beating the HTTP accepts.
	fds := func() int {
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid))
		return len(ents)
	}
	last, still := -1, 0
	testutil.Eventually(5*time.Second, func() bool {
		n := fds()
		if n == last {
			still++
		} else {
			last, still = n, 0
		}
		return n >= limit-8 || still >= 100
	})

	ctx := testutil.Context(t, 10*time.Second)
	c, err := client.Dial(ctx, "courier://"+addr, client.Options{User: "admin", Password: "adminpw"})
	if err != nil {
		t.Fatalf("a client could not log in while slow HTTP connections are held: %v\nstderr:\n%s", err, p.stderr.String())
	}
	defer c.Close()
	if _, err := c.Exchanges(ctx); err != nil {
		t.Fatal(err)
	}
	if n := fds(); n >= limit {
		t.Errorf("the server holds %d descriptors, its limit is %d", n, limit)
	}
	if strings.Contains(p.stderr.String(), "too many open files") {
		t.Errorf("the server ran out of descriptors:\n%s", p.stderr.String())
	}
}
