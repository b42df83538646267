package server_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

func startNode(t *testing.T, hb time.Duration) *node.Node {
	t.Helper()
	n, err := node.Start(node.Config{
		DataDir: t.TempDir(), Listen: "127.0.0.1:0", Heartbeat: hb,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// raw is a hand-driven protocol client.
type raw struct {
	t  *testing.T
	nc net.Conn
	r  *wire.Reader
}

func dialRaw(t *testing.T, n *node.Node) *raw {
	t.Helper()
	nc, err := net.Dial("tcp", n.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &raw{t: t, nc: nc, r: wire.NewReader(nc, 1<<20)}
}

func (c *raw) send(f *wire.Frame) {
	c.t.Helper()
	p, err := wire.AppendFrame(nil, f, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	c.write(p)
}

func (c *raw) write(p []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(p); err != nil {
		c.t.Fatal(err)
	}
}

// next reads frames, skipping PINGs, until one arrives or the connection
// ends (nil).
func (c *raw) next() *wire.Frame {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		var f wire.Frame
		if err := c.r.Next(&f); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				c.t.Fatal("no frame within 10s")
			}
			return nil
		}
		if f.Type != wire.TypePing {
			return &f
		}
	}
}

func (c *raw) hello() wire.Welcome {
	c.t.Helper()
	return c.helloAsking(0)
}

// helloAsking is hello asking for the heartbeat interval hb (0: the
// server's). A test of silence asks a short one for its raw client, so
// that the server's own, which its healthy clients live by, can stay
// long enough for a loaded machine.
func (c *raw) helloAsking(hb time.Duration) wire.Welcome {
	c.t.Helper()
	body, _ := json.Marshal(wire.Hello{Versions: []int{wire.Version}, Name: "raw", HeartbeatMS: int(hb / time.Millisecond)})
	c.send(&wire.Frame{Type: wire.TypeHello, Body: body})
	f := c.next()
	if f == nil || f.Type != wire.TypeWelcome {
		c.t.Fatalf("want WELCOME, got %+v", f)
	}
	var w wire.Welcome
	if err := json.Unmarshal(f.Body, &w); err != nil {
		c.t.Fatal(err)
	}
	return w
}

// expectFatal reads until a fatal ERROR with code, then the end.
func (c *raw) expectFatal(code wire.Code) {
	c.t.Helper()
	f := c.next()
	if f == nil || f.Type != wire.TypeError || f.Flags&wire.FlagFatal == 0 || wire.Code(f.Aux) != code {
		c.t.Fatalf("want fatal ERROR %s, got %+v", code, f)
	}
	if f.Tag == "" {
		c.t.Fatal("fatal error without a message")
	}
	if g := c.next(); g != nil {
		c.t.Fatalf("connection not closed after fatal error: %+v", g)
	}
}

func TestHandshake(t *testing.T) {
	n := startNode(t, 0)
	w := dialRaw(t, n).hello()
	if w.Version != wire.Version || w.Conn == "" || w.MaxFrame != wire.DefaultMaxFrame || w.Credit == 0 {
		t.Fatalf("bad welcome %+v", w)
	}
	if w.HeartbeatMS != 1000 || w.TimeoutMS != 3000 {
		t.Fatalf("default heartbeat %d ms, timeout %d ms; want 1000, 3000", w.HeartbeatMS, w.TimeoutMS)
	}

	c := dialRaw(t, n)
	body, _ := json.Marshal(wire.Hello{Versions: []int{99}})
	c.send(&wire.Frame{Type: wire.TypeHello, Body: body})
	c.expectFatal(wire.CodeVersion)

	c = dialRaw(t, n)
	c.send(&wire.Frame{Type: wire.TypeList, Ref: 1})
	c.expectFatal(wire.CodeProtocol)
}

// TestBadInput sends each kind of bad input on its own connection while a
// healthy client works; only the offender is cut off, after an ERROR
// frame that says why.
func TestBadInput(t *testing.T) {
	n := startNode(t, 0)
	ctx := context.Background()
	good, err := client.Dial(ctx, n.URL(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	echo, err := good.ReqResp(ctx, "echo", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := echo.Handle(ctx, func(r *courier.Request) { r.Reply(r.Body()) }); err != nil {
		t.Fatal(err)
	}
	check := func() {
		t.Helper()
		r, err := echo.Request(ctx, courier.Message{Body: []byte("still here")})
		if err != nil || string(r.Body) != "still here" {
			t.Fatalf("healthy client hurt: %v %v", r, err)
		}
	}
	frame := func(typ byte, body ...byte) []byte {
		p := binary.BigEndian.AppendUint32(nil, uint32(3+len(body)))
		return append(append(p, typ, 0, 0), body...)
	}
	cases := []struct {
		name string
		send []byte
		code wire.Code
	}{
		{"garbage", bytes.Repeat([]byte{0xff}, 64), wire.CodeFrameTooLarge},
		{"unknown type", frame(0x7f), wire.CodeProtocol},
		{"huge length", binary.BigEndian.AppendUint32(nil, 1<<31), wire.CodeFrameTooLarge},
		{"truncated field", append(binary.BigEndian.AppendUint32(nil, 4), byte(wire.TypeRequest), 0, 0x08, 0x05), wire.CodeProtocol},
		{"server frame type", frame(byte(wire.TypeWelcome)), wire.CodeProtocol},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, n)
			c.hello()
			c.write(tc.send)
			c.expectFatal(tc.code)
			check()
		})
	}
	t.Run("partial frame then close", func(t *testing.T) {
		c := dialRaw(t, n)
		c.hello()
		c.write([]byte{0, 0, 0, 100, byte(wire.TypeRequest)})
		c.nc.Close()
		check()
	})
}

// TestHalfOpen: a member whose connection goes silent (no reads, no
// writes, socket left open) is found by heartbeats and the group gets a
// new leader.
func TestHalfOpen(t *testing.T) {
	// The silent member asks for 100 ms; the healthy one lives by the
	// server's second (it shared 50 ms once, and a loaded machine cut it
	// too).
	const hb = 100 * time.Millisecond
	n := startNode(t, time.Second)
	ctx := context.Background()

	rawLeader(t, n, "jobs", hb)
	// From here on the raw client neither reads nor writes.

	other, err := client.Dial(ctx, n.URL(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	jobs, err := other.ReqResp(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan courier.Event, 16)
	att, err := jobs.Handle(ctx, func(r *courier.Request) { r.Reply(nil) }, courier.OnEvent(func(e courier.Event) { events <- e }))
	if err != nil {
		t.Fatal(err)
	}
	if att.IsLeader() {
		t.Fatal("second member leads while the first is alive")
	}
	deadline := time.After(10 * time.Second)
	for !att.IsLeader() {
		select {
		case <-events:
		case <-deadline:
			t.Fatal("no new leader after the silent member's heartbeat timeout")
		}
	}
	testutil.WaitFor(t, 5*time.Second, func() bool {
		infos, err := other.Exchanges(ctx)
		return err == nil && len(infos) == 1 && len(infos[0].Members) == 1
	})
}

// TestClientSeesDeadServer: a client whose server stops answering (a
// listener that accepts, welcomes, then goes silent) ends with a
// heartbeat error.
func TestClientSeesDeadServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		var f wire.Frame
		wire.NewReader(nc, 1<<16).Next(&f)
		body, _ := json.Marshal(wire.Welcome{Version: 1, Conn: "c1", HeartbeatMS: 50, TimeoutMS: 150, MaxFrame: 1 << 20, Credit: 10})
		p, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeWelcome, Body: body}, 0)
		nc.Write(p)
		io.Copy(io.Discard, nc) // read, never answer
	}()
	// A reconnecting client is told, and goes on reconnecting.
	events := make(chan courier.ConnEvent, 8)
	conn, err := client.Dial(context.Background(), "courier://"+ln.Addr().String(), client.Options{
		OnConnEvent: func(ev courier.ConnEvent) { events <- ev },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	select {
	case ev := <-events:
		var we *wire.Error
		if ev.Kind != courier.ConnDisconnected || !errors.Is(ev.Err, courier.ErrConnectionLost) || !errors.As(ev.Err, &we) || we.Code != wire.CodeHeartbeat {
			t.Fatalf("want disconnected with a heartbeat error, got %v %v", ev.Kind, ev.Err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("client did not notice a silent server")
	}
}

// TestClientSeesDeadServerNoReconnect: without reconnecting, the Conn
// ends with the heartbeat error.
func TestClientSeesDeadServerNoReconnect(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		var f wire.Frame
		wire.NewReader(nc, 1<<16).Next(&f)
		body, _ := json.Marshal(wire.Welcome{Version: 1, Conn: "c1", HeartbeatMS: 50, TimeoutMS: 150, MaxFrame: 1 << 20, Credit: 10})
		p, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeWelcome, Body: body}, 0)
		nc.Write(p)
		io.Copy(io.Discard, nc) // read, never answer
	}()
	conn, err := client.Dial(context.Background(), "courier://"+ln.Addr().String(), client.Options{NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-conn.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("client did not notice a silent server")
	}
	var we *wire.Error
	if !errors.As(conn.Err(), &we) || we.Code != wire.CodeHeartbeat {
		t.Fatalf("want heartbeat error, got %v", conn.Err())
	}
}

// TestClientWaitsForCredit: a client out of credit holds its PUBLISH
// frames until a CREDIT frame arrives, and the server sees no more frames
// than it granted.
func TestClientWaitsForCredit(t *testing.T) {
	publishes := make(chan int, 16)
	grant := make(chan struct{})
	n := 0
	url := fakeServer(t, 2, func(nc net.Conn, f *wire.Frame) {
		if f.Type != wire.TypePublish {
			return
		}
		n++
		publishes <- n
		if n == 2 {
			<-grant
			p, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeCredit, Aux: 5}, 0)
			nc.Write(p)
		}
	})
	conn, err := client.Dial(context.Background(), url, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ps, err := conn.PubSub(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	sent := make(chan int, 3)
	go func() {
		for i := 1; i <= 3; i++ {
			ps.Publish(context.Background(), "k", []byte("m"))
			sent <- i
		}
	}()
	for want := 1; want <= 2; want++ {
		if got := <-publishes; got != want {
			t.Fatalf("publish %d arrived as %d", want, got)
		}
	}
	<-sent
	<-sent
	select {
	case n := <-publishes:
		t.Fatalf("publish %d went out without credit", n)
	case <-sent:
		// Send returned for the third: it must not have been written yet.
		select {
		case n := <-publishes:
			t.Fatalf("publish %d went out without credit", n)
		default:
		}
		t.Fatal("third publish returned without credit")
	default:
	}
	close(grant)
	if got := <-publishes; got != 3 {
		t.Fatalf("third publish arrived as %d", got)
	}
}

// TestDeadlineEnforced: a requester that never cancels still gets a
// timeout when its request's deadline passes, and the handler is told.
func TestDeadlineEnforced(t *testing.T) {
	n := startNode(t, 0)
	ctx := context.Background()
	h, err := client.Dial(ctx, n.URL(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	slow, err := h.ReqResp(ctx, "slow", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	cancelled := make(chan struct{})
	if _, err := slow.Handle(ctx, func(r *courier.Request) {
		go func() {
			// The deadline alone ends r.Context(); Cancelled proves the
			// broker's CANCEL arrived.
			for !r.Cancelled() {
				time.Sleep(time.Millisecond)
			}
			close(cancelled)
		}()
	}); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, n)
	c.hello()
	c.send(&wire.Frame{Type: wire.TypeRequest, Ref: 7, Name: "slow", Aux: 100})
	f := c.next()
	if f == nil || f.Type != wire.TypeResponse || f.Ref != 7 || f.Flags&wire.FlagError == 0 ||
		f.Flags&wire.FlagLast == 0 || wire.Code(f.Aux) != wire.CodeTimeout {
		t.Fatalf("want a timeout response to request 7, got %+v", f)
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler was not told the request expired")
	}
}

// TestPublishGivesUpWithContext: a publisher waiting for credit that never
// comes stops when its context ends, and the message is not sent.
func TestPublishGivesUpWithContext(t *testing.T) {
	publishes := make(chan struct{}, 16)
	url := fakeServer(t, 1, func(nc net.Conn, f *wire.Frame) {
		if f.Type == wire.TypePublish {
			publishes <- struct{}{}
		}
	})
	conn, err := client.Dial(context.Background(), url, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ps, err := conn.PubSub(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	if err := ps.Publish(context.Background(), "k", []byte("1")); err != nil {
		t.Fatal(err)
	}
	<-publishes
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := ps.Publish(ctx, "k", []byte("2")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("publish without credit: %v, want a deadline error", err)
	}
	if conn.Err() != nil {
		t.Fatalf("the connection ended: %v", conn.Err())
	}
	select {
	case <-publishes:
		t.Fatal("a publish that gave up was sent")
	default:
	}
}

// fakeServer accepts one client on loopback, welcomes it with credit,
// answers DECLARE with OK, and hands every other frame to onFrame, which
// may write to nc. It returns the server's URL.
func fakeServer(t *testing.T, credit uint64, onFrame func(nc net.Conn, f *wire.Frame)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		r := wire.NewReader(nc, 1<<16)
		var f wire.Frame
		r.Next(&f)
		body, _ := json.Marshal(wire.Welcome{Version: 1, Conn: "c1", HeartbeatMS: 1000, TimeoutMS: 3000, MaxFrame: 1 << 20, Credit: credit})
		p, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeWelcome, Body: body}, 0)
		nc.Write(p)
		for r.Next(&f) == nil {
			if f.Type == wire.TypeDeclare {
				info, _ := json.Marshal(wire.ExchangeInfo{Name: f.Name, Pattern: wire.PatternPubSub})
				p, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeOK, Ref: f.Ref, Body: info}, 0)
				nc.Write(p)
				continue
			}
			onFrame(nc, &f)
		}
	}()
	return "courier://" + ln.Addr().String()
}
