package client_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

// remotePingPong starts a node serving loopback TCP with one handler
// answering pong on its own connection, and returns the exchange as seen
// from a second connection.
func remotePingPong(b *testing.B) *courier.ReqResp {
	n, err := node.Start(node.Config{DataDir: b.TempDir(), Listen: "127.0.0.1:0", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.Close() })
	ctx := context.Background()
	h, err := client.Dial(ctx, n.URL(), client.Options{})
	if err != nil {
		b.Fatal(err)
	}
	hx, err := h.ReqResp(ctx, "ping", courier.RoundRobin)
	if err != nil {
		b.Fatal(err)
	}
	pong := []byte("pong")
	if _, err := hx.Handle(ctx, func(r *courier.Request) { r.Reply(pong) }); err != nil {
		b.Fatal(err)
	}
	c, err := client.Dial(ctx, n.URL(), client.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ex, err := c.ReqResp(ctx, "ping")
	if err != nil {
		b.Fatal(err)
	}
	return ex
}

// BenchmarkRemoteSeq measures sequential cycles over loopback TCP.
func BenchmarkRemoteSeq(b *testing.B) {
	ex := remotePingPong(b)
	ctx := context.Background()
	msg := courier.Message{Body: []byte("ping")}
	b.ReportAllocs()
	for b.Loop() {
		r, err := ex.Request(ctx, msg)
		if err != nil || string(r.Body) != "pong" {
			b.Fatal(r, err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}

// TestBadStringStaysLocal: a frame the server would reject (a key that is
// not UTF-8) fails at the caller and the connection stays usable, as it
// does embedded.
func TestBadStringStaysLocal(t *testing.T) {
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := context.Background()
	for _, c := range []struct {
		name string
		dial func() (*courier.Conn, error)
	}{
		{"embedded", func() (*courier.Conn, error) { return n.Connect(), nil }},
		{"remote", func() (*courier.Conn, error) { return client.Dial(ctx, n.URL(), client.Options{}) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := c.dial()
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ps, err := conn.PubSub(ctx, "utf8")
			if err != nil {
				t.Fatal(err)
			}
			if err := ps.Publish(ctx, "bad\xff", nil); !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("publish with a non-UTF-8 key: %v, want ErrMalformed", err)
			}
			if err := ps.PublishSync(ctx, courier.Message{Key: "good"}); err != nil {
				t.Fatalf("connection hurt: %v", err)
			}
		})
	}
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct{ in, addr, err string }{
		{"courier://127.0.0.1:7400", "127.0.0.1:7400", ""},
		{"courier://localhost", "localhost:7400", ""},
		{"courier://user:pw@127.0.0.1:1234", "127.0.0.1:1234", ""},
		{"127.0.0.1:7400", "", "want courier://host:port"},
		{"http://127.0.0.1:7400", "", `scheme "http"`},
		{"courier://", "", "no host"},
		{"courier://h:1/path", "", "unexpected path"},
	} {
		addr, _, err := client.ParseURL(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseURL(%q) error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || addr != tc.addr {
			t.Errorf("ParseURL(%q) = %q, %v; want %q", tc.in, addr, err, tc.addr)
		}
	}
}

// BenchmarkRemoteParallel100 measures cycles over loopback TCP with 100
// requester goroutines on one connection and one handler on another.
func BenchmarkRemoteParallel100(b *testing.B) {
	ex := remotePingPong(b)
	ctx := context.Background()
	msg := courier.Message{Body: []byte("ping")}
	b.ReportAllocs()
	b.SetParallelism(50)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := ex.Request(ctx, msg); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}
