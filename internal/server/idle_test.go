package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"weak"

	"github.com/coder/websocket"

	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/server"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

// goroutines returns the stacks of the process's goroutines.
func goroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// count returns how many of stacks hold every one of parts.
func count(stacks []string, parts ...string) int {
	n := 0
	for _, s := range stacks {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(s, p)
		}
		if all {
			n++
		}
	}
	return n
}

// TestIdleConnHoldsOneGoroutine: an idle connection, over TCP or over
// WebSocket, holds one goroutine, which waits for the socket to become
// readable outside the read loop (park.go): no goroutine of an idle
// connection waits in a read. The write loop runs only while there is
// something to write, and a WebSocket connection is served apart from
// the HTTP handler that upgraded it, so that net/http's state for the
// request is let go.
func TestIdleConnHoldsOneGoroutine(t *testing.T) {
	const conns = 8
	// The raw clients send no PINGs: a long heartbeat keeps them.
	n := startWSNode(t, func(c *node.Config) { c.Heartbeat = time.Minute })
	for range conns {
		c := dialRaw(t, n)
		c.hello()
		w := mustDialWS(t, n)
		w.welcome()
	}
	// A write loop that ended starts again for the next frame.
	c := dialRaw(t, n)
	c.hello()
	for i := range 3 {
		c.send(&wire.Frame{Type: wire.TypePing, Ref: uint64(i)})
		if f := c.next(); f == nil || f.Type != wire.TypePong || f.Ref != uint64(i) {
			t.Fatalf("want PONG %d, got %+v", i, f)
		}
		waitNoWriters(t)
	}
	const total = 2*conns + 1
	deadline := time.Now().Add(30 * time.Second)
	for {
		stacks := goroutines()
		waiters := count(stacks, "server.(*conn).await")
		readers := count(stacks, "server.(*conn).readLoop")
		writers := count(stacks, "server.(*conn).writeLoop")
		inHandler := count(stacks, "server.(*conn)", "net/http.(*conn).serve")
		if waiters == total && readers == 0 && writers == 0 && inHandler == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d idle connections hold %d waiters, %d read loops, %d write loops and %d goroutines in an HTTP handler; want %d, 0, 0 and 0",
				total, waiters, readers, writers, inHandler, total)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitNoWriters waits until no connection runs a write loop.
func waitNoWriters(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for count(goroutines(), "server.(*conn).writeLoop") > 0 {
		if time.Now().After(deadline) {
			t.Fatal("a write loop still runs on an idle connection")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWebSocketFrameBehindUpgrade: a frame sent in the same packet as
// the upgrade request (read by net/http along with it) is not lost when
// the connection moves to the WebSocket's own reader.
func TestWebSocketFrameBehindUpgrade(t *testing.T) {
	n := startWSNode(t, nil)
	nc, err := net.Dial("tcp", n.HTTPAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	body, _ := json.Marshal(wire.Hello{Versions: []int{wire.Version}, Name: "pipelined"})
	hello, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeHello, Body: body}, 0)
	req := "GET /ws HTTP/1.1\r\nHost: " + n.HTTPAddr().String() + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
	nc.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := nc.Write(append([]byte(req), maskedBinary(hello)...)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade answered %s", resp.Status)
	}
	// The server's first message: one frame, WELCOME.
	var head [2]byte
	if _, err := io.ReadFull(br, head[:]); err != nil {
		t.Fatal(err)
	}
	size := int(head[1] & 0x7f)
	if size == 126 {
		var ext [2]byte
		io.ReadFull(br, ext[:])
		size = int(binary.BigEndian.Uint16(ext[:]))
	}
	p := make([]byte, size)
	if _, err := io.ReadFull(br, p); err != nil {
		t.Fatal(err)
	}
	var f wire.Frame
	if err := wire.Decode(p[4:], &f); err != nil || f.Type != wire.TypeWelcome {
		t.Fatalf("want WELCOME for the HELLO sent behind the upgrade, got %+v (%v)", f, err)
	}
}

// maskedBinary returns p as one masked binary WebSocket message, as a
// client sends it.
func maskedBinary(p []byte) []byte {
	key := [4]byte{1, 2, 3, 4}
	out := []byte{0x82}
	switch {
	case len(p) < 126:
		out = append(out, 0x80|byte(len(p)))
	default:
		out = append(out, 0x80|126, byte(len(p)>>8), byte(len(p)))
	}
	out = append(out, key[:]...)
	for i, b := range p {
		out = append(out, b^key[i%4])
	}
	return out
}

// TestWebSocketPingFloodKeepsReadLoop: a client that floods WebSocket
// pings and reads nothing does not hold the server's read loop in a
// pong write (the library's, which would wait 5 s and then close the
// connection): pongs are skipped once the socket's send queue holds
// more than a little, and the client's next frame, a DECLARE sent after
// 100,000 pings, is still served.
func TestWebSocketPingFloodKeepsReadLoop(t *testing.T) {
	n := startWSNode(t, func(c *node.Config) { c.Heartbeat = time.Minute })
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		// A small receive buffer: the server's pongs back up at once.
		rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return nil
	}}
	nc, err := d.Dial("tcp", n.HTTPAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	req := "GET /ws HTTP/1.1\r\nHost: " + n.HTTPAddr().String() + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
	nc.SetDeadline(time.Now().Add(2 * time.Minute))
	if _, err := nc.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	body, _ := json.Marshal(wire.Hello{Versions: []int{wire.Version}, Name: "ping-flood"})
	hello, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeHello, Body: body}, 0)
	if _, err := nc.Write(maskedBinary(hello)); err != nil {
		t.Fatal(err)
	}
	// 100,000 pings of 125 bytes (13 MB), a thousand to a write, and
	// nothing read meanwhile.
	ping := []byte{0x89, 0x80 | 125, 1, 2, 3, 4}
	ping = append(ping, make([]byte, 125)...)
	burst := bytes.Repeat(ping, 1000)
	for i := range 100 {
		if _, err := nc.Write(burst); err != nil {
			t.Fatalf("after %d pings the server stopped reading: %v", i*1000, err)
		}
	}
	cfg, _ := json.Marshal(wire.ExchangeConfig{Pattern: "pubsub"})
	declare, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeDeclare, Ref: 1, Name: "after.flood", Body: cfg}, 0)
	if _, err := nc.Write(maskedBinary(declare)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForf(t, 60*time.Second, func() bool {
		resp, err := http.Get(n.HTTPURL() + "/api/exchanges/after.flood")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "the DECLARE sent after the ping flood to be served")
}

// TestWebSocketPingAnswered: a client that reads gets its pings
// answered.
func TestWebSocketPingAnswered(t *testing.T) {
	n := startWSNode(t, func(c *node.Config) { c.Heartbeat = time.Minute })
	c := mustDialWS(t, n)
	c.welcome()
	ctx := c.ws.CloseRead(context.Background())
	for range 3 {
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := c.ws.Ping(pctx)
		cancel()
		if err != nil {
			t.Fatalf("ping not answered: %v", err)
		}
	}
}

// markedWriter is a ResponseWriter that holds a marker, to tell whether
// the writer outlives the upgrade.
type markedWriter struct {
	http.ResponseWriter
	marker *[64]byte
}

func (m *markedWriter) Unwrap() http.ResponseWriter { return m.ResponseWriter }

// TestWebSocketLetsGoOfHTTPState: once a WebSocket is upgraded and its
// handler returned, nothing holds the request's ResponseWriter (and
// with it net/http's buffers, the request and its headers, about 10 KB
// a connection), though the connection stays open and served.
func TestWebSocketLetsGoOfHTTPState(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	b := broker.New(broker.Config{Log: log})
	defer b.Close()
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", Log: log, Heartbeat: time.Minute}, b)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())
	var mu sync.Mutex
	var marks []weak.Pointer[[64]byte]
	ws := srv.WebSocketHandler(nil)
	pages := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m := &markedWriter{ResponseWriter: w, marker: new([64]byte)}
		mu.Lock()
		marks = append(marks, weak.Make(m.marker))
		mu.Unlock()
		ws.ServeHTTP(m, r)
	}))
	defer pages.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const conns = 4
	for range conns {
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(pages.URL, "http")+"/ws", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		w := &wsRaw{t: t, ws: c}
		w.welcome()
		// A ping answered: the connection is served and reads.
		pctx := c.CloseRead(ctx)
		if err := c.Ping(pctx); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitForf(t, 30*time.Second, func() bool {
		runtime.GC()
		mu.Lock()
		defer mu.Unlock()
		for _, m := range marks {
			if m.Value() != nil {
				return false
			}
		}
		return len(marks) == conns
	}, "the ResponseWriters of %d upgraded connections to be let go", conns)
}

