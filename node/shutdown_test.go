package node_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

const wait = 15 * time.Second

func startNetNode(t *testing.T, set func(*node.Config)) *node.Node {
	t.Helper()
	cfg := node.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if set != nil {
		set(&cfg)
	}
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func dialNode(t *testing.T, n *node.Node) *courier.Conn {
	t.Helper()
	// Without reconnecting: these tests watch the client end with the
	// server's reason (client/reconnect_test.go has it come back).
	c, err := client.Dial(testutil.Context(t, wait), n.URL(), client.Options{NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var errShutdown = &wire.Error{Code: wire.CodeShutdown}

// heldService attaches, on a network connection, a handler that hands
// every request to the returned channel without answering it.
func heldService(t *testing.T, n *node.Node, name string) <-chan *courier.Request {
	t.Helper()
	ctx := testutil.Context(t, wait)
	h, err := dialNode(t, n).ReqResp(ctx, name, courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan *courier.Request, 16)
	if _, err := h.Handle(ctx, func(r *courier.Request) { held <- r }); err != nil {
		t.Fatal(err)
	}
	return held
}

// TestShutdownDrains: Shutdown tells clients the node is going, refuses
// new requests, lets the one in flight be answered, then closes; the
// clients end with the reason.
func TestShutdownDrains(t *testing.T) {
	n := startNetNode(t, func(c *node.Config) { c.DrainTimeout = wait })
	ctx := testutil.Context(t, 2*wait)
	held := heldService(t, n, "held")
	rc := dialNode(t, n)
	req, err := rc.ReqResp(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	// Probes go to an exchange without handlers: until the client
	// learns of the shutdown they fail at once with "no handler".
	probe, err := rc.ReqResp(ctx, "probe", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		r   *courier.Response
		err error
	}
	answered := make(chan result, 1)
	go func() {
		r, err := req.Request(ctx, courier.Message{Body: []byte("in flight")})
		answered <- result{r, err}
	}()
	r := testutil.Recv(t, held, wait)

	shut := make(chan error, 1)
	go func() { shut <- n.Shutdown(context.Background()) }()
	// The requester's client learns of the drain: its new requests fail
	// at once with the server's reason.
	testutil.WaitForf(t, wait, func() bool {
		_, err := probe.Request(ctx, courier.Message{})
		return errors.Is(err, errShutdown)
	}, "new requests were not refused during the drain")
	// The broker refuses them too, from any connection.
	ex, err := n.Connect().ReqResp(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Request(ctx, courier.Message{}); !errors.Is(err, errShutdown) {
		t.Fatalf("embedded request during the drain: %v, want code %d", err, wire.CodeShutdown)
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned with a request in flight: %v", err)
	default:
	}

	r.Reply([]byte("answered"))
	res := testutil.Recv(t, answered, wait)
	if res.err != nil || string(res.r.Body) != "answered" {
		t.Fatalf("the request in flight: %v %v, want its answer", res.r, res.err)
	}
	if err := testutil.Recv(t, shut, wait); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	select {
	case <-rc.Done():
	case <-time.After(wait):
		t.Fatal("the client is still open after Shutdown")
	}
	if err := rc.Err(); !errors.Is(err, courier.ErrClosed) || !errors.Is(err, errShutdown) || !strings.Contains(err.Error(), "shutting down") {
		t.Fatalf("the client ended with %v, want the server's shutdown reason", err)
	}
}

// TestShutdownDrainTimeout: a request still unanswered when the drain
// time ends does not hold the node up.
func TestShutdownDrainTimeout(t *testing.T) {
	n := startNetNode(t, func(c *node.Config) { c.DrainTimeout = 100 * time.Millisecond })
	ctx := testutil.Context(t, 2*wait)
	held := heldService(t, n, "stuck")
	req, err := dialNode(t, n).ReqResp(ctx, "stuck")
	if err != nil {
		t.Fatal(err)
	}
	failed := make(chan error, 1)
	go func() {
		_, err := req.Request(ctx, courier.Message{})
		failed <- err
	}()
	testutil.Recv(t, held, wait)
	if err := n.Shutdown(context.Background()); err == nil || !strings.Contains(err.Error(), "in flight") {
		t.Fatalf("Shutdown: %v, want an error about the request in flight", err)
	}
	// Both connections close: whichever goes first decides what the
	// requester hears, its own connection closed or the handler's
	// (code 11, sent before its connection's last write). Either way it
	// is not left waiting.
	if err := testutil.Recv(t, failed, wait); !errors.Is(err, courier.ErrClosed) && !errors.Is(err, &wire.Error{Code: wire.CodeHandlerGone}) {
		t.Fatalf("the unanswered request: %v, want closed or handler gone", err)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestListenerRestarts: the client listener breaking (its socket closed
// under it) is restarted on the same address while connections already
// open go on; past the restart intensity it is marked failed and, being
// critical, reported on Failed, and the API and metrics say so.
func TestListenerRestarts(t *testing.T) {
	n := startNetNode(t, func(c *node.Config) {
		c.Supervision = node.Supervision{MaxRestarts: 2, RestartWindow: time.Hour}
	})
	ctx := testutil.Context(t, 2*wait)
	old := dialNode(t, n)
	breakIt := func() {
		t.Helper()
		ln := n.ClientListener()
		ln.Close()
		testutil.WaitForf(t, wait, func() bool { return n.ClientListener() != ln }, "the listener was not restarted")
	}
	for i := range 2 {
		breakIt()
		dialNode(t, n) // new connections are accepted again
		if _, err := old.Exchanges(ctx); err != nil {
			t.Fatalf("after restart %d an open connection failed: %v", i+1, err)
		}
	}
	if o := get(t, n.HTTPURL()+"/api/overview?columns=components"); !strings.Contains(o, `{"name":"listener","state":"running","critical":true,"restarts":2,`) {
		t.Fatalf("overview after two restarts: %s", o)
	}
	n.ClientListener().Close()
	err := testutil.Recv(t, n.Failed(), wait)
	if !strings.Contains(err.Error(), "listener") {
		t.Fatalf("failure %q does not name the listener", err)
	}
	if _, err := old.Exchanges(ctx); err != nil {
		t.Fatalf("with the listener failed, an open connection failed: %v", err)
	}
	if o := get(t, n.HTTPURL()+"/api/nodes?columns=components"); !strings.Contains(o, `{"name":"listener","state":"failed","critical":true,"restarts":2,`) ||
		!strings.Contains(o, `{"name":"sweeper","state":"running"`) {
		t.Fatalf("nodes after the failure: %s", o)
	}
	m := get(t, n.HTTPURL()+"/metrics")
	for _, want := range []string{`courier_component_failed{component="listener"} 1`, `courier_component_up{component="sweeper"} 1`,
		`courier_component_restarts_total{component="listener"} 2`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
