package client_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/node"
)

// TestReplyFromGoroutineAsHandlerReturns: a handler that hands its request
// to another goroutine and returns at once races that goroutine's Reply
// with the end of the attachment's write batch. The reply must go out
// either way; it used to join the batch after its last flush and wait in
// the outbox until some later frame pushed it out, so a requester that
// waits for it before sending more waited forever.
func TestReplyFromGoroutineAsHandlerReturns(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := context.Background()
	for _, c := range []struct {
		name    string
		handler func() (*courier.Conn, error)
	}{
		{"remote handler", func() (*courier.Conn, error) { return client.Dial(ctx, n.URL(), client.Options{Log: log}) }},
		{"embedded handler", func() (*courier.Conn, error) { return n.Connect(), nil }},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, err := c.handler()
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			name := "later." + map[bool]string{true: "r", false: "e"}[c.name == "remote handler"]
			hx, err := h.ReqResp(ctx, name, courier.RoundRobin)
			if err != nil {
				t.Fatal(err)
			}
			pong := []byte("pong")
			if _, err := hx.Handle(ctx, func(r *courier.Request) {
				started := make(chan struct{})
				go func() {
					close(started)
					r.Reply(pong)
				}()
				<-started
			}); err != nil {
				t.Fatal(err)
			}
			rc, err := client.Dial(ctx, n.URL(), client.Options{Log: log})
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			ex, err := rc.ReqResp(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 3000 {
				rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := ex.Request(rctx, courier.Message{Body: []byte("ping")})
				cancel()
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
			}
		})
	}
}
