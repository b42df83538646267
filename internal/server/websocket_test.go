package server_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

// startWSNode starts a node with the client and management listeners;
// change adjusts its configuration first.
func startWSNode(t *testing.T, change func(*node.Config)) *node.Node {
	t.Helper()
	cfg := node.Config{
		DataDir: t.TempDir(), Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if change != nil {
		change(&cfg)
	}
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// wsRaw is a hand-driven protocol client over WebSocket.
type wsRaw struct {
	t  *testing.T
	ws *websocket.Conn
}

func dialWS(t *testing.T, n *node.Node, origin string) (*wsRaw, *http.Response, error) {
	t.Helper()
	h := http.Header{}
	if origin != "" {
		h.Set("Origin", origin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, "ws://"+n.HTTPAddr().String()+"/ws", &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		return nil, resp, err
	}
	ws.SetReadLimit(-1)
	t.Cleanup(func() { ws.CloseNow() })
	return &wsRaw{t: t, ws: ws}, resp, nil
}

func mustDialWS(t *testing.T, n *node.Node) *wsRaw {
	t.Helper()
	c, _, err := dialWS(t, n, "")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *wsRaw) message(typ websocket.MessageType, p []byte) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.ws.Write(ctx, typ, p); err != nil {
		c.t.Fatal(err)
	}
}

func (c *wsRaw) send(f *wire.Frame) {
	c.t.Helper()
	p, err := wire.AppendFrame(nil, f, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	c.message(websocket.MessageBinary, p)
}

// next reads messages, skipping PINGs, until a frame arrives or the
// WebSocket ends (nil). Every message must be binary and hold exactly
// one frame.
func (c *wsRaw) next() *wire.Frame {
	c.t.Helper()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		typ, p, err := c.ws.Read(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			c.t.Fatal("no message within 20s")
		}
		if err != nil {
			return nil
		}
		if typ != websocket.MessageBinary {
			c.t.Fatalf("a %v message from the server", typ)
		}
		if len(p) < 4 || int(binary.BigEndian.Uint32(p)) != len(p)-4 {
			c.t.Fatalf("a message of %d bytes is not one frame: % x", len(p), p[:min(len(p), 16)])
		}
		var f wire.Frame
		if err := wire.Decode(p[4:], &f); err != nil {
			c.t.Fatal(err)
		}
		if f.Type != wire.TypePing {
			return &f
		}
	}
}

func (c *wsRaw) hello(h wire.Hello) *wire.Frame {
	c.t.Helper()
	h.Versions = []int{wire.Version}
	body, _ := json.Marshal(h)
	c.send(&wire.Frame{Type: wire.TypeHello, Body: body})
	return c.next()
}

func (c *wsRaw) welcome() wire.Welcome {
	c.t.Helper()
	f := c.hello(wire.Hello{Name: "ws-raw"})
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
func (c *wsRaw) expectFatal(code wire.Code, msg string) {
	c.t.Helper()
	f := c.next()
	if f == nil || f.Type != wire.TypeError || f.Flags&wire.FlagFatal == 0 || wire.Code(f.Aux) != code {
		c.t.Fatalf("want fatal ERROR %s, got %+v", code, f)
	}
	if !strings.Contains(f.Tag, msg) {
		c.t.Fatalf("fatal error %q does not say %q", f.Tag, msg)
	}
	if g := c.next(); g != nil {
		c.t.Fatalf("connection not closed after fatal error: %+v", g)
	}
}

// TestWebSocketHandshake: the handshake, PING and an operation over
// WebSocket, each of the server's frames in a message of its own, and
// the connection shown as websocket by the management API.
func TestWebSocketHandshake(t *testing.T) {
	n := startWSNode(t, nil)
	c := mustDialWS(t, n)
	w := c.welcome()
	if w.Credit == 0 || w.MaxFrame != wire.DefaultMaxFrame || !strings.HasPrefix(w.Conn, n.Name()+"/") {
		t.Fatalf("welcome %+v", w)
	}
	c.send(&wire.Frame{Type: wire.TypePing, Ref: 42})
	if f := c.next(); f == nil || f.Type != wire.TypePong || f.Ref != 42 {
		t.Fatalf("want PONG 42, got %+v", f)
	}
	// Pipelined operations: many answers at once, one per message.
	cfg, _ := json.Marshal(wire.ExchangeConfig{Pattern: "pubsub"})
	for i := range 20 {
		c.send(&wire.Frame{Type: wire.TypeDeclare, Ref: uint64(i + 1), Name: "news", Body: cfg})
	}
	for i := range 20 {
		if f := c.next(); f == nil || f.Type != wire.TypeOK || f.Ref != uint64(i+1) {
			t.Fatalf("answer %d: %+v", i+1, f)
		}
	}
	resp, err := http.Get(n.HTTPURL() + "/api/connections?columns=id,transport")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rows []struct{ ID, Transport string }
	if err := json.NewDecoder(resp.Body).Decode(&rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ID != w.Conn || rows[0].Transport != "websocket" {
		t.Fatalf("connections %+v, want %s over websocket", rows, w.Conn)
	}
}

// TestWebSocketHostileMessages: what is not one whole frame in one
// binary message ends the connection with the protocol error, and a
// frame over the limit with code 3, from its length prefix alone.
func TestWebSocketHostileMessages(t *testing.T) {
	n := startWSNode(t, nil)
	ping, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypePing, Ref: 1}, 0)
	hello, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeHello, Body: []byte(`{"versions":[1]}`)}, 0)
	big := binary.BigEndian.AppendUint32(nil, 70000)
	for _, tc := range []struct {
		name      string
		handshake bool // log in first
		typ       websocket.MessageType
		msg       []byte
		code      wire.Code
		says      string
	}{
		{"text", false, websocket.MessageText, hello, wire.CodeProtocol, "text"},
		{"text after the handshake", true, websocket.MessageText, ping, wire.CodeProtocol, "text"},
		{"two frames", true, websocket.MessageBinary, append(append([]byte{}, ping...), ping...), wire.CodeProtocol, "more than one frame"},
		{"trailing byte", true, websocket.MessageBinary, append(append([]byte{}, ping...), 0), wire.CodeProtocol, "more than one frame"},
		{"partial frame", true, websocket.MessageBinary, ping[:len(ping)-1], wire.CodeProtocol, "ends inside its frame"},
		{"partial prefix", false, websocket.MessageBinary, ping[:2], wire.CodeProtocol, "shorter than a frame"},
		{"empty", false, websocket.MessageBinary, nil, wire.CodeProtocol, "shorter than a frame"},
		{"oversize before the handshake", false, websocket.MessageBinary, big, wire.CodeFrameTooLarge, "70000"},
		{"malformed", true, websocket.MessageBinary, []byte{0, 0, 0, 3, 0xff, 0, 0}, wire.CodeProtocol, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mustDialWS(t, n)
			if tc.handshake {
				c.welcome()
			}
			c.message(tc.typ, tc.msg)
			c.expectFatal(tc.code, tc.says)
		})
	}
	t.Run("oversize after the handshake", func(t *testing.T) {
		c := mustDialWS(t, n)
		w := c.welcome()
		p := binary.BigEndian.AppendUint32(nil, uint32(w.MaxFrame+1))
		c.message(websocket.MessageBinary, append(p, make([]byte, 100)...))
		c.expectFatal(wire.CodeFrameTooLarge, "limit")
	})
}

