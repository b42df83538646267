package client

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

func TestParseURLs(t *testing.T) {
	for _, c := range []struct {
		raw   string
		addrs []string
		tls   bool
		user  string
		err   string
	}{
		{raw: "courier://127.0.0.1:7400", addrs: []string{"127.0.0.1:7400"}},
		{raw: "courier://a:1,b:2,c", addrs: []string{"a:1", "b:2", "c:7400"}},
		{raw: "courier://u:p,w@a:1,b:2", addrs: []string{"a:1", "b:2"}, user: "u"},
		{raw: "courier+tls://a:1,[::1]:2", addrs: []string{"a:1", "[::1]:2"}, tls: true},
		{raw: "courier://a:1, courier://b:2", addrs: []string{"a:1", "b:2"}},
		{raw: "courier://a:1,a:1", addrs: []string{"a:1"}},
		{raw: "courier://u:p@a:1,courier://b:2", addrs: []string{"a:1", "b:2"}, user: "u"},
		{raw: "courier://a:1,courier+tls://b:2", err: "mix TLS"},
		{raw: "courier://a:1,courier://v:q@b:2", err: "give the user once"},
		{raw: "courier://a:1,", err: "no host"},
		{raw: "http://a:1,b:2", err: "scheme"},
		{raw: "a:1,b:2", err: "want courier://"},
	} {
		l, err := ParseURLs(c.raw)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: %v; want an error with %q", c.raw, err, c.err)
			}
			if err != nil && strings.Contains(err.Error(), ":p@") {
				t.Errorf("%q: the error shows the password: %v", c.raw, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.raw, err)
			continue
		}
		user := ""
		if l.User != nil {
			user = l.User.Username()
		}
		if !slices.Equal(l.Addrs, c.addrs) || l.TLS != c.tls || user != c.user {
			t.Errorf("%q: %v tls %v user %q; want %v %v %q", c.raw, l.Addrs, l.TLS, user, c.addrs, c.tls, c.user)
		}
	}
}

// hostileWelcome serves one handshake whose WELCOME carries body's
// connect_urls, and returns the address.
func hostileWelcome(t *testing.T, urls []string) string {
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
		r := wire.NewReader(nc, wire.HandshakeMaxFrame)
		var f wire.Frame
		if err := r.Next(&f); err != nil {
			return
		}
		body, _ := json.Marshal(wire.Welcome{Version: wire.Version, Conn: "c1", HeartbeatMS: 1000, TimeoutMS: 3000, MaxFrame: 1 << 20, Credit: 10, ConnectURLs: urls})
		p, err := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeWelcome, Body: body}, wire.HandshakeMaxFrame)
		if err != nil {
			t.Error(err)
			return
		}
		nc.Write(p)
		time.Sleep(time.Second) // the client reads before the socket closes
	}()
	return ln.Addr().String()
}

// TestHostileConnectURLs: what a server names in connect_urls is bounded
// in count and length, and only well-formed host:port are taken.
func TestHostileConnectURLs(t *testing.T) {
	var urls []string
	for i := range 3000 {
		urls = append(urls, fmt.Sprintf("10.0.%d.%d:7400", i/250, i%250))
	}
	bad := []string{"", strings.Repeat("a", 300) + ":1", "a:0", "a:65536", "a:07400", "a", ":1", "u:p@a:1", "a/b:1", "a b:1", "courier://a:1", "a:1\n"}
	urls = append(bad, urls...)
	addr := hostileWelcome(t, urls)
	tr := newTransport(URLs{Addrs: []string{addr}, scheme: Scheme}, Options{})
	tr.opts.setDefaults()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := tr.dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	l.nc.Close()
	if len(tr.discovered) != maxDiscovered {
		t.Fatalf("kept %d connect_urls, want the bound %d", len(tr.discovered), maxDiscovered)
	}
	for _, a := range tr.discovered {
		if !strings.HasPrefix(a, "10.0.") {
			t.Errorf("kept %q", a)
		}
	}
}

// TestWelcomeNamesServer: a node names its own client address in
// connect_urls, and the client learns it.
func TestWelcomeNamesServer(t *testing.T) {
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	tr := newTransport(URLs{Addrs: []string{n.Addr().String()}, scheme: Scheme}, Options{})
	tr.opts.setDefaults()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := tr.dial(ctx, n.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.nc.Close()
	if want := []string{n.Addr().String()}; !slices.Equal(l.welcome.ConnectURLs, want) || !slices.Equal(tr.discovered, want) {
		t.Errorf("connect_urls %v, learned %v; want %v", l.welcome.ConnectURLs, tr.discovered, want)
	}
}

// FuzzCheckAddr: any string a server names is either refused or a
// bounded, well-formed host:port.
func FuzzCheckAddr(f *testing.F) {
	for _, s := range []string{"127.0.0.1:7400", "[::1]:7400", "host:1", "a:65535", "a:0", "::1:7400", "[fe80::1%eth0]:1", "a:+1", "a:-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, ok := checkAddr(s)
		if !ok {
			return
		}
		if len(a) > maxDiscoveredLn+2 {
			t.Fatalf("%q kept as %q: too long", s, a)
		}
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" || port == "" || strings.ContainsAny(a, "/@ \n\t") {
			t.Fatalf("%q kept as %q", s, a)
		}
	})
}
