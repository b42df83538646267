package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/server"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

// TestWelcomeConnectURLs: WELCOME names what Config.ConnectURLs returns,
// at most MaxConnectURLs of them, none empty or over MaxConnectURLLen.
func TestWelcomeConnectURLs(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	b := broker.New(broker.Config{Log: log})
	defer b.Close()
	urls := []string{"", strings.Repeat("h", server.MaxConnectURLLen) + ":1"}
	for i := range 100 {
		urls = append(urls, fmt.Sprintf("10.0.0.%d:7400", i))
	}
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", Log: log, ConnectURLs: func() []string { return urls }}, b)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := &raw{t: t, nc: nc, r: wire.NewReader(nc, 1<<20)}
	w := c.hello()
	if len(w.ConnectURLs) != server.MaxConnectURLs {
		t.Fatalf("%d connect_urls, want %d", len(w.ConnectURLs), server.MaxConnectURLs)
	}
	for _, u := range w.ConnectURLs {
		if u == "" || len(u) > server.MaxConnectURLLen {
			t.Errorf("connect_urls has %q", u)
		}
	}
}

// TestNodeNamesItself: a node's WELCOME names its own client address.
func TestNodeNamesItself(t *testing.T) {
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if w := dialRaw(t, n).hello(); !slices.Equal(w.ConnectURLs, []string{n.Addr().String()}) {
		t.Errorf("connect_urls %v, want [%s]", w.ConnectURLs, n.Addr())
	}
}