// TestWebSocketOrigin: a browser page of another origin is refused
// before the upgrade unless the allow-list names it; the listener's own
// origin and requests without Origin are let in.
func TestWebSocketOrigin(t *testing.T) {
	n := startWSNode(t, func(c *node.Config) { c.WSOrigins = []string{"chat.example.com", "https://*.good.example"} })
	for _, tc := range []struct {
		origin string
		ok     bool
	}{
		{"", true},
		{"http://" + n.HTTPAddr().String(), true},
		{"https://chat.example.com", true},
		{"http://chat.example.com", true},
		{"https://app.good.example", true},
		{"http://app.good.example", false},
		{"https://evil.example", false},
		{"null", false},
	} {
		c, resp, err := dialWS(t, n, tc.origin)
		if tc.ok {
			if err != nil {
				t.Errorf("origin %q refused: %v", tc.origin, err)
				continue
			}
			c.welcome()
			continue
		}
		if err == nil {
			t.Errorf("origin %q let in", tc.origin)
			continue
		}
		if resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Errorf("origin %q: %v, want 403", tc.origin, err)
		}
	}
	// A bad pattern is refused at start, not at each request.
	if _, err := node.Start(node.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0", WSOrigins: []string{"[bad"}}); err == nil || !strings.Contains(err.Error(), "ws_origins") {
		t.Errorf("a bad origin pattern: %v", err)
	}
	// The default: same origin only.
	d := startWSNode(t, nil)
	if _, resp, err := dialWS(t, d, "https://chat.example.com"); err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("another origin on a node without an allow-list: %v", err)
	}
}

