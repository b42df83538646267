package client_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/behaviour"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
)

// wsNode starts a node with a client listener and a management
// listener, whose /ws serves the protocol over WebSocket.
func wsNode(t *testing.T) *node.Node {
	t.Helper()
	n, err := node.Start(node.Config{
		DataDir: t.TempDir(),
		Listen:  "127.0.0.1:0",
		HTTP:    "127.0.0.1:0",
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// wsURL returns the node's WebSocket URL.
func wsURL(n *node.Node) string { return "ws://" + n.HTTPAddr().String() + "/ws" }

// TestBehaviourWebSocket runs the behaviour suite with every connection
// a client.Dial of a ws:// URL: the same server engine behind the
// WebSocket access layer.
func TestBehaviourWebSocket(t *testing.T) {
	n := wsNode(t)
	behaviour.Run(t, func(t *testing.T) *courier.Conn {
		c, err := client.Dial(context.Background(), wsURL(n), client.Options{Name: t.Name()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	})
}

// TestParseWebSocketURL checks the ws:// and wss:// forms.
func TestParseWebSocketURL(t *testing.T) {
	for _, tc := range []struct{ in, addr, path string }{
		{"ws://127.0.0.1:7480/ws", "127.0.0.1:7480", "/ws"},
		{"ws://localhost", "localhost:7480", "/ws"},
		{"wss://u:p@broker.example/courier", "broker.example:7480", "/courier"},
	} {
		list, err := client.ParseURLs(tc.in)
		if err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		if list.Addrs[0] != tc.addr || list.WSPath != tc.path {
			t.Errorf("%s: addr %s path %s, want %s %s", tc.in, list.Addrs[0], list.WSPath, tc.addr, tc.path)
		}
	}
	if _, err := client.ParseURLs("ws://a:1/ws,courier://b:2"); err == nil || !strings.Contains(err.Error(), "mix WebSocket") {
		t.Errorf("a mixed list: %v", err)
	}
	if _, err := client.ParseURLs("ws://a:1/ws?x=1"); err == nil {
		t.Errorf("a query: no error")
	}
}

// TestWSS: wss:// on a management listener with TLS, the Go client
// checking the server's certificate, and the connection shown as
// websocket.
func TestWSS(t *testing.T) {
	ca := testutil.NewCA(t)
	srv := ca.Server()
	n, err := node.Start(node.Config{
		DataDir: t.TempDir(), Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0",
		HTTPTLS: node.TLSFiles{CertFile: srv.CertFile, KeyFile: srv.KeyFile},
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	url := "wss://" + n.HTTPAddr().String() + "/ws"
	ctx := context.Background()
	if _, err := client.Dial(ctx, url, client.Options{NoReconnect: true}); err == nil {
		t.Fatal("a server certificate from an unknown CA was accepted")
	}
	c, err := client.Dial(ctx, url, client.Options{TLS: &tls.Config{RootCAs: ca.Pool}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ps, err := c.PubSub(ctx, "tls.news")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	if _, err := ps.Subscribe(ctx, "#", func(d *courier.Delivery) { got <- string(d.Body) }); err != nil {
		t.Fatal(err)
	}
	if err := ps.PublishSync(ctx, courier.Message{Key: "k", Body: []byte("over wss")}); err != nil {
		t.Fatal(err)
	}
	if b := testutil.Recv(t, got, 20*time.Second); b != "over wss" {
		t.Fatalf("got %q", b)
	}
}
