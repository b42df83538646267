package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/wire"
)

// cliAccepting waits until the server srv accepts connections on addr,
// and fails the test if it exits first.
func cliAccepting(t *testing.T, srv *cliProc, addr string) {
	t.Helper()
	testutil.Eventually(cliWait, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil || srv.exited()
	})
	if srv.exited() {
		t.Fatalf("server exited: %v\nstderr:\n%s", srv.err, srv.stderr.String())
	}
}

// TestServerSIGTERM runs `courier server` from a configuration file and
// sends it SIGTERM while a request is in flight: the server tells its
// clients (new requests fail with its reason), lets the request be
// answered, and exits 0.
func TestServerSIGTERM(t *testing.T) {
	addr := "127.0.0.1:" + cliFreePort(t)
	path := filepath.Join(t.TempDir(), "courier.toml")
	conf := fmt.Sprintf("listen = %q\nhttp = \"off\"\ndrain_timeout = \"15s\"\n\n[limits]\nmax_connections = 10\n", addr)
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := cliStart(t, "", nil, "server", "--config", path, "--data", t.TempDir(), "--log-level", "info")
	cliAccepting(t, srv, addr)
	url := "courier://" + addr
	ctx := testutil.Context(t, 2*cliWait)
	dial := func() *courier.Conn {
		// Without reconnecting, the clients end with the server's
		// reason; TestRestartSIGKILL has them reconnect.
		c, err := client.Dial(ctx, url, client.Options{NoReconnect: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	h, err := dial().ReqResp(ctx, "drain", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan *courier.Request, 1)
	if _, err := h.Handle(ctx, func(r *courier.Request) { held <- r }); err != nil {
		t.Fatal(err)
	}
	rc := dial()
	req, err := rc.ReqResp(ctx, "drain")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.ReqResp(ctx, "probe", courier.RoundRobin); err != nil {
		t.Fatal(err)
	}
	type result struct {
		body string
		err  error
	}
	answered := make(chan result, 1)
	go func() {
		r, err := req.Request(ctx, courier.Message{Body: []byte("x")})
		if err != nil {
			answered <- result{err: err}
			return
		}
		answered <- result{body: string(r.Body)}
	}()
	r := testutil.Recv(t, held, cliWait)

	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Probes go to an exchange without handlers: until the client
	// learns of the shutdown they fail at once with "no handler".
	probe, err := rc.ReqResp(ctx, "probe")
	if err != nil {
		t.Fatal(err)
	}
	shutdown := &wire.Error{Code: wire.CodeShutdown}
	if !testutil.Eventually(cliWait, func() bool {
		_, err := probe.Request(ctx, courier.Message{})
		return errors.Is(err, shutdown)
	}) {
		t.Fatalf("new requests not refused after SIGTERM\nstderr:\n%s", srv.stderr.String())
	}
	if srv.exited() {
		t.Fatalf("the server exited with a request in flight\nstderr:\n%s", srv.stderr.String())
	}
	r.Reply([]byte("answered"))
	if res := testutil.Recv(t, answered, cliWait); res.err != nil || res.body != "answered" {
		t.Fatalf("the request in flight: %q, %v; want its answer\nstderr:\n%s", res.body, res.err, srv.stderr.String())
	}
	if code := srv.wait(t); code != 0 {
		t.Fatalf("server exited %d after SIGTERM\nstderr:\n%s", code, srv.stderr.String())
	}
	if s := srv.stderr.String(); !strings.Contains(s, "draining") || !strings.Contains(s, "shut down") {
		t.Errorf("the server's log does not tell the drain:\n%s", s)
	}
	select {
	case <-rc.Done():
	case <-time.After(cliWait):
		t.Fatal("the client is still open after the server exited")
	}
	if err := rc.Err(); !errors.Is(err, shutdown) {
		t.Errorf("the client ended with %v, want the server's shutdown reason", err)
	}
}