// TestWebSocketEngine: the TCP listener's rules hold over WebSocket: the
// HELLO timeout, authentication, heartbeats and credit.
func TestWebSocketEngine(t *testing.T) {
	t.Run("no HELLO", func(t *testing.T) {
		n := startWSNode(t, func(c *node.Config) { c.Limits.HandshakeTimeout = 300 * time.Millisecond })
		c := mustDialWS(t, n)
		c.expectFatal(wire.CodeProtocol, "no HELLO within 300ms")
	})
	t.Run("credentials", func(t *testing.T) {
		n := startWSNode(t, func(c *node.Config) { c.AdminUser, c.AdminPassword = "admin", "s3cret-pass" })
		c := mustDialWS(t, n)
		c.send(&wire.Frame{Type: wire.TypeHello, Body: []byte(`{"versions":[1],"user":"admin","password":"wrong"}`)})
		c.expectFatal(wire.CodeUnauthorized, "bad user name or password")
		c = mustDialWS(t, n)
		if f := c.hello(wire.Hello{User: "admin", Password: "s3cret-pass"}); f == nil || f.Type != wire.TypeWelcome {
			t.Fatalf("want WELCOME, got %+v", f)
		}
	})
	t.Run("heartbeat", func(t *testing.T) {
		n := startWSNode(t, nil)
		c := mustDialWS(t, n)
		if f := c.hello(wire.Hello{HeartbeatMS: 50}); f == nil || f.Type != wire.TypeWelcome {
			t.Fatalf("want WELCOME, got %+v", f)
		}
		// Silent from now on: PINGs come, then the cut.
		c.expectFatal(wire.CodeHeartbeat, "nothing received")
	})
	t.Run("credit", func(t *testing.T) {
		n := startWSNode(t, func(c *node.Config) { c.Limits.Credit = 4 })
		c := mustDialWS(t, n)
		if w := c.welcome(); w.Credit != 4 {
			t.Fatalf("credit %d", w.Credit)
		}
		// Half the window used: CREDIT comes, in a message of its own.
		for range 2 {
			c.send(&wire.Frame{Type: wire.TypePublish, Name: "nowhere", Key: "k"})
		}
		for {
			f := c.next()
			if f == nil {
				t.Fatal("closed without CREDIT")
			}
			if f.Type == wire.TypeCredit {
				if f.Aux != 2 {
					t.Fatalf("CREDIT %d, want 2", f.Aux)
				}
				return
			}
		}
	})
}

// TestWebSocketLeavesHTTPSlots: an upgraded connection no longer counts
// against the management listener's connection limit, so WebSocket
// clients cannot lock operators out of the API (they count against the
// client listener's limits instead).
func TestWebSocketLeavesHTTPSlots(t *testing.T) {
	n := startWSNode(t, func(c *node.Config) {
		c.Limits.MaxHTTPConns = 1
		c.Heartbeat = time.Hour // the silent raw clients stay connected
	})
	for range 3 {
		mustDialWS(t, n).welcome()
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
	resp, err := hc.Get(n.HTTPURL() + "/api/overview")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("overview: %s", resp.Status)
	}
}