// TestWebSocketPingAfterQuiet: a ping that comes when the server has
// written nothing for longer than the slow-consumer timeout is answered.
// The engine leaves its last write's deadline on the socket; the pong,
// written by the WebSocket library, must not inherit it once passed.
func TestWebSocketPingAfterQuiet(t *testing.T) {
	const slow = 100 * time.Millisecond
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	b := broker.New(broker.Config{Log: log})
	defer b.Close()
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", Log: log, Heartbeat: time.Minute, SlowTimeout: slow}, b)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())
	pages := httptest.NewServer(srv.WebSocketHandler(nil))
	defer pages.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(pages.URL, "http")+"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	(&wsRaw{t: t, ws: c}).welcome()
	// The WELCOME's write deadline (its time plus slow) passes: the
	// precondition, not a wait for an outcome.
	time.Sleep(3 * slow)
	pctx := c.CloseRead(ctx)
	if err := c.Ping(pctx); err != nil {
		t.Fatalf("a ping after the server was quiet for %s: %v", 3*slow, err)
	}
}

// stackBytes returns the bytes of goroutine stacks in use and the stack
// new goroutines start with, after two GCs (which shrink the stacks of
// goroutines that use less than a quarter of theirs).
func stackBytes() (inUse, starting uint64) {
	runtime.GC()
	runtime.GC()
	s := []metrics.Sample{{Name: "/memory/classes/heap/stacks:bytes"}, {Name: "/gc/stack/starting-size:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64()
}

// TestIdleConnStacks: the goroutine an idle connection holds, over TCP
// or over WebSocket, has a small stack. A read loop waiting in its read
// keeps the 8 KiB its deepest read grew; a waiter stays within the 2
// KiB a goroutine starts with (4 KiB with -race). The bound, half as
// much again, leaves room for the runtime's own stack caches.
func TestIdleConnStacks(t *testing.T) {
	const conns = 150 // of each kind
	n := startWSNode(t, func(c *node.Config) { c.Heartbeat = time.Minute })
	before, _ := stackBytes()
	for range conns {
		c := dialRaw(t, n)
		c.hello()
		w := mustDialWS(t, n)
		w.welcome()
		// A frame each way, as a subscribing client sends, so that
		// each read loop has read past its handshake.
		c.send(&wire.Frame{Type: wire.TypePing, Ref: 1})
		c.next()
		w.send(&wire.Frame{Type: wire.TypePing, Ref: 1})
		w.next()
	}
	deadline := time.Now().Add(60 * time.Second)
	for count(goroutines(), "server.(*conn).await") < 2*conns {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d idle connections wait in a waiter", count(goroutines(), "server.(*conn).await"), 2*conns)
		}
		time.Sleep(10 * time.Millisecond)
	}
	after, starting := stackBytes()
	per := float64(after-before) / (2 * conns)
	t.Logf("goroutine stacks: %.0f bytes a connection (%d in use before, %d after); goroutines start with %d bytes",
		per, before, after, starting)
	limit := 3072.0
	if raceEnabled {
		limit = 6144
	}
	if per > limit {
		t.Errorf("an idle connection holds %.0f bytes of goroutine stack, want at most %.0f", per, limit)
	}
}

// readWSMessage reads one unmasked message from the server and decodes
// its frame.
func readWSMessage(t *testing.T, br *bufio.Reader) *wire.Frame {
	t.Helper()
	var head [2]byte
	if _, err := io.ReadFull(br, head[:]); err != nil {
		t.Fatal(err)
	}
	size := int(head[1] & 0x7f)
	if size == 126 {
		var ext [2]byte
		if _, err := io.ReadFull(br, ext[:]); err != nil {
			t.Fatal(err)
		}
		size = int(binary.BigEndian.Uint16(ext[:]))
	}
	p := make([]byte, size)
	if _, err := io.ReadFull(br, p); err != nil {
		t.Fatal(err)
	}
	var f wire.Frame
	if len(p) < 4 {
		t.Fatalf("a message of %d bytes", len(p))
	}
	if err := wire.Decode(p[4:], &f); err != nil {
		t.Fatal(err)
	}
	return &f
}

// TestWebSocketMessagesInOnePacket: an idle WebSocket connection that
// is sent two messages in one packet answers both. The WebSocket
// library's buffered reader takes in both with one read of the socket;
// a read loop that went back to waiting on the socket after the first
// (wsnet.Conn.Pending ignored) would leave the second there unanswered.
func TestWebSocketMessagesInOnePacket(t *testing.T) {
	n := startWSNode(t, func(c *node.Config) { c.Heartbeat = time.Minute })
	nc, err := net.Dial("tcp", n.HTTPAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	body, _ := json.Marshal(wire.Hello{Versions: []int{wire.Version}, Name: "two-in-one"})
	hello, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeHello, Body: body}, 0)
	req := "GET /ws HTTP/1.1\r\nHost: " + n.HTTPAddr().String() + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := nc.Write(append([]byte(req), maskedBinary(hello)...)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade answered %s", resp.Status)
	}
	if f := readWSMessage(t, br); f.Type != wire.TypeWelcome {
		t.Fatalf("want WELCOME, got %s", f.Type)
	}
	// The connection is idle: its waiter waits on the socket.
	deadline := time.Now().Add(30 * time.Second)
	for count(goroutines(), "server.(*conn).await") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no waiter after the handshake")
		}
		time.Sleep(5 * time.Millisecond)
	}
	var two []byte
	for i := range 2 {
		p, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypePing, Ref: uint64(i + 1)}, 0)
		two = append(two, maskedBinary(p)...)
	}
	if _, err := nc.Write(two); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if f := readWSMessage(t, br); f.Type != wire.TypePong || f.Ref != uint64(i+1) {
			t.Fatalf("want PONG %d, got %s %d", i+1, f.Type, f.Ref)
		}
	}
}
