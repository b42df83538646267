package server_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

// Each limit refuses only the operation or connection past it, with its
// own code, and loses nothing already accepted.

func startNodeWith(t *testing.T, set func(*node.Config)) *node.Node {
	t.Helper()
	cfg := node.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	set(&cfg)
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func dial(t *testing.T, n *node.Node, opts client.Options) *courier.Conn {
	t.Helper()
	c, err := client.Dial(testutil.Context(t, 10*time.Second), n.URL(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// echoService attaches an echo handler on its own connection and returns
// a requester's view of the exchange from another.
func echoService(t *testing.T, n *node.Node, name string) *courier.ReqResp {
	t.Helper()
	ctx := testutil.Context(t, 10*time.Second)
	h, err := dial(t, n, client.Options{Name: "echo"}).ReqResp(ctx, name, courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Handle(ctx, func(r *courier.Request) { r.Reply(r.Body()) }); err != nil {
		t.Fatal(err)
	}
	ex, err := dial(t, n, client.Options{Name: "requester"}).ReqResp(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

// stillServes checks that ex answers a request.
func stillServes(t *testing.T, ex *courier.ReqResp) {
	t.Helper()
	r, err := ex.Request(testutil.Context(t, 10*time.Second), courier.Message{Body: []byte("still here")})
	if err != nil || string(r.Body) != "still here" {
		t.Fatalf("a healthy client was hurt: %v %v", r, err)
	}
}

func mustCode(t *testing.T, err error, code wire.Code) {
	t.Helper()
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != code {
		t.Fatalf("error %v, want code %d (%s)", err, code, code)
	}
	if !errors.Is(err, courier.ErrLimit) {
		t.Fatalf("error %v does not match courier.ErrLimit", err)
	}
}

// TestConnectionFlood: a client that opens a thousand connections and
// logs each in, to a node limited to 50, is refused past the limit, each
// refused HELLO told why; a client connected before keeps working, and
// places freed are taken again.
func TestConnectionFlood(t *testing.T) {
	const max, flood = 50, 1000
	n := startNodeWith(t, func(c *node.Config) {
		c.Limits.MaxConns = max
		c.Limits.MaxHandshakes = 2 * flood // only max_connections in play
		c.Limits.MaxHandshakesPerAddr = 2 * flood
		c.Heartbeat = time.Minute // the accepted ones hold their place without answering PINGs
	})
	ex := echoService(t, n, "flood") // two connections
	conns := make([]net.Conn, 0, flood)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	hello := helloFrame(t)
	for range flood {
		c, err := net.Dial("tcp", n.Addr().String())
		if err != nil {
			t.Fatalf("dial %d: %v", len(conns), err)
		}
		if _, err := c.Write(hello); err != nil {
			t.Fatalf("HELLO %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	stillServes(t, ex)
	// The refused ones get a fatal ERROR answering their HELLO; the
	// accepted ones a WELCOME.
	codes := make(chan wire.Code, flood)
	welcomes := make(chan struct{}, flood)
	for _, c := range conns {
		go func() {
			var f wire.Frame
			switch err := wire.NewReader(c, 1<<16).Next(&f); {
			case err != nil:
			case f.Type == wire.TypeWelcome:
				welcomes <- struct{}{}
			case f.Type == wire.TypeError && f.Flags&wire.FlagFatal != 0:
				codes <- wire.Code(f.Aux)
			}
		}()
	}
	for i := range flood - (max - 2) {
		if code := testutil.Recv(t, codes, 20*time.Second); code != wire.CodeTooManyConns {
			t.Fatalf("refusal %d has code %s, want %s", i, code, wire.CodeTooManyConns)
		}
	}
	for range max - 2 {
		testutil.Recv(t, welcomes, 20*time.Second)
	}
	select {
	case code := <-codes:
		t.Fatalf("more connections refused than the limit explains (code %s)", code)
	default:
	}
	stillServes(t, ex)
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	testutil.WaitForf(t, 10*time.Second, canConnect(n, client.Options{}), "no connection accepted once the flood closed")
}

// canConnect returns a condition: a client with opts can connect to n.
func canConnect(n *node.Node, opts client.Options) func() bool {
	return func() bool {
		c, err := client.Dial(context.Background(), n.URL(), opts)
		if err != nil {
			return false
		}
		c.Close()
		return true
	}
}

// TestConnectionsPerUser: the third connection of a user limited to two
// is refused at its HELLO; other users connect, and the user connects
// again once one of its connections closed.
func TestConnectionsPerUser(t *testing.T) {
	n := startNodeWith(t, func(c *node.Config) { c.Limits.MaxConnsPerUser = 2 })
	ctx := testutil.Context(t, 10*time.Second)
	first := dial(t, n, client.Options{User: "greedy"})
	dial(t, n, client.Options{User: "greedy"})
	_, err := client.Dial(ctx, n.URL(), client.Options{User: "greedy"})
	mustCode(t, err, wire.CodeTooManyConns)
	dial(t, n, client.Options{User: "other"})
	dial(t, n, client.Options{}) // no user: not counted
	if _, err := first.Exchanges(ctx); err != nil {
		t.Fatalf("a connection of the user was hurt: %v", err)
	}
	first.Close()
	testutil.WaitForf(t, 10*time.Second, canConnect(n, client.Options{User: "greedy"}), "the user cannot connect after closing a connection")
}

// TestAttachmentLimit: past its attachment limit a connection's ATTACH
// fails; the attachments it has keep serving, and a place freed by a
// detach is taken again.
func TestAttachmentLimit(t *testing.T) {
	n := startNodeWith(t, func(c *node.Config) { c.Limits.MaxAttachments = 2 })
	ctx := testutil.Context(t, 10*time.Second)
	c := dial(t, n, client.Options{})
	ex, err := c.ReqResp(ctx, "att", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	reply := func(r *courier.Request) { r.Reply([]byte("ok")) }
	a1, err := ex.Handle(ctx, reply)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Handle(ctx, reply); err != nil {
		t.Fatal(err)
	}
	_, err = ex.Handle(ctx, reply)
	mustCode(t, err, wire.CodeTooManyAttachments)
	req, err := dial(t, n, client.Options{}).ReqResp(ctx, "att")
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if _, err := req.Request(ctx, courier.Message{}); err != nil {
			t.Fatalf("request to the attachments in place: %v", err)
		}
	}
	if err := a1.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Handle(ctx, reply); err != nil {
		t.Fatalf("attach after a detach: %v", err)
	}
}

// TestInflightLimit: a request past the connection's in-flight limit
// fails at once; those in flight are answered.
func TestInflightLimit(t *testing.T) {
	n := startNodeWith(t, func(c *node.Config) { c.Limits.MaxInflight = 2 })
	ctx := testutil.Context(t, 20*time.Second)
	h, err := dial(t, n, client.Options{}).ReqResp(ctx, "slow", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan *courier.Request, 4)
	if _, err := h.Handle(ctx, func(r *courier.Request) { held <- r }); err != nil {
		t.Fatal(err)
	}
	req, err := dial(t, n, client.Options{}).ReqResp(ctx, "slow")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Go(func() {
			_, err := req.Request(ctx, courier.Message{})
			errs <- err
		})
	}
	first := testutil.Recv(t, held, 10*time.Second)
	second := testutil.Recv(t, held, 10*time.Second)
	_, err = req.Request(ctx, courier.Message{})
	mustCode(t, err, wire.CodeTooManyInflight)
	first.Reply(nil)
	second.Reply(nil)
	wg.Wait()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("a request in flight failed: %v", err)
		}
	}
	go func() {
		if r, ok := <-held; ok {
			r.Reply(nil)
		}
	}()
	if _, err := req.Request(ctx, courier.Message{}); err != nil {
		t.Fatalf("request once the others were answered: %v", err)
	}
}

// TestDeadlineLimit: a request asking for more than the maximum deadline
// fails; one asking for none gets the maximum.
func TestDeadlineLimit(t *testing.T) {
	n := startNodeWith(t, func(c *node.Config) { c.Limits.MaxDeadline = 2 * time.Second })
	ctx := testutil.Context(t, 20*time.Second)
	h, err := dial(t, n, client.Options{}).ReqResp(ctx, "dl", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	deadlines := make(chan bool, 4)
	if _, err := h.Handle(ctx, func(r *courier.Request) {
		_, ok := r.Deadline()
		deadlines <- ok
		r.Reply(nil)
	}); err != nil {
		t.Fatal(err)
	}
	req, err := dial(t, n, client.Options{}).ReqResp(ctx, "dl")
	if err != nil {
		t.Fatal(err)
	}
	long, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	_, err = req.Request(long, courier.Message{})
	mustCode(t, err, wire.CodeDeadlineTooLong)
	if _, err := req.Request(context.Background(), courier.Message{}); err != nil {
		t.Fatal(err)
	}
	if !testutil.Recv(t, deadlines, 10*time.Second) {
		t.Fatal("a request without a deadline reached its handler without the maximum one")
	}
}

// TestFrameLimit: a frame over the configured maximum closes only the
// connection that sent it.
func TestFrameLimit(t *testing.T) {
	n := startNodeWith(t, func(c *node.Config) { c.Limits.MaxFrame = 1024 })
	ex := echoService(t, n, "frames")
	c := dialRaw(t, n)
	if w := c.hello(); w.MaxFrame != 1024 {
		t.Fatalf("WELCOME says max_frame %d, want 1024", w.MaxFrame)
	}
	c.send(&wire.Frame{Type: wire.TypePublish, Name: "frames", Body: make([]byte, 2000)})
	c.expectFatal(wire.CodeFrameTooLarge)
	stillServes(t, ex)
	// The Go client refuses to send it at all.
	_, err := ex.Request(testutil.Context(t, 10*time.Second), courier.Message{Body: make([]byte, 2000)})
	if !errors.Is(err, wire.ErrFrameTooLarge) {
		t.Fatalf("oversized request: %v, want a frame-too-large error", err)
	}
	stillServes(t, ex)
}

// TestPartialFrameThenSilence: a client that sends part of a frame and
// then nothing, keeping its socket open, is cut off by the heartbeat
// timeout (after its HELLO) or the handshake timeout (before it).
func TestPartialFrameThenSilence(t *testing.T) {
	// The raw client asks for 100 ms; the echo service lives by the
	// server's second (a loaded machine cut it when it shared 100 ms).
	const hb = 100 * time.Millisecond
	n := startNodeWith(t, func(c *node.Config) {
		c.Limits.HandshakeTimeout = 300 * time.Millisecond
	})
	ex := echoService(t, n, "partial")

	c := dialRaw(t, n)
	c.helloAsking(hb)
	c.write([]byte{0, 0, 0, 100, byte(wire.TypeRequest), 0})
	c.expectFatal(wire.CodeHeartbeat)
	stillServes(t, ex)

	c = dialRaw(t, n)
	c.write([]byte{0, 0, 0, 100, byte(wire.TypeHello)})
	c.expectFatal(wire.CodeProtocol)
	stillServes(t, ex)
}
