package client_test

import (
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/wire"
)

// TestStarvedReadLoopIsNotSilence: a server whose PINGs wait in the
// client's socket because the client's read loop is behind (held here by
// a hook, as a loop starved of CPU is) is not silent, and the client must
// not drop the connection for the heartbeat. It did: in the 5-node
// fan-out of issue 14 the load generator's subscribers reset their
// connections with the server's frames unread, reconnected, and lost what
// was queued for them and what came meanwhile.
func TestStarvedReadLoopIsNotSilence(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conns := make(chan net.Conn, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		conns <- nc
	}()
	ctx := testutil.Context(t, 60*time.Second)
	dialed := make(chan error, 1)
	var c *courier.Conn
	go func() {
		var err error
		c, err = client.Dial(ctx, "courier://"+ln.Addr().String(), client.Options{NoReconnect: true})
		dialed <- err
	}()
	var nc net.Conn
	select {
	case nc = <-conns:
	case <-ctx.Done():
		t.Fatal("no connection")
	}
	defer nc.Close()
	r := wire.NewReader(nc, 1<<16)
	send := func(f *wire.Frame) {
		t.Helper()
		p, err := wire.AppendFrame(nil, f, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nc.Write(p); err != nil {
			t.Fatalf("write to the client: %v", err)
		}
	}
	var f wire.Frame
	if err := r.Next(&f); err != nil || f.Type != wire.TypeHello {
		t.Fatalf("want HELLO, got %v %v", f.Type, err)
	}
	// 100 ms heartbeats: the client gives up after 300 ms of silence.
	body, _ := json.Marshal(wire.Welcome{Version: wire.Version, Conn: "c1", HeartbeatMS: 100, TimeoutMS: 300, MaxFrame: 1 << 20, Credit: 16})
	send(&wire.Frame{Type: wire.TypeWelcome, Body: body})
	if err := <-dialed; err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	hold := make(chan struct{})
	held := make(chan struct{}, 1)
	client.SetReadHook(func() {
		select {
		case held <- struct{}{}:
		default:
		}
		<-hold
	})
	defer client.SetReadHook(nil)
	released := false
	defer func() {
		if !released {
			close(hold)
		}
	}()
	// The read loop takes this PING, then stops at the hook before the
	// next frame.
	send(&wire.Frame{Type: wire.TypePing, Ref: 1})
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("the read loop did not reach the hook")
	}
	// The server keeps its heartbeat for 2 s, well past the timeout,
	// while the client reads nothing.
	for i := range 40 {
		send(&wire.Frame{Type: wire.TypePing, Ref: uint64(i + 2)})
		time.Sleep(50 * time.Millisecond)
	}
	client.SetReadHook(nil)
	close(hold)
	released = true
	// The client is still there: it answers every PING, the last one
	// included.
	nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		if err := r.Next(&f); err != nil {
			t.Fatalf("the client dropped a connection whose server kept its heartbeat: %v", err)
		}
		if f.Type == wire.TypePong && f.Ref == 41 {
			return
		}
	}
}
