package client_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/behaviour"
	"github.com/courier-mq/courier/node"
)

// TestBehaviour runs the behaviour suite against a server over loopback
// TCP, each connection a client.Dial, with the same code that tests the
// embedded node.
func TestBehaviour(t *testing.T) {
	n, err := node.Start(node.Config{
		DataDir: t.TempDir(),
		Listen:  "127.0.0.1:0",
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	behaviour.Run(t, func(t *testing.T) *courier.Conn {
		c, err := client.Dial(context.Background(), n.URL(), client.Options{Name: t.Name()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	})
}
